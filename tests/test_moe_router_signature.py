"""moe_router's signature instruments (grader/support/moe_router.py) measure what they say, in-process.

The sparse_experts check trusts three figures counted beside the student's code: the rows each expert is
handed (forward hooks), the matmul FLOPs (torch's formulas under a dispatch mode) and the elements moved. Here
they are checked on the reference and on the textbook computations of the same numbers, with no sandbox: the
counts are deterministic, so these are exact or tight."""

from __future__ import annotations

import importlib.util

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from grader.course import find_root
from grader.support import moe_router as support
from tests.known_wrong import write_mutant
from tests.known_wrong.moe_router import MUTANTS

ROOT = find_root()


def module_from(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference():
    return module_from(ROOT / "solutions" / "moe_router" / "moe_router.py", "moe_reference")


def mutant(tmp_path, name):
    from grader.course import load_course

    exercise = load_course(ROOT).exercise("moe_router")
    folder = write_mutant(ROOT, exercise, next(m for m in MUTANTS if m.name == name), tmp_path / name)
    return module_from(folder / exercise.file, f"moe_{name}")


def layer_inputs(T=256, E=8, d=16, h=32):
    torch.manual_seed(0)
    experts = [nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)) for _ in range(E)]
    return torch.randn(T, d), torch.randn(E, d), experts


def test_the_flop_count_is_torchs():
    x, gate, experts = layer_inputs()
    ref = reference()
    mode = FlopCounterMode(display=False)
    with mode:
        ref.moe_layer(x, gate, experts, 2, 1.0)
    work = support.expert_work(ref.moe_layer, x, gate, experts, 2, 1.0)
    assert work["flops"] == mode.get_total_flops() > 0


def test_the_reference_spends_the_gate_and_the_buffers_exactly():
    T, E, d, h = 256, 8, 16, 32
    x, gate, experts = layer_inputs(T, E, d, h)
    ref = reference()
    for k, cf in ((1, 1.0), (2, 1.25)):
        cap = ref.expert_capacity(T, E, k, cf)
        work = support.expert_work(ref.moe_layer, x, gate, experts, k, cf)
        assert work["rows"] == [cap] * E and work["calls"] == [1] * E
        assert work["flops"] == 2 * T * d * E + E * cap * 4 * d * h
        y, _ = work["result"]
        assert torch.equal(y, ref.moe_layer(x, gate, experts, k, cf)[0].detach())


def test_dense_experts_are_seen_by_the_hooks_and_the_flops(tmp_path):
    T, E, d, h = 256, 8, 16, 32
    x, gate, experts = layer_inputs(T, E, d, h)
    dense = mutant(tmp_path, "textbook_dense_experts")
    work = support.expert_work(dense.moe_layer, x, gate, experts, 1, 1.0)
    assert work["rows"] == [T] * E
    assert work["flops"] == 2 * T * d * E + E * T * 4 * d * h


def test_a_call_of_forward_escapes_the_hooks_not_the_flops():
    T, E, d, h = 64, 4, 8, 16
    x, gate, experts = layer_inputs(T, E, d, h)
    ref = reference()

    def by_forward(x, gate_weight, experts, k, cf):
        return ref.moe_layer(x, gate_weight, [type("Bare", (), {"__call__": lambda self, b, m=m: m.forward(b)})()
                                              for m in experts], k, cf)

    work = support.expert_work(by_forward, x, gate, experts, 1, 1.0)
    cap = ref.expert_capacity(T, E, 1, 1.0)
    assert work["rows"] == [0] * E
    assert work["flops"] == 2 * T * d * E + E * cap * 4 * d * h


def test_a_one_hot_dispatch_moves_far_more_than_the_reference(tmp_path):
    T, E, d, k = 512, 8, 8, 2
    ref, one_hot = reference(), mutant(tmp_path, "textbook_one_hot_dispatch")
    torch.manual_seed(1)
    logits, x = torch.randn(T, E), torch.randn(T, d)
    r = ref.route(logits, k, 1.0)
    cap = ref.expert_capacity(T, E, k, 1.0)
    honest, textbook = support.traffic(ref.dispatch, x, r, cap), support.traffic(one_hot.dispatch, x, r, cap)
    assert torch.equal(honest["result"], textbook["result"])
    assert honest["flops"] == 0 and textbook["flops"] == 2 * T * E * cap * d
    assert textbook["moved"] > T * E * cap > 5 * honest["moved"]
    out = torch.randn(E, cap, d)
    honest, textbook = support.traffic(ref.combine, out, r), support.traffic(one_hot.combine, out, r)
    torch.testing.assert_close(honest["result"], textbook["result"])
    assert textbook["moved"] > T * E * cap > 5 * honest["moved"]
