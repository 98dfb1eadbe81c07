"""A dict subclass whose items() computes when the worker sends the result back: after the call, outside
the forbidden-call guard and the line counter."""
# expect: class Lazy(dict).items
import torch


class Lazy(dict):
    def __init__(self, x):
        super().__init__()
        self.x = x

    def items(self):
        return [("out", torch.softmax(self.x, -1))]
