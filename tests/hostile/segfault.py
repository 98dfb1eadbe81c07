# Dereferences a null pointer through ctypes: the worker dies with SIGSEGV.
import ctypes


def _crash(*args, **kwargs):
    ctypes.string_at(0)


online_normalizer = merge_states = online_softmax = softmax_triton = _crash
