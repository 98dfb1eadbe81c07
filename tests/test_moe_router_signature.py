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
        assert work["rows"] == [cap] * E and work["calls"] == [1] * E and work["uncounted"] == {}
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


def test_a_call_of_forward_is_counted_as_a_call():
    T, E, d, h = 64, 4, 8, 16
    x, gate, experts = layer_inputs(T, E, d, h)
    ref = reference()

    def by_forward(x, gate_weight, experts, k, cf):
        return ref.moe_layer(x, gate_weight, [type("Bare", (), {"__call__": lambda self, b, m=m: m.forward(b)})()
                                              for m in experts], k, cf)

    work = support.expert_work(by_forward, x, gate, experts, 1, 1.0)
    cap = ref.expert_capacity(T, E, 1, 1.0)
    assert work["rows"] == [cap] * E and work["calls"] == [1] * E
    assert work["flops"] == 2 * T * d * E + E * cap * 4 * d * h
    assert all("forward" not in vars(m) for m in experts)  # the driver put every forward back


def test_the_rows_are_what_the_forward_body_computes_after_the_students_pre_hook():
    """A pre-hook of the student's that hands the expert every token is seen: the count sits innermost."""
    T, E, d, h = 64, 4, 8, 16
    x, gate, experts = layer_inputs(T, E, d, h)
    ref = reference()

    def widened(x, gate_weight, experts, k, cf):
        handles = [m.register_forward_pre_hook(lambda module, args: (x,)) for m in experts]
        try:
            return ref.moe_layer(x, gate_weight, experts, k, cf)
        finally:
            for handle in handles:
                handle.remove()

    assert support.expert_work(widened, x, gate, experts, 1, 1.0)["rows"] == [T] * E


def dense_inputs(T=64, d=8, h=16):
    torch.manual_seed(2)
    return torch.randn(T, d), torch.randn(h, d), torch.randn(h)


# Every path from a public torch entry point to a matmul's arithmetic that the counter was checked on: the FLOPs
# of x [T, d] times W.T [d, h] (2 T d h) or more, and nothing left uncounted.
CONTRACTIONS = {
    "linear": lambda x, W, b: torch.nn.functional.linear(x, W, b),
    "einsum": lambda x, W, b: torch.einsum("td,hd->th", x, W),
    "baddbmm": lambda x, W, b: torch.baddbmm(b[None, None], x[None], W.t()[None]),
    "addbmm": lambda x, W, b: torch.addbmm(b, x[None], W.t()[None]),
    "bilinear": lambda x, W, b: torch.nn.functional.bilinear(x, x.new_ones(x.shape[0], 1), W[:, :, None], b),
    "mv": lambda x, W, b: torch.stack([W.mv(row) for row in x]),
    "addmv": lambda x, W, b: torch.stack([torch.addmv(b, W, row) for row in x]),
    "dot": lambda x, W, b: torch.stack([torch.stack([torch.dot(row, w) for w in W]) for row in x]),
    "vdot": lambda x, W, b: torch.stack([torch.stack([torch.vdot(row, w) for w in W]) for row in x]),
    "addmm_activation": lambda x, W, b: torch._addmm_activation(b, x, W.t(), use_gelu=True),
    "vmap": lambda x, W, b: torch.func.vmap(lambda row: W @ row)(x),
    "tensordot": lambda x, W, b: torch.tensordot(x, W, dims=([1], [1])),
    "cdist": lambda x, W, b: torch.cdist(x, W),
    "cdist_p1": lambda x, W, b: torch.cdist(x, W, p=1.0),
    "embedding_bag": lambda x, W, b: torch.nn.functional.embedding_bag(
        torch.arange(x.shape[1]).repeat(x.shape[0]), W.t().contiguous(), torch.arange(x.shape[0]) * x.shape[1],
        mode="sum", per_sample_weights=x.reshape(-1)),
    "conv1d": lambda x, W, b: torch.nn.functional.conv1d(x.t()[None], W[:, :, None]),
}


def test_every_contraction_is_counted_never_zero():
    x, W, b = dense_inputs()
    T, d = x.shape
    h = W.shape[0]
    for name, fn in CONTRACTIONS.items():
        counter = support.WorkCounter()
        with counter:
            fn(x, W, b)
        assert counter.uncounted == {}, (name, counter.uncounted)
        assert counter.flops >= 2 * T * d * h, (name, counter.flops, sorted(counter.ops))


def test_an_operator_without_a_formula_is_named_not_counted_as_zero():
    x, W, b = dense_inputs()
    counter = support.WorkCounter()
    with counter:
        torch.fft.rfft(x)
        torch.linalg.matrix_exp(torch.randn(4, 4))  # a factorisation: gptq's tally counts its arithmetic
    assert counter.uncounted == {"_fft_r2c": 1}
    assert counter.flops > 0


