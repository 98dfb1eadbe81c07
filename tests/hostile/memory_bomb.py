# Asks for far more memory than the worker may have.
import torch


def online_normalizer(chunks):
    hog = [torch.ones(1 << 30, dtype=torch.float64) for _ in range(64)]  # 512 GiB
    return hog


merge_states = online_softmax = softmax_triton = online_normalizer
