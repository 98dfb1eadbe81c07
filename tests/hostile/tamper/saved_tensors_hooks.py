"""An executor that hides its activations from the census (red team round 18): its own innermost hooks on
autograd's saved tensors keep every real activation out of the grader's sight, while a shadow of tiny forwards,
run in the schedule's order, gives the census the schedule's peaks."""
# expect: torch.autograd.graph.saved_tensors_hooks
import torch


def _same(t):
    return t


def run_all_at_once(stages, batches):
    with torch.autograd.graph.saved_tensors_hooks(_same, _same):
        return [stages(b).sum().backward() for b in batches]