def test_ordinary_routing_and_indexing_operators_are_not_flagged():
    """What a correct route, dispatch or combine may reasonably call: in-place forms too (masked_fill_ is tagged
    through masked_fill), integer division, isin, sorting, scans, scatters and gathers. None may fail the check."""
    T, E, k, d = 32, 4, 2, 5
    x, logits, idx = torch.randn(T, d), torch.randn(T, E), torch.randint(0, E, (T, k))
    calls = [
        lambda: idx // 2, lambda: idx % 3, lambda: torch.div(idx, 2, rounding_mode="floor"),
        lambda: torch.isin(idx, torch.tensor([1, 2])), lambda: torch.nn.functional.one_hot(idx, E).cumsum(0),
        lambda: torch.bincount(idx.flatten(), minlength=E), lambda: idx.flatten().argsort(stable=True),
        lambda: torch.searchsorted(torch.arange(10), idx), lambda: torch.unique(idx, return_counts=True),
        lambda: torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3])),
        lambda: x.new_zeros(E * 3, d).index_put_((torch.tensor([0, 1]),), x[:2], accumulate=True),
        lambda: x.new_zeros(E * 3, d).index_add_(0, torch.tensor([0, 1]), x[:2]),
        lambda: torch.zeros(E, d).scatter_add_(0, idx[:, :1].expand(T, d), x), lambda: torch.where(idx > 1),
        lambda: torch.masked_select(x, x > 0), lambda: torch.topk(logits, k),
        lambda: torch.sort(logits, dim=-1, descending=True, stable=True), lambda: logits.softmax(-1),
        lambda: torch.logsumexp(logits, -1), lambda: torch.tensor([1, 2, 3]), lambda: logits.max(-1),
        lambda: torch.take_along_dim(logits, idx, 1), lambda: logits.gather(1, idx),
        lambda: torch.full_like(logits, float("-inf")).masked_fill_(logits > 0, 0), lambda: logits.scatter(1, idx, 0.0),
        lambda: torch.zeros(3).index_copy_(0, torch.tensor([0]), torch.ones(1)), lambda: logits[0, 0].item(),
        lambda: torch.stack([logits, logits]).unbind(0), lambda: torch.cat([logits, logits]).split(4),
        lambda: torch.nn.functional.gelu(logits), lambda: logits.to(torch.bfloat16), lambda: torch.allclose(logits, logits),
        lambda: torch.einsum("te->e", logits), lambda: torch.nn.functional.pad(x, (0, 1)),
    ]
    for i, call in enumerate(calls):
        counter = support.WorkCounter()
        with counter:
            call()
        assert counter.uncounted == {}, (i, counter.uncounted)


def test_the_reference_and_the_textbook_use_only_counted_operators(tmp_path):
    x, gate, experts = layer_inputs()
    for module in (reference(), mutant(tmp_path, "textbook_dense_experts"), mutant(tmp_path, "textbook_one_hot_dispatch")):
        assert support.expert_work(module.moe_layer, x, gate, experts, 2, 1.25)["uncounted"] == {}


def test_the_expert_allowance_is_exact():
    """The hidden test's budget for the experts' own forwards (measured in the grader on copies of the modules)
    is what the driver counts for the reference's expert calls."""
    from grader.hidden.moe_router.test_hidden import expert_traffic

    T, E, d, h = 256, 8, 16, 32
    x, gate, experts = layer_inputs(T, E, d, h)
    per_call, per_row = expert_traffic(experts[0], d)
    for rows in (0, 1, 37, 64):
        counter = support.WorkCounter()
        with counter:
            experts[0](torch.randn(rows, d))
        assert counter.read + counter.written == per_call + rows * per_row


def test_the_students_own_hooks_are_counted(tmp_path):
    """Red team, issue 36: dense experts in a pre-hook of the student's kept full marks. Everything between
    entering and leaving the call is counted now: the bilinear path's FLOPs and the elementwise path's elements."""
    from grader.hidden.moe_router.test_hidden import expert_traffic, moved_budget

    T, E, d, h = 256, 8, 16, 32
    x, gate, experts = layer_inputs(T, E, d, h)
    ref = reference()
    cap = ref.expert_capacity(T, E, 1, 1.0)
    honest = support.expert_work(ref.moe_layer, x, gate, experts, 1, 1.0)
    per_call, per_row = expert_traffic(experts[0], d)
    budget = moved_budget(T, E, d, 1, cap) + 64 * T * E + E * (per_call + cap * per_row)
    assert honest["moved"] <= budget
    bilinear = support.expert_work(mutant(tmp_path, "dense_in_a_pre_hook_via_bilinear").moe_layer, x, gate, experts, 1, 1.0)
    assert bilinear["rows"] == [cap] * E  # the hook computes beside the counted rows
    assert bilinear["flops"] >= 2 * T * d * E + E * T * 4 * d * h  # every expert on every token, counted
    elementwise = support.expert_work(mutant(tmp_path, "dense_in_a_pre_hook_elementwise").moe_layer, x, gate, experts, 1, 1.0)
    assert elementwise["flops"] == 2 * T * d * E + E * cap * 4 * d * h  # no matmul beyond the honest ones
    assert elementwise["moved"] > 10 * budget  # the products it materialises: E * T * h * d and more
    for name in ("dense_in_a_pre_hook_via_bilinear", "dense_in_a_forward_hook_via_addbmm"):
        work = support.expert_work(mutant(tmp_path, name).moe_layer, x, gate, experts, 2, 1.25)
        y, _ = work["result"]
        torch.testing.assert_close(y, ref.moe_layer(x, gate, experts, 2, 1.25)[0].detach(), atol=1e-5, rtol=1e-5)
        assert work["uncounted"] == {} and work["flops"] >= E * T * 4 * d * h


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
