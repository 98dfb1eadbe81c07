"""Course-provided code for the speculative decoding exercise, run where the student's code runs.

`speculative_generate` takes two causal models as callables, and a test cannot send a function to
the sandboxed worker. So tests send probability tables (tensors) and these drivers build the models
next to the student's code:

    student.drive("grader.support.speculative:generate", sm.speculative_generate,
                  target_table, draft_table, prefix, gamma, max_new_tokens, seed, runs=1)

An n-gram table of order k has shape [V] * k + [V]: table[a, b, ..., :] is the distribution of the
next token after the context (a, b, ...). Order 0 ([V]) ignores the context altogether.

The recipes at the bottom (`Probs`, `Tokens`, `SeededGenerator`) make fresh inputs for each timed rep
of the CUDA speed check (grader/support/timing.py makes any `Randn` in the worker, and the grader
remakes the inputs of the rep it checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grader.support.timing import Randn


class NGramModel:
    """A causal model read from a table: ``model(tokens)[:, t] = table[tokens[:, t-k+1], ..., tokens[:, t]]``.

    Contexts reaching left of position 0 read token 0. Token ids outside [0, V) (padding such as -1)
    are clamped into range, so a loop may pad its buffers with anything. Counts its calls.
    """

    def __init__(self, table: torch.Tensor, name: str):
        if table.dim() < 1:
            raise ValueError(f"{name}: an n-gram table has at least one dim, found a scalar")
        self.table = table
        self.order = table.dim() - 1
        self.vocab = table.shape[-1]
        self.name = name
        self.calls = 0
        self.tokens_seen = 0
        self.max_calls: int | None = None  # set by a driver: more calls than this is a loop that does not advance

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise TypeError(
                f"the {self.name} model takes token ids as a 2-D tensor [B, L], found "
                f"{type(tokens).__name__}{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else ''}"
            )
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise TypeError(f"the {self.name} model takes integer token ids, found dtype {tokens.dtype}")
        self.calls += 1
        self.tokens_seen += tokens.numel()
        if self.max_calls is not None and self.calls > self.max_calls:
            raise RuntimeError(
                f"the {self.name} model was called more than {self.max_calls} times for this generation: every "
                "step emits at least one token per row (num_accepted + 1), so max_new_tokens target calls always "
                "suffice. Does each row's length advance by num_accepted + 1?"
            )
        B, L = tokens.shape
        ids = tokens.long().clamp(0, self.vocab - 1)
        if self.order == 0:
            return self.table.expand(B, L, self.vocab).clone()
        padded = torch.cat([ids.new_zeros(B, self.order - 1), ids], dim=1)
        context = tuple(padded[:, j : j + L] for j in range(self.order))
        return self.table[context]  # [B, L, V]


def generate(
    fn: Callable, target_table: torch.Tensor, draft_table: torch.Tensor, prefix: torch.Tensor, gamma: int,
    max_new_tokens: int, seed: int, runs: int = 1,
) -> dict[str, Any]:
    """Run the student's ``speculative_generate`` `runs` times with n-gram models; count the model calls.

    One generator, seeded with `seed`, serves every run in turn, so the runs are independent samples.
    Returns the tokens of every run (a list), the target-call count each run reported, and the calls
    the two models actually received during each run.
    """
    generator = torch.Generator(device=prefix.device).manual_seed(seed)
    target, draft = NGramModel(target_table, "target"), NGramModel(draft_table, "draft")
    tokens, reported, target_calls, draft_calls = [], [], [], []
    for _ in range(runs):
        t0, d0 = target.calls, draft.calls
        target.max_calls = t0 + max_new_tokens
        before = prefix.clone()
        out, calls = fn(target, draft, prefix, gamma, max_new_tokens, generator)
        if not torch.equal(prefix, before):
            raise AssertionError("speculative_generate changed the prefix tensor it was given")
        tokens.append(out)
        reported.append(calls)
        target_calls.append(target.calls - t0)
        draft_calls.append(draft.calls - d0)
    return {"tokens": tokens, "reported_calls": reported, "target_calls": target_calls, "draft_calls": draft_calls}


def accept_rows(
    fn: Callable, case_of_row: torch.Tensor, draft: torch.Tensor, draft_probs: torch.Tensor,
    target_probs: torch.Tensor, generator: torch.Generator,
) -> Any:
    """Call the student's ``speculative_accept`` on a batch built here from a few cases.

    Row b has the draft tokens ``draft[b]`` (sent as uint8: a small vocabulary) and the probabilities of
    case ``case_of_row[b]``: ``draft_probs[case]`` [gamma, V] and ``target_probs[case]`` [gamma + 1, V].
    The statistical tests send hundreds of thousands of rows of a handful of cases; built here, the
    probabilities cross the process boundary once per case instead of once per row. The student's
    function gets dense, contiguous int64 and float tensors of its own, as in a direct call, and its
    result comes back as it is (the grader checks and counts it).
    """
    rows = case_of_row.long()
    return fn(draft.long(), draft_probs[rows], target_probs[rows], generator)


def global_rng_untouched(fn: Callable, *args: Any) -> tuple[Any, bool]:
    """Call ``fn(*args)`` and report whether torch's global CPU generator was left as it was."""
    before = torch.get_rng_state()
    value = fn(*args)
    return value, bool(torch.equal(before, torch.get_rng_state()))


# --------------------------------------------------------------------------------------------------
# Input recipes for the timed loop (fresh per rep)


@dataclass(frozen=True)
class Probs(Randn):
    """softmax(scale * randn(shape)) over the last dim, fp32: a fresh probability tensor."""

    def make(self, device: str, generator: torch.Generator) -> torch.Tensor:
        # One kernel each for the logits and the softmax: the grader subtracts the timed loop's own
        # work, so it must not be work a student could do faster (grader/support/timing.py).
        logits = torch.empty(self.shape, device=device, dtype=torch.float32).normal_(0.0, self.scale, generator=generator)
        return torch.softmax(logits, dim=-1)


@dataclass(frozen=True)
class Tokens(Randn):
    """Token ids uniform in [0, high), int64."""

    high: int = 2

    def make(self, device: str, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.high, self.shape, generator=generator, device=device)


@dataclass(frozen=True)
class SeededGenerator(Randn):
    """A fresh torch.Generator on the device, seeded from the loop's own generator."""

    def make(self, device: str, generator: torch.Generator) -> torch.Generator:  # type: ignore[override]  # an input, not a tensor
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())
        return torch.Generator(device=device).manual_seed(seed)
