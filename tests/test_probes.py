"""The forbidden-call guard and the probes around it (grader/harness/guard.py and its neighbours): every way to reach a forbidden operation is
caught, honest code is left alone, and the guard leaves nothing behind.

Each "form" below is captured the way a student module would capture it at import time (before the
guard is entered), which is what defeated the attribute patches alone.
"""

from __future__ import annotations

import ast
import contextlib
import re
import io
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader.harness import (
    counters, guard, host_reads, integrity, interpreter_bound, kernel_rule, launches, opfamilies,
)


@pytest.fixture(autouse=True)
def _fresh_aliased_memory():
    """Memory a test hands to numpy stays watched for the rest of its process (as in a worker): not the next test's."""
    host_reads._ALIASED.clear()
    host_reads._ALIASED_BYTES["kept"] = 0
    armed, host_reads._NOTING["armed"] = host_reads._NOTING["armed"], True  # as in a worker
    yield
    host_reads._NOTING["armed"] = armed
    host_reads._ALIASED.clear()
    host_reads._ALIASED_BYTES["kept"] = 0
from tests.conftest import ROOT

SOFTMAX_NAMES = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "torch.logsumexp"]
ATTENTION_NAMES = ["torch.nn.functional.scaled_dot_product_attention", "torch.softmax"]

X = torch.randn(3, 5)
Q = torch.randn(1, 2, 4, 8)

# Bound "at import", before any guard exists.
_alias = torch.softmax
_from_functional = F.softmax
_method = torch.Tensor.softmax
_aten = torch.ops.aten._softmax.default
_lse = torch.logsumexp
_sdpa = F.scaled_dot_product_attention
_logcumsumexp = torch.logcumsumexp
_log_softmax = F.log_softmax


def _fold(merge, x):
    """merge(merge(x[:, 0], x[:, 1]), x[:, 2])...: a row's logsumexp built from two-term merges."""
    acc = x[:, 0]
    for j in range(1, x.shape[1]):
        acc = merge(acc, x[:, j])
    return acc


@torch.jit.script
def _scripted(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


class _SoftmaxInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return _alias(grad, -1)


def _in_inference_mode():
    with torch.inference_mode():
        return _alias(X, -1)


def _in_no_grad():
    with torch.no_grad():
        return _alias(X.clone().requires_grad_(), -1)


def _backward():
    x = X.clone().requires_grad_()
    _SoftmaxInBackward.apply(x * 2).sum().backward()


def _math_path_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return _sdpa(Q, Q, Q)


def _encoder_fast_path():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    with torch.no_grad():
        return layer(Q[0])


SOFTMAX_FORMS = {
    "alias bound at import": lambda: _alias(X, -1),
    "F.softmax bound at import": lambda: _from_functional(X, -1),
    "Tensor.softmax bound at import": lambda: _method(X, -1),
    "method form": lambda: X.softmax(-1),
    "torch.ops.aten._softmax.default stashed at import": lambda: _aten(X, -1, False),
    "torch.ops.aten.softmax.int": lambda: torch.ops.aten.softmax.int(X, -1),
    "torch.special.softmax": lambda: torch.special.softmax(X, -1),
    "nn.Softmax": lambda: torch.nn.Softmax(-1)(X),
    "F.softmin": lambda: F.softmin(X, -1),
    "F.gumbel_softmax": lambda: F.gumbel_softmax(X),
    "softmax with dtype": lambda: _alias(X, -1, dtype=torch.float64),
    "out= form": lambda: torch._softmax(X, -1, False, out=torch.empty(3, 5)),
    "log_softmax method": lambda: X.log_softmax(-1).exp(),
    "F.cross_entropy (log_softmax inside)": lambda: F.cross_entropy(X, torch.zeros(3, dtype=torch.long)),
    "TorchScript function": lambda: _scripted(X),
    "requires_grad input": lambda: _alias(X.clone().requires_grad_(), -1),
    "inside torch.no_grad": _in_no_grad,
    "inside torch.inference_mode": _in_inference_mode,
    "in autograd's backward pass": _backward,
    "torch.func.vmap": lambda: torch.func.vmap(lambda r: _alias(r, 0))(X),
    "sparse softmax": lambda: torch.sparse.softmax(X.to_sparse(), -1),
    "attention kernel (holds a softmax)": lambda: _sdpa(Q, Q, Q),
    "logsumexp alias": lambda: _lse(X, -1),
    "logsumexp method": lambda: X.logsumexp(-1),
    # The same math under other names (issue: torch.logcumsumexp bypassed the ban): the normaliser, its
    # running form, its two-term cases, and libraries that compute it for you.
    "logcumsumexp (its last column is the logsumexp)": lambda: _logcumsumexp(X, -1)[:, -1],
    "logcumsumexp method": lambda: X.logcumsumexp(-1),
    "torch.special.logsumexp": lambda: torch.special.logsumexp(X, -1),
    "torch.special.log_softmax": lambda: torch.special.log_softmax(X, -1),
    "logaddexp folded over the columns (the merge in log space)": lambda: _fold(torch.logaddexp, X),
    "logaddexp2 folded over the columns": lambda: _fold(torch.logaddexp2, X),
    "softplus (logaddexp(x, 0))": lambda: F.softplus(X),
    "logsigmoid (-softplus(-x))": lambda: F.logsigmoid(X),
    "sigmoid (the softmax of two terms)": lambda: torch.sigmoid(X),
    "torch.special.expit": lambda: torch.special.expit(X),
    "torch.distributions.Categorical(logits).probs": lambda: torch.distributions.Categorical(logits=X).probs,
    "torch.distributions.Categorical(logits).log_prob": lambda: torch.distributions.Categorical(logits=X).log_prob(
        torch.zeros(3, dtype=torch.long)),
    "nn.LogSoftmax": lambda: torch.nn.LogSoftmax(-1)(X),
    "F.log_softmax bound at import": lambda: _log_softmax(X, -1),
    "F.nll_loss of log_softmax": lambda: F.nll_loss(X.log_softmax(-1), torch.zeros(3, dtype=torch.long)),
}
ATTENTION_FORMS = {
    "sdpa bound at import": lambda: _sdpa(Q, Q, Q),
    "sdpa causal": lambda: _sdpa(Q, Q, Q, is_causal=True),
    "sdpa with a mask": lambda: _sdpa(Q, Q, Q, attn_mask=torch.ones(4, 4, dtype=torch.bool).tril()),
    "sdpa math path": _math_path_sdpa,
    "sdpa with dropout (math path)": lambda: _sdpa(Q, Q, Q, dropout_p=0.5),
    "sdpa backward": lambda: _sdpa(Q.clone().requires_grad_(), Q, Q).sum().backward(),
    "nn.MultiheadAttention": lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True)(Q[0], Q[0], Q[0]),
    "TransformerEncoderLayer fast path": _encoder_fast_path,
    "torch.ops.aten sdpa for cpu": lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(Q, Q, Q),
}


@pytest.mark.parametrize("form", SOFTMAX_FORMS, ids=list(SOFTMAX_FORMS))
def test_every_form_of_softmax_is_caught(form):
    if form == "TorchScript function":  # its interpreter re-raises as a RuntimeError, our message lost
        with pytest.raises(RuntimeError, match="TorchScript interpreter"):
            with guard.forbidden(SOFTMAX_NAMES, "write it yourself"):
                SOFTMAX_FORMS[form]()
        return
    with pytest.raises(integrity.ForbiddenCall, match="must not call torch") as caught:
        with guard.forbidden(SOFTMAX_NAMES, "write it yourself"):
            SOFTMAX_FORMS[form]()
    assert "write it yourself" in str(caught.value), f"the message should carry the exercise's reason: {caught.value}"


@pytest.mark.parametrize("form", ATTENTION_FORMS, ids=list(ATTENTION_FORMS))
def test_every_form_of_attention_is_caught(form):
    with pytest.raises(integrity.ForbiddenCall, match="must not call torch"):
        with guard.forbidden(ATTENTION_NAMES):
            ATTENTION_FORMS[form]()


def test_the_message_names_the_operator_and_the_public_name():
    with pytest.raises(integrity.ForbiddenCall) as caught:
        with guard.forbidden(["torch.softmax"], "compute the normaliser yourself"):
            _alias(X, -1)
    message = str(caught.value)
    assert "must not call torch.softmax: compute the normaliser yourself" in message
    assert "aten::_softmax" in message and "an alias, a method, torch.ops" in message, message


def test_only_sdpa_forbidden_leaves_torch_softmax_alone():
    with guard.forbidden(["torch.nn.functional.scaled_dot_product_attention"]):
        out = _alias(X, -1)  # an attention exercise that forbids only sdpa may still use a softmax
    assert torch.allclose(out.sum(-1), torch.ones(3))


def test_honest_code_runs_unchanged_under_the_guard():
    def honest(x):
        m = x.amax(-1, keepdim=True)
        e = torch.exp(x - m)
        return e / e.sum(-1, keepdim=True)

    with guard.forbidden(SOFTMAX_NAMES):
        out = honest(X)
        grad_x = X.clone().requires_grad_()
        honest(grad_x).pow(2).sum().backward()
    assert torch.allclose(out, torch.softmax(X, -1)), "the guard must not change results"
    assert grad_x.grad is not None and grad_x.grad.shape == X.shape


def test_the_guard_leaves_nothing_behind():
    depth, start, softmax = torch._C._len_torch_dispatch_stack(), threading.Thread.start, torch.softmax
    with pytest.raises(integrity.ForbiddenCall):
        with guard.forbidden(SOFTMAX_NAMES):
            _alias(X, -1)
    assert torch._C._len_torch_dispatch_stack() == depth, "the dispatch mode stack must be as before"
    assert threading.Thread.start is start and torch.softmax is softmax
    assert "softmax" not in vars(torch.Tensor), "Tensor.softmax is inherited: nothing may be left in its __dict__"
    assert torch.allclose(_alias(X, -1).sum(-1), torch.ones(3)), "softmax works again after the call"


def test_names_outside_the_table_are_patched_but_not_watched():
    assert opfamilies.banned_operators(["torch.exp"]) == {}
    with guard.forbidden(["torch.exp"]):
        with pytest.raises(integrity.ForbiddenCall, match="must not call torch.exp"):
            torch.exp(X)
        assert torch._C._len_torch_dispatch_stack() == 0, "no operator guard for a name without operators"


def test_threads_the_call_starts_are_guarded():
    errors: list[BaseException] = []

    def rank():
        try:
            _alias(X, -1)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    with guard.forbidden(["torch.softmax"]):
        thread = threading.Thread(target=rank)
        thread.start()
        thread.join()
    assert len(errors) == 1 and isinstance(errors[0], integrity.ForbiddenCall), (
        f"a thread started during the call must run under the guard too, found {errors!r}"
    )


def test_a_custom_operator_is_refused():
    """A custom operator runs its body below the guard, where it cannot be seen: it is refused whatever its name.
    (One named like a banned family, say `mylib::fast_softmax`, is refused as that family by the naming rule;
    this one's name matches no family, so the refusal is the custom-operator rule's.)"""
    @torch.library.custom_op("probes_test::hidden_normalize", mutates_args=())
    def hidden_normalize(x: torch.Tensor) -> torch.Tensor:
        return _alias(x, -1)

    with pytest.raises(integrity.ForbiddenCall, match="probes_test::hidden_normalize, which is not one of torch's own"):
        with guard.forbidden(["torch.softmax"]):
            hidden_normalize(X)


def test_popping_the_guard_is_reported():
    from torch.utils._python_dispatch import _pop_mode

    with pytest.raises(integrity.GuardRemoved, match="removed or covered during the call"):
        with guard.forbidden(["torch.softmax"]):
            _pop_mode()
    assert torch._C._len_torch_dispatch_stack() == 0


def test_disabling_the_modes_evades_the_in_process_guard():
    """The limit the trusted scan exists for: code in the same process can switch the guard off
    (tests/test_tamper.py proves the scan flags this very construct)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with guard.forbidden(["torch.softmax"]):
        with _disable_current_modes():
            out = _alias(X, -1)
    assert out.shape == X.shape


# --------------------------------------------------------------------------------------------------
# The table itself


def _registered_operators() -> set[str]:
    import torch.distributed  # noqa: F401 - registers the c10d operators
    import torch.distributed._functional_collectives  # noqa: F401 - and the functional ones

    names = {name.split(".")[0] for name in torch._C._dispatch_get_all_op_names()}  # "aten::_softmax.out"
    return {name for name in names if name.partition("::")[0] in opfamilies.TORCH_NAMESPACES}


def test_every_operator_in_the_table_exists():
    registered = _registered_operators()
    families = {f for families in opfamilies.FORBIDDEN_OPS.values() for f in families}
    missing = sorted(op for f in families for op in f.ops if op not in registered)
    assert not missing, f"operators in the table that torch {torch.__version__} does not register: {missing}"


def test_every_softmax_attention_and_collective_operator_is_in_a_family():
    """The rule (opfamilies.families_by_rule) against this torch's whole registry: every operator whose namespace and
    name make it a softmax, an attention kernel, a log-sum-exp, a sigmoid or a collective is banned by the guard of
    a name of its family, whether a list names it or not. The lists give the messages; the rule fails closed."""
    listed = {op for families in opfamilies.FORBIDDEN_OPS.values() for f in families for op in f.ops}
    softmax = opfamilies._banned(("torch.softmax",))
    from grader.support.ring_allreduce import forbidden_collectives

    ring = opfamilies._banned(tuple(forbidden_collectives()))
    missed = []
    for op in {o.partition(".")[0] for o in _registered_operators()}:  # without the overload, as the guard sees it
        families = opfamilies.families_by_rule(op)
        if not families or op in {"aten::_fused_sdp_choice"}:  # chooses a kernel, computes nothing
            continue
        guard = ring if op.partition("::")[0] in opfamilies.COLLECTIVE_NAMESPACES else softmax
        if guard.get(op) is None:
            missed.append(op)
    assert not missed, f"operators of a forbidden family the guard lets through: {sorted(missed)}"
    unlisted = sorted({o.partition(".")[0] for o in _registered_operators()} - listed)
    assert "aten::_softmax" not in unlisted and "c10d::allreduce_" not in unlisted, unlisted[:10]


def test_an_operator_a_newer_torch_adds_is_forbidden_by_its_familys_rule():
    """A softmax or a collective that no list names (registered here as a newer torch would) is refused by the
    guard of its family's names, at the moment it exists: c10d::gather_into_tensor_ arrived in torch 2.14."""
    lib = torch.library.Library("aten", "FRAGMENT")
    lib.define("grader_test_softmax_v9(Tensor x) -> Tensor")
    lib.impl("grader_test_softmax_v9", lambda x: x.exp() / x.exp().sum(-1, keepdim=True), "CompositeExplicitAutograd")
    c10d = torch.library.Library("c10d", "FRAGMENT")
    c10d.define("grader_test_gather_into_tensor_v9_(Tensor x) -> Tensor")
    c10d.impl("grader_test_gather_into_tensor_v9_", lambda x: x.clone(), "CompositeExplicitAutograd")
    c10d.define("grader_test_shuffle_v9_(Tensor x) -> Tensor")  # a collective of no known kind: fails closed
    c10d.impl("grader_test_shuffle_v9_", lambda x: x.clone(), "CompositeExplicitAutograd")
    x = torch.randn(3, 4)
    assert "aten::grader_test_softmax_v9" not in {op for fs in opfamilies.FORBIDDEN_OPS.values() for f in fs for op in f.ops}
    with pytest.raises(integrity.ForbiddenCall, match="grader_test_softmax_v9, a softmax"):
        with guard.operator_guard(["torch.logsumexp"], "write it yourself"):
            torch.ops.aten.grader_test_softmax_v9(x)
    with guard.operator_guard(["torch.distributed.all_reduce"]):  # a gather is not an all-reduce
        torch.ops.c10d.grader_test_gather_into_tensor_v9_(x)
    with pytest.raises(integrity.ForbiddenCall, match="a gather"):
        with guard.operator_guard(["torch.distributed.gather"]):
            torch.ops.c10d.grader_test_gather_into_tensor_v9_(x)
    with pytest.raises(integrity.ForbiddenCall, match="a collective"):
        with guard.operator_guard(["torch.distributed.all_reduce"]):
            torch.ops.c10d.grader_test_shuffle_v9_(x)
    with guard.operator_guard(["torch.softmax"]):  # and nothing else is touched: exp, sum, a send
        torch.exp(x).sum()
    assert opfamilies.families_by_rule("c10d::send") == () and opfamilies.families_by_rule("aten::hardsigmoid") == ()


def _course_forbid_names() -> set[str]:
    """Every string in a `forbid=[...]` of the course's tests or in a module-level list named *_FORBID (what
    those lists spread in), plus the ring's collectives."""
    from grader.support.ring_allreduce import forbidden_collectives

    names = set(forbidden_collectives())
    for path in [*ROOT.glob("exercises/*/test_public.py"), *ROOT.glob("grader/hidden/*/test_*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "forbid" and isinstance(node.value, (ast.List, ast.Tuple)):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
            if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple))
                    and any(isinstance(t, ast.Name) and t.id.endswith("_FORBID") for t in node.targets)):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return names


def test_every_name_the_course_forbids_has_operators():
    names = _course_forbid_names()
    assert {"torch.softmax", "torch.logcumsumexp", "torch.distributed.all_reduce"} <= names, sorted(names)
    unwatched = sorted(n for n in names if n not in opfamilies.FORBIDDEN_OPS)
    assert not unwatched, f"forbidden names with no operator guard (add them to opfamilies.FORBIDDEN_OPS): {unwatched}"


_COLLECTIVES_SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from grader.harness import guard, integrity
    from grader.support.ring_allreduce import forbidden_collectives

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(4)
    all_reduce, group = dist.all_reduce, dist.group.WORLD  # bound before the guard, as at import
    forms = {
        "alias": lambda: all_reduce(t),
        "ProcessGroup method": lambda: group.allreduce([t]).wait(),
        "all_gather_single (not in the patched list)": lambda: dist.all_gather_single(torch.empty(4), t),
        "functional all_reduce": lambda: fc.all_reduce(t, "sum", group),
        "all_gather_object": lambda: dist.all_gather_object([None], {"a": 1}),
    }
    for name, form in forms.items():
        try:
            with guard.forbidden(forbidden_collectives(), "build it from send_recv"):
                form()
            print("MISSED", name)
        except integrity.ForbiddenCall:
            print("CAUGHT", name)
    with guard.forbidden(forbidden_collectives()):
        dist.barrier()  # not a collective the exercise forbids
    print("BARRIER OK")
    dist.destroy_process_group()

    import os
    softmax = torch.softmax
    with guard.forbidden(["torch.softmax"]):
        pid = os.fork()  # as run_distributed starts its ranks: the child inherits the guard
        if pid == 0:
            try:
                softmax(t, 0)
                os._exit(3)
            except integrity.ForbiddenCall:
                os._exit(7)
        print("FORK CAUGHT" if os.waitpid(pid, 0)[1] >> 8 == 7 else "FORK MISSED")
    """
)


def test_collectives_are_caught_at_their_c10d_operators_and_in_forked_ranks():
    """In a fresh process: a process group (and a fork) must not outlive the test."""
    done = subprocess.run([sys.executable, "-c", _COLLECTIVES_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "BARRIER OK" in lines, f"the script failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    missed = [line for line in lines if line.startswith("MISSED")]
    assert not missed and sum(line.startswith("CAUGHT") for line in lines) == 5, "\n".join(lines)
    assert "FORK CAUGHT" in lines, "a rank forked during a guarded call must run under the guard:\n" + "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Through the real grader: the known-wrong submissions lose, with a message that says why


def test_an_alias_bound_at_import_loses_with_the_operator_named(tmp_path):
    from tests.conftest import COURSE, checks_of, grade_folder
    from tests.known_wrong import load_mutants, write_mutant

    exercise = next(e for e in COURSE.exercises if e.id == "online_softmax")
    mutants = {m.name: m for m in load_mutants("online_softmax")}
    folder = write_mutant(ROOT, exercise, mutants["softmax_alias_bound_at_import"], tmp_path / "alias")
    check = checks_of(grade_folder(folder, ["online_softmax"], checks=["softmax"]), "online_softmax")["softmax"]
    assert check["points"] < check["max_points"]
    messages = " ".join(t["message"] for t in check["tests"])
    assert "must not call torch.softmax" in messages and "aten::_softmax" in messages, messages[:500]


def test_a_file_that_pops_the_dispatch_modes_loses_every_guarded_check(tmp_path):
    from tests.conftest import COURSE, checks_of, grade_folder
    from tests.known_wrong import load_mutants, write_mutant

    exercise = next(e for e in COURSE.exercises if e.id == "online_softmax")
    mutants = {m.name: m for m in load_mutants("online_softmax")}
    folder = write_mutant(ROOT, exercise, mutants["softmax_with_dispatch_modes_popped"], tmp_path / "popped")
    checks = checks_of(grade_folder(folder, ["online_softmax"], checks=["merge", "softmax"]), "online_softmax")
    for check_id in ("merge", "softmax"):  # merge_states is the reference's, but the file is not guarded
        check = checks[check_id]
        assert check["points"] == 0, f"{check_id}: {check['points']}/{check['max_points']}"
        message = check["tests"][0]["message"]
        assert "torch.utils._python_dispatch" in message and "cannot be trusted" in message, message
        assert Path(folder / "online_softmax.py").read_text().splitlines()[17].startswith("from torch.utils._python_dispatch")
        assert "line 18:" in message, message


# --------------------------------------------------------------------------------------------------
# The kernel rule (kernel_rule.KERNELS_ONLY): outside a Triton launch, the host may only allocate, view, copy
# and cast; it may not read values back; memory it leaves uninitialised reads NaN; inside a launch the
# rule is suspended (Triton's interpreter runs on torch and numpy) but the banned families are not.

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreted = pytest.mark.skipif(
    __import__("os").environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs Triton's interpreter or a GPU",
)
KERNEL_RULE = ["torch.softmax", kernel_rule.KERNELS_ONLY]
_HOST = {"x": X}  # what a kernel body under the interpreter can reach as a global (the CPU limit)


@triton.jit
def _exp_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.exp(tl.load(src + offs, mask=offs < n)), mask=offs < n)


@triton.jit
def _noop_kernel(dst, n, BLOCK: tl.constexpr):
    pass


@triton.jit
def _softmax_in_the_body(dst, n, BLOCK: tl.constexpr):
    _alias(_HOST["x"], -1)  # host code inside a kernel body: runs only under the interpreter


@triton.jit
def _exp_in_the_body(dst, n, BLOCK: tl.constexpr):
    _HOST["out"] = torch.exp(_HOST["x"])  # allowed primitive, on the host, inside an interpreted body


def _launch_exp(x: torch.Tensor) -> torch.Tensor:
    src = x.contiguous().view(-1)
    out = torch.empty_like(src)
    _exp_kernel[(triton.cdiv(src.numel(), 8),)](src, out, src.numel(), BLOCK=8)
    return out.view(x.shape)


def _host_numpy(x):
    out = torch.empty_like(x)
    out.copy_(torch.from_numpy(__import__("numpy").exp(x.numpy())))
    return out


SPLITS = torch.tensor([2, 7])  # made before the rule: a split by a tensor reads it on the host
HOST_WORK = {  # what a Triton-contract function's host code may not do, each with words its message holds
    "an exp on the host": (lambda: torch.exp(X), "aten::exp outside any kernel launch"),
    "a matmul on the host": (lambda: X @ X.t(), "aten::mm"),
    "a gather through an index tensor": (lambda: X[torch.tensor([0, 2])], "outside any kernel launch"),
    "a reduction": (lambda: X.amax(-1), "aten::amax"),
    "torch.where": (lambda: torch.where(X > 0, X, 0.0), "outside any kernel launch"),
    "torch.cat": (lambda: torch.cat([X, X]), "aten::cat"),
    ".item()": (lambda: X[0, 0].item(), "reads a tensor's value on the host"),
    "int(t)": (lambda: int(X[0, 0]), "reads a tensor's value on the host"),
    "an if on a tensor": (lambda: bool(X[0, 0] > 0), "aten::gt"),
    "torch.tensor of Python data": (lambda: torch.tensor([1.0, 2.0]), "builds a tensor from Python data"),
    "Tensor.numpy()": (lambda: X.numpy(), "Tensor.numpy()"),
    "numpy, then back": (lambda: _host_numpy(X), "Tensor.numpy()"),
    "numpy.asarray": (lambda: __import__("numpy").asarray(X), "Tensor.__array__"),
    "numpy.from_dlpack": (lambda: __import__("numpy").from_dlpack(X), "DLPack"),
    "torch.utils.dlpack.to_dlpack": (lambda: torch.utils.dlpack.to_dlpack(X), "to_dlpack"),
    "Tensor.tolist()": (lambda: X.tolist(), "Tensor.tolist()"),
    "print": (lambda: print(X), "print its shape"),
    "repr": (lambda: repr(X), "repr() or print()"),
    "an f-string": (lambda: f"{X}", "f-string"),
    "pickle": (lambda: pickle.dumps(X), "pickling"),
    "torch.save": (lambda: torch.save(X, io.BytesIO()), "pickling"),
    "untyped_storage": (lambda: X.untyped_storage(), "untyped_storage"),
    "data_ptr": (lambda: X.data_ptr(), "data_ptr"),
    "apply_ with a builtin": (lambda: X.clone().apply_(abs), "Tensor.apply_"),
    "torch.frombuffer": (lambda: torch.frombuffer(bytearray(8), dtype=torch.float32), "frombuffer"),
    "tensor_split by a tensor": (lambda: X.flatten().tensor_split(SPLITS), "tensor of indices"),
    "torch.tensor_split by a tensor": (lambda: torch.tensor_split(X, SPLITS[:1], dim=1), "tensor of indices"),
}


@pytest.mark.parametrize("form", HOST_WORK, ids=list(HOST_WORK))
def test_host_work_outside_a_launch_is_refused(form):
    work, words = HOST_WORK[form]
    with pytest.raises(integrity.ForbiddenCall, match="must do its work in Triton kernels: why") as caught:
        with guard.forbidden(KERNEL_RULE, "why"):
            work()
    assert words in str(caught.value), f"the message should say {words!r}: {caught.value}"


def test_allocation_views_copies_and_casts_are_allowed():
    with guard.forbidden(KERNEL_RULE):
        base = torch.zeros(4, 6)
        views = [base.view(6, 4), base.reshape(-1), base.t(), base[1:3, ::2], base.unsqueeze(0).expand(2, 4, 6),
                 base.permute(1, 0), base.narrow(1, 0, 2), base.as_strided((2, 2), (1, 1)), base.detach()]
        made = [torch.empty(3), torch.empty_like(base), torch.full((2,), 3.0), torch.ones(2), torch.arange(4),
                base.new_zeros(2), base.t().contiguous(), base.to(torch.float16), base.double(), base.clone()]
        torch.empty(2).fill_(1.0).zero_()
        base.copy_(torch.ones(4, 6))
        shape, stride, dtype = X.shape, X.stride(), X.dtype  # metadata is free
    assert len(views) + len(made) == 19 and shape == (3, 5) and stride == (5, 1) and dtype == torch.float32
    assert torch.equal(base, torch.ones(4, 6)), "a copy into an output must go through"


def test_uninitialised_allocations_read_nan():
    with guard.forbidden(KERNEL_RULE):
        out = torch.empty(3, 4)
        like = torch.empty_like(X)
        ints = torch.empty(5, dtype=torch.int32)
    assert bool(out.isnan().all()) and bool(like.isnan().all()), "memory the host leaves uninitialised reads NaN"
    assert ints.shape == (5,), "integer allocations are left as they are (no NaN to fill them with)"


@interpreted
def test_a_kernel_launch_computes_and_is_recorded():
    with launches.recording_launches() as log:
        with guard.forbidden(KERNEL_RULE):
            out = _launch_exp(X)
    assert torch.allclose(out, X.exp()), "the kernel's result must come back unchanged by the rule"
    assert [(launch.kernel, launch.grid, launch.programs) for launch in log] == [("_exp_kernel", (2, 1, 1), 2)]
    assert kernel_rule.storage_of(out) in log[0].storages and kernel_rule.storage_of(X) in log[0].storages


@interpreted
def test_a_callable_grid_is_recorded_as_resolved():
    src = X.reshape(-1).clone()
    out = torch.empty_like(src)
    with launches.recording_launches() as log:
        _exp_kernel[lambda meta: (triton.cdiv(src.numel(), meta["BLOCK"]),)](src, out, src.numel(), BLOCK=4)
    assert log[0].grid == (4, 1, 1), log


@interpreted
def test_host_work_in_a_callable_grid_is_refused():
    """The grid callable is the student's host code that the launcher runs: a red team computed a whole
    softmax in it around a kernel that did nothing, while the rule was suspended for the launch."""
    src = X.reshape(-1).clone()
    out = torch.empty_like(src)

    def grid(meta):
        out.copy_(src.exp())  # the work, on the host
        return (triton.cdiv(src.numel(), meta["BLOCK"]),)

    with pytest.raises(integrity.ForbiddenCall, match="aten::exp"):
        with guard.forbidden(KERNEL_RULE):
            _noop_kernel[grid](out, src.numel(), BLOCK=4)
    with launches.recording_launches() as log:  # arithmetic on sizes in a grid is what grids are for
        with guard.forbidden(KERNEL_RULE):
            _exp_kernel[lambda meta: (triton.cdiv(src.numel(), meta["BLOCK"]),)](src, out, src.numel(), BLOCK=4)
    assert log[0].grid == (4, 1, 1) and torch.allclose(out, src.exp())


@interpreted
def test_an_output_no_kernel_writes_stays_nan():
    with guard.forbidden(KERNEL_RULE):
        out = torch.empty(10)
        _noop_kernel[(2,)](out, 10, BLOCK=8)
    assert bool(out.isnan().all()), "a launch that writes nothing leaves the NaN of the allocation"


@interpreted
def test_the_banned_families_hold_inside_a_launch():
    with pytest.raises(Exception, match="must not call torch.softmax"):
        with guard.forbidden(KERNEL_RULE):
            _softmax_in_the_body[(1,)](torch.empty(1), 1, BLOCK=8)


@interpreted
def test_host_code_inside_an_interpreted_kernel_body_is_under_the_rule():
    """Under TRITON_INTERPRET=1 a kernel body is Python. The rule is suspended only for Triton's own steps of a
    launch (setting up the arguments, copying results back), not while the body runs: torch code hidden in a
    body is host code (the red team's round 8 ran a numpy softmax there, 90 of 90)."""
    interpreter_bound.bound_interpreter_memory()  # the worker installs it before the student's import
    with guard.forbidden(KERNEL_RULE):
        with pytest.raises(Exception, match="must do its work in Triton kernels"):
            _exp_in_the_body[(1,)](torch.empty(1), 1, BLOCK=8)
    _HOST.pop("out", None)
    with guard.forbidden(KERNEL_RULE):
        out = _launch_exp(X)  # an honest kernel under the same rule
    assert torch.allclose(out, X.exp())


@interpreted
def test_hooks_and_patched_kernels_are_refused():
    kernel = triton.jit(_exp_kernel.fn)
    kernel.add_pre_run_hook(lambda *args, **kwargs: None)
    with pytest.raises(integrity.ForbiddenCall, match="pre-run hooks"):
        with guard.forbidden(KERNEL_RULE):
            kernel[(1,)](X, torch.empty(15), 15, BLOCK=16)
    kernel = triton.jit(_exp_kernel.fn)
    kernel.rewrite = lambda: (lambda **kwargs: None)  # a method replaced on the instance
    with pytest.raises(integrity.ForbiddenCall, match="replaced on the instance"):
        with guard.forbidden(KERNEL_RULE):
            kernel[(1,)](X, torch.empty(15), 15, BLOCK=16)


@interpreted
def test_replaced_launch_machinery_is_refused():
    from triton.runtime.interpreter import GridExecutor

    original = GridExecutor.__call__
    GridExecutor.__call__ = lambda self, *args, **kwargs: None  # would run, suspended, inside every launch
    try:
        with pytest.raises(integrity.ForbiddenCall, match="GridExecutor.__call__ is not Triton's own"):
            with guard.forbidden(KERNEL_RULE):
                pass
    finally:
        GridExecutor.__call__ = original


@interpreted
def test_the_rule_follows_threads_the_call_starts():
    errors: list[BaseException] = []

    def work():
        try:
            torch.exp(X)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    with guard.forbidden(KERNEL_RULE):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert len(errors) == 1 and isinstance(errors[0], integrity.ForbiddenCall), errors


@interpreted
def test_the_kernel_rule_leaves_nothing_behind():
    from triton.runtime.interpreter import InterpretedFunction

    run = vars(InterpretedFunction)["run"]
    with pytest.raises(integrity.ForbiddenCall):
        with guard.forbidden(KERNEL_RULE):
            X.tolist()
    assert vars(InterpretedFunction)["run"] is run, "Triton's launcher must be put back"
    # The read-backs stay watched (installed once, before any student import), and pass through outside a call.
    assert torch.Tensor.tolist is not torch._C.TensorBase.tolist and torch.Tensor.tolist.__name__ == "tolist"
    assert host_reads._READS["refuse"] == 0 and host_reads._READS["counters"] == []
    assert X.tolist()[0] and repr(X).startswith("tensor(") and torch.exp(X).shape == X.shape
    assert torch._C._len_torch_dispatch_stack() == 0 and not kernel_rule.in_launch()


def test_reading_through_the_base_class_is_beyond_the_run_time_rule():
    """The limit the trusted scan must cover: torch._C.TensorBase cannot be patched, so super(torch.Tensor,
    t).tolist() and torch.Tensor.__base__.numpy(t) read values unseen (AUTHORING.md; the scan flags torch._C)."""
    with guard.forbidden(KERNEL_RULE):
        values = super(torch.Tensor, X).tolist()
    assert values == X.tolist()


def test_every_host_op_exists():
    registered = {name.split(".")[0] for name in torch._C._dispatch_get_all_op_names()}
    missing = sorted(op for op in kernel_rule.HOST_OPS if op not in registered)
    assert not missing, f"operators in HOST_OPS that torch {torch.__version__} does not register: {missing}"
    computing = {"aten::exp", "aten::mm", "aten::index", "aten::gather", "aten::add", "aten::mul", "aten::where",
                 "aten::_local_scalar_dense", "aten::lift_fresh", "aten::set_", "aten::index_select", "aten::cat"}
    assert not computing & kernel_rule.HOST_OPS, f"HOST_OPS holds operators that compute: {sorted(computing & kernel_rule.HOST_OPS)}"


@interpreted
def test_the_launches_driver_tells_an_output_a_kernel_wrote_from_one_it_never_saw():
    from grader.support.kernels import launches

    def cast_after_the_kernel(x):  # the kernel writes a buffer; the host returns a cast copy of it
        return _launch_exp(x).to(torch.float64).t().contiguous()

    def constant_after_a_launch(x):  # a launch happened, but the result is a constant the host made
        _launch_exp(x)
        return torch.full_like(x, 0.5)

    with guard.forbidden(KERNEL_RULE):
        written = launches(_launch_exp, X)
        cast = launches(cast_after_the_kernel, X)
        copied = launches(constant_after_a_launch, X)
        none = launches(lambda x: torch.zeros_like(x), X)
    fp32 = {"kind": "tensor", "dtype": "float32", "aligned": True}
    assert written["handed"] == [True] and written["launches"] == [{
        "kernel": "_exp_kernel", "grid": [2, 1, 1], "programs": 2, "options": {},
        # what the kernel resource model compiles it with (grader.kernelmodel)
        "arguments": {"src": fp32, "dst": fp32, "n": {"kind": "int", "value": 15}, "BLOCK": {"kind": "int", "value": 8}},
    }], written
    assert cast["handed"] == [True], "a kernel's result, cast and copied on the host, is still the kernel's"
    assert copied["handed"] == [False] and len(copied["launches"]) == 1, copied
    assert none["handed"] == [False] and none["launches"] == [], none


# --------------------------------------------------------------------------------------------------
# Read-backs watched from before the student's import; the work counter


def test_a_read_back_bound_at_import_is_still_refused(tmp_path):
    """`_np = torch.Tensor.numpy` at import used to keep the unpatched method: the kernel rule patched the
    class only for the call. The worker now installs the watch before it imports the student's file."""
    from grader.harness.client import Sandbox
    from grader.harness.session import StudentSession

    path = tmp_path / "bound.py"
    path.write_text("import torch\nNP = torch.Tensor.numpy\nTL = torch.Tensor.tolist\n"
                    "def forward(x):\n    return torch.from_numpy(NP(x) * 2)\n"
                    "def listed(x):\n    return TL(x)\n")
    student = StudentSession("sandbox", lambda _id: path, Sandbox(), lambda _id: 30.0)
    try:
        mod = student.load("bound", forbid=[kernel_rule.KERNELS_ONLY])
        for fn, words in ((mod.forward, "Tensor.numpy()"), (mod.listed, "Tensor.tolist()")):
            with pytest.raises(Exception, match="may not read tensor values") as caught:
                fn(torch.ones(3))
            assert words in str(caught.value), caught.value
    finally:
        student.close()


@contextlib.contextmanager
def sandboxed_module(tmp_path, name: str, source: str, forbid: list[str], monkeypatch=None):
    """`source` as a student's file, loaded in a sandboxed worker with `forbid`. With `monkeypatch`, the trusted
    scan is switched off (it flags each of these files), so that the worker's own defence is what is tested."""
    from grader.harness import session
    from grader.harness.client import Sandbox
    from grader.harness.session import StudentSession

    if monkeypatch is not None:
        monkeypatch.setattr(session, "tamper_findings", lambda path: [])
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    student = StudentSession("sandbox", lambda _id: path, Sandbox(), lambda _id: 30.0)
    try:
        yield student.load(name, forbid=forbid)
    finally:
        student.close()


PROBE_SWAPS = {  # each rebinds a probe from inside a guarded call (the scan flags the import; this is the backstop)
    "in_launch, which the guard asks": "guard.in_launch = lambda: True",
    "the guard's dispatch handler": "guard.OperatorGuard.__torch_dispatch__ = lambda self, f, t, a=(), k=None: f(*a, **(k or {}))",
    "a host-read wrapper the watch installed": "torch.Tensor.numpy = torch._C.TensorBase.numpy",
    "the interpreter's bound": "interpreter._interpreter = interpreter._interpreter._native",
}


@pytest.mark.parametrize("swap", PROBE_SWAPS, ids=list(PROBE_SWAPS))
def test_a_call_that_rebinds_a_probe_fails(tmp_path, swap, monkeypatch):
    """The worker seals the probes by identity before it imports the student's file (integrity.seal); a guarded
    call that rebinds one of them, by any route the scan missed, fails with what was changed. The scan is
    switched off here (it flags each of these files), so the backstop is what is tested."""
    source = ("import torch\nfrom grader.harness import guard\nfrom triton.runtime import interpreter\n"
              f"def forward(x):\n    {PROBE_SWAPS[swap]}\n    return x * 2\n")
    with sandboxed_module(tmp_path, "swap", source, [kernel_rule.KERNELS_ONLY], monkeypatch) as mod:
        with pytest.raises(Exception, match="the grader's probes were changed during the call") as caught:
            mod.forward(torch.ones(3))
        assert "cannot be trusted" in str(caught.value), caught.value


def test_the_seal_passes_an_honest_call_and_sees_a_rebinding():
    integrity.seal()
    try:
        integrity.assert_sealed()  # nothing changed
        original = kernel_rule.in_launch
        kernel_rule.in_launch = lambda: True
        try:
            with pytest.raises(integrity.GuardRemoved, match="in_launch"):
                integrity.assert_sealed()
        finally:
            kernel_rule.in_launch = original
        integrity.assert_sealed()
    finally:
        integrity._SEAL.clear()


LOOPS_IN_C = {  # a per-element loop that runs no line of the file per element, and what grows
    "map over .tolist()": ("torch.tensor(list(map(abs, x.flatten().tolist())))", "reads"),
    "map over unbind": ("torch.stack(list(map(torch.Tensor.sum, x.unbind(0))))", "ops"),
    "int() of every element": ("torch.tensor(list(map(int, x.flatten())))", "reads"),
    "numpy, element by element": ("torch.tensor(sorted(x.numpy().ravel()))", "reads"),
}


@pytest.mark.parametrize("form", LOOPS_IN_C, ids=list(LOOPS_IN_C))
def test_the_work_counter_sees_a_loop_that_runs_in_c(tmp_path, form):
    from grader.harness.session import StudentSession

    body, grows = LOOPS_IN_C[form]
    path = tmp_path / "loops.py"
    path.write_text(f"import torch\ndef loop(x):\n    return {body}\ndef vectorised(x):\n    return x.abs().sum(-1)\n")
    student = StudentSession("local", lambda _id: path)
    mod = student.load("loops")
    def returned_a_tensor(value):
        assert isinstance(value, torch.Tensor), value

    small, big = (student.work_executed(mod.loop, torch.randn(n, 2), check=returned_a_tensor)[1] for n in (8, 80))
    assert small.lines == big.lines, "the loop runs in C: the line count stays flat"
    assert getattr(big, grows) >= getattr(small, grows) + 72, f"{form}: {small} -> {big}"
    flat = [student.work_executed(mod.vectorised, torch.randn(n, 2), check=returned_a_tensor)[1] for n in (8, 80)]
    assert flat[0] == flat[1] and flat[0].reads == 0, f"vectorised code keeps every count: {flat}"


def test_a_nested_tensor_counts_the_values_its_shapes_come_from():
    """A nested tensor's pieces take their shapes from a sizes tensor read in C++: `unbind()` then handed Python
    the values (8 a piece through `.size()`) with one operator and no read-back route (red team round 19:
    moe_router's and speculative's vectorised checks, 9/9). The scan flags the constructors; the counter counts
    the tensors any nested operator is handed, whatever route reached it."""
    ids = torch.randint(0, 8, (480, 8))
    with counters.WorkCounter(__file__) as counter:
        nt = torch._nested_view_from_buffer(torch.zeros(1), ids, torch.zeros_like(ids), torch.zeros(480, dtype=torch.long))
        sizes = [piece.size() for piece in nt.unbind()]
    assert [tuple(s) for s in sizes[:2]] == [tuple(r) for r in ids[:2].tolist()], "the channel itself works"
    assert counter.reads >= ids.numel() and counter.read_bytes >= 8 * ids.numel(), (counter.reads, counter.read_bytes)


class _DuckTensor:
    """Not a tensor: an object with the methods a launcher calls, which runs host code inside the launch."""

    def __init__(self, base: torch.Tensor):
        self.base = base
        self.host_work = 0

    def data_ptr(self) -> int:
        self.host_work += 1  # a red-team file computed the whole answer here, with the rule suspended
        return self.base.data_ptr()


def test_a_launch_takes_only_tensors_numbers_and_dtypes():
    """An empty kernel handed an object of the student's own once earned flash_attention its full 76 gradable
    points: the launcher called the object's methods inside the launch, where the kernel rule is suspended."""
    src = torch.zeros(8)
    out = torch.empty(8)
    duck = _DuckTensor(out)
    with pytest.raises(integrity.ForbiddenCall, match="an object of type _DuckTensor as its argument 1"):
        with guard.forbidden(KERNEL_RULE):
            _exp_kernel[(1,)](src, duck, 8, BLOCK=8)
    assert duck.host_work == 0, "the object's methods must not run at all"

    class Sub(torch.Tensor):
        pass

    with pytest.raises(integrity.ForbiddenCall, match="Sub"):
        with guard.forbidden(KERNEL_RULE):
            _exp_kernel[(1,)](src, out.as_subclass(Sub), 8, BLOCK=8)
    with guard.forbidden(KERNEL_RULE):  # Triton's own wrapper of an exact tensor is fine, and a plain constexpr
        _exp_kernel[(1,)](src, triton.reinterpret(out, torch.float32), 8, BLOCK=tl.constexpr(8))
    assert torch.equal(out, torch.ones(8))
    # The launcher's duck typing also sees attributes set on an allowed object: a constexpr given its own
    # untyped_storage (red team: flash_attention 74/76 with an empty kernel), a tensor given its own data_ptr.
    hook = tl.constexpr(0)
    hook.data_ptr = duck.data_ptr
    shadowed = torch.zeros(8)
    shadowed.data_ptr = duck.data_ptr
    for value, words in ((hook, "a constexpr with attributes Triton never sets (data_ptr)"),
                         (shadowed, "a tensor with attributes of its own (data_ptr)")):
        with pytest.raises(integrity.ForbiddenCall, match=re.escape(words)):
            with guard.forbidden(KERNEL_RULE):
                _exp_kernel[(1,)](src, value, 8, BLOCK=8)
    assert duck.host_work == 0


def test_a_read_through_a_view_counts_what_it_exposes():
    """`t.view(-1)[:1].numpy()` once counted one element while numpy's strides reached all of them (a per-token
    loop over the values kept moe_router's vectorised 10/10): routes that hand over memory count its storage."""
    x = torch.arange(1000.0)
    for read, exposed in ((lambda: x[:1].numpy(), 1000), (lambda: __import__("numpy").asarray(x[:1]), 1000),
                          (lambda: x[:1].untyped_storage(), 1000), (lambda: x[:1].tolist(), 1),
                          (lambda: x[:5].tolist(), 5)):
        host_reads._ALIASED.clear()  # each read on its own: memory handed to numpy stays watched after it
        with host_reads.reads_counted() as counter:
            read()
        assert counter.reads == exposed, f"expected {exposed} elements counted, found {counter.reads}"


def test_tensor_split_by_a_tensor_counts_its_indices_as_read():
    """tensor_split reads a 1-D tensor of indices in C++ and dispatches only the slices it makes; each piece's
    storage_offset() then hands one index to Python (red team round 18: x's values read through
    x.tensor_split(x.long()...) behind a copy kernel took online_softmax's Triton checks 27/27, and padded
    operator counts kept moe_router's and speculative's vectorised points). With ints it is a view."""
    x, idx = torch.arange(100.0), torch.arange(1, 41)
    for split in (lambda: x.tensor_split(idx), lambda: torch.tensor_split(x, idx),
                  lambda: torch.tensor_split(x, tensor_indices_or_sections=idx)):
        with host_reads.reads_counted() as counter:
            pieces = split()
        assert len(pieces) == 41 and counter.reads == 40 and counter.read_bytes == 320, (counter.reads,
                                                                                        counter.read_bytes)
    with host_reads.reads_counted() as counter:
        x.tensor_split(4), x.tensor_split([3, 9]), torch.tensor_split(x, 5)
    assert counter.reads == 0, f"a split by ints reads nothing back, counted {counter.reads}"
    with guard.forbidden(KERNEL_RULE):
        x.tensor_split([3, 9])  # a view, allowed under the kernel rule


def test_a_copy_into_numpys_memory_counts_as_a_read_and_breaks_the_kernel_rule():
    """`torch.from_numpy(host).copy_(t)` then `host.tolist()` read t's values with no read-back route at all (red
    team: moe_router vectorised 10/10, an eager gptq in numpy 5/5): a tensor over memory Python reads without
    torch counts its storage when it is made, and the kernel rule refuses it."""
    import numpy as np

    host_reads.install_host_read_watch()  # as the worker does before the student's import (alone, this test needs it)
    x = torch.arange(1000.0)
    for make in (torch.from_numpy, torch.as_tensor, torch.asarray):
        with host_reads.reads_counted() as counter:
            host = np.zeros(1000)
            make(host).copy_(x)
        assert counter.reads >= 1000 and host[999] == 999.0, f"{make.__name__}: {counter.reads}"
    with host_reads.reads_counted() as counter:  # a copy of Python data, or of a tensor, reads nothing back
        torch.as_tensor([1, 2, 3]), torch.as_tensor(x), torch.asarray(x)
    assert counter.reads == 0
    with pytest.raises(integrity.ForbiddenCall, match="torch.from_numpy"):
        with guard.forbidden(KERNEL_RULE):
            torch.from_numpy(np.zeros(3))


def test_the_read_watch_wrappers_do_not_keep_the_methods_they_watch():
    """functools.wraps left the unwatched method as __wrapped__ on each wrapper: a file that read the wrapper's
    namespace (vars() through a parameter named `self`) read tensors with nothing counting."""
    import torch

    host_reads.install_host_read_watch()
    for dotted in host_reads.HOST_READS:
        try:
            owner, name = integrity._resolve(dotted)
        except (ValueError, AttributeError):
            continue
        wrapper = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        assert not hasattr(wrapper, "__wrapped__"), f"{dotted} keeps the method it watches as __wrapped__"
    assert torch.Tensor.numpy is not torch._C.TensorBase.numpy


def test_a_storage_of_the_students_own_is_watched_like_a_tensor():
    """A storage made at import and a tensor over it (set_) let a call copy a result in and read its bytes out with
    torch.save or the storage's own methods, no operator dispatched: flash_attention scored 76/76 from host numpy."""
    import io

    import torch

    host_reads.install_host_read_watch()
    store = torch.UntypedStorage(64)
    view = torch.empty(0, dtype=torch.uint8).set_(store)
    with host_reads.reads_counted() as counter:
        view[:64].view(torch.float32).copy_(torch.arange(16.0))
        torch.save(store, io.BytesIO())
        store.tolist()
    assert counter.reads >= 128, f"two reads of a 64-byte storage counted {counter.reads}"
    for route in (lambda: torch.save(store, io.BytesIO()), lambda: store._write_file(io.BytesIO(), False, False, 1),
                  lambda: store.tolist(), lambda: store[0], lambda: store.data_ptr()):
        with pytest.raises(integrity.ForbiddenCall, match="must do its work in Triton kernels"):
            with host_reads.host_reads_refused("the kernel rule"):
                route()


def test_memory_shared_with_numpy_before_the_call_is_watched_in_it():
    """A tensor over numpy's memory made at import (torch.from_numpy, .numpy(), frombuffer), outside any watched call:
    during the call a copy into it is an allowed host operation, and numpy then reads the values with nothing counting
    (the red team's flash_attention scored 76/76 from host numpy, moe_router vectorised 10/10). Every operator on such
    memory during a watched call is a read of it; memory the grader's own reply encoding reads is not such memory."""
    import numpy as np
    import torch

    from grader.harness import wire

    host_reads.install_host_read_watch()
    honest = torch.arange(8.0)
    with host_reads.harness_io():
        wire.encode_reply({"ok": True, "value": honest}, lambda obj: 0)
    buf = np.zeros(16, dtype=np.float32)
    shared = torch.from_numpy(buf)  # at "import": no call is watched
    x = torch.arange(16.0)
    with host_reads.reads_counted() as counter:
        (honest * 2).sum()
        assert counter.reads == 0, "honest work on the grader's own tensors counted as reads"
        shared.copy_(x)
    assert counter.reads >= 16 and buf[3] == 3.0, counter.reads
    with pytest.raises(integrity.ForbiddenCall, match="shares its memory with numpy"):
        with host_reads.host_reads_refused("the kernel rule"):
            shared.copy_(x)
    exported = torch.zeros(4)
    exported.numpy()  # at "import": numpy now holds a view of its memory
    with host_reads.reads_counted() as counter:
        exported.add_(1)
    assert counter.reads >= 4


# A kernel under Triton's interpreter runs its loads and stores on raw host addresses: bounded to the storages of
# the tensors handed to the launch, or a pointer made from an integer reaches any memory of the worker.

@triton.jit
def _store_at(src, address, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    dst = address.to(tl.int64).to(tl.pointer_type(tl.float32))
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _load_at(dst, address, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    src = address.to(tl.int64).to(tl.pointer_type(tl.float32))
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_an_interpreted_kernel_touches_only_its_launchs_tensors():
    import array

    interpreter_bound.bound_interpreter_memory()
    src = torch.arange(8, dtype=torch.float32)
    buffer = array.array("f", bytes(4 * 8))  # memory torch never sees: the red team's channel to numpy
    with pytest.raises(Exception, match="outside the tensors handed to its launch"):
        _store_at[(1,)](src, buffer.buffer_info()[0], 8, BLOCK=8)
    assert list(buffer) == [0.0] * 8, "the refused store must not have written anything"
    out = torch.zeros(8)
    with pytest.raises(Exception, match="read memory outside the tensors handed to its launch"):
        _load_at[(1,)](out, buffer.buffer_info()[0], 8, BLOCK=8)
    # honest launches are untouched: views into a larger storage, masked lanes past the end
    view = torch.zeros(20)[5:13]
    _exp_kernel[(2,)](src[1:], view, 7, BLOCK=4)
    assert torch.allclose(view[:7], src[1:].exp())


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_a_launch_handed_memory_shared_with_a_buffer_is_a_host_read():
    """A kernel copying into a tensor over a bytearray moves values where Python reads them without torch."""
    interpreter_bound.bound_interpreter_memory()
    host_reads.install_host_read_watch()  # as the worker does before the student's import (the fixture arms the record)
    shared = bytearray(4 * 8)
    over = torch.frombuffer(shared, dtype=torch.float32)  # at "import": the buffer is recorded as shared
    src = torch.arange(8, dtype=torch.float32)
    with guard.forbidden(KERNEL_RULE):
        with pytest.raises(integrity.ForbiddenCall, match="shares its memory with numpy or a buffer"):
            _exp_kernel[(2,)](src, over, 8, BLOCK=4)
    private = torch.empty(8)
    with guard.forbidden(KERNEL_RULE):
        _exp_kernel[(2,)](src, private, 8, BLOCK=4)  # an ordinary tensor: no read
    with launches.watching_launches(), host_reads.reads_counted() as honest:
        _exp_kernel[(2,)](src, private, 8, BLOCK=4)
    with launches.watching_launches(), host_reads.reads_counted() as counter:
        _exp_kernel[(2,)](src, over, 8, BLOCK=4)
    assert counter.reads - honest.reads >= 8, (honest.reads, counter.reads)


_MOVED: dict = {}


@triton.jit
def _store_after_moving(dst, n, BLOCK: tl.constexpr):
    _MOVED["t"].resize_(1 << 16)  # host code in an interpreted body: the storage moves, its old chunk is freed
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_a_storage_moved_during_a_launch_takes_its_bounds_with_it():
    """The bounds are the storages' addresses at each access, not at the launch's start (round 8's stale bounds)."""
    interpreter_bound.bound_interpreter_memory()
    _MOVED["t"] = torch.zeros(16)
    try:
        with pytest.raises(Exception, match="wrote memory outside the tensors handed to its launch"):
            _store_after_moving[(1,)](_MOVED["t"], 16, BLOCK=16)
    finally:
        _MOVED.clear()


_DEFAULTS: dict = {}


def _host_work_in_a_default():
    if _DEFAULTS.get("armed"):
        _DEFAULTS["out"] = _DEFAULTS["x"].numpy().sum()  # host work, when the interpreter re-executes the def
    return 0


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_the_interpreter_rerunning_a_kernels_def_runs_it_under_the_rule():
    """The interpreter executes a kernel's def again to rewrite it, inside the launch: a default argument's
    expression is host code there (red team round 9: a numpy softmax in a default, 90 of 90)."""
    interpreter_bound.bound_interpreter_memory()

    @triton.jit
    def _k(dst, flag=_host_work_in_a_default()):
        pass

    _DEFAULTS.update(x=torch.ones(3), armed=True)
    try:
        with guard.forbidden(KERNEL_RULE):
            with pytest.raises(Exception, match="must do its work in Triton kernels"):
                _k[(1,)](torch.empty(1))
        assert "out" not in _DEFAULTS
    finally:
        _DEFAULTS.clear()


@triton.jit
def _two_defs(dst):
    _note = """
def _two_defs(dst):
    pass
"""  # a second def line: the interpreter would run the function from here


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_a_kernel_whose_source_holds_a_second_def_line_is_refused():
    """Red team round 9 hid code in a string whose line started with 'def ': the interpreter re-executes a kernel
    from its source's last def line, so it ran text the scan had read as a string."""
    interpreter_bound.bound_interpreter_memory()
    with pytest.raises(Exception, match="second line that starts with 'def '"):
        _two_defs[(1,)](torch.empty(1))
    _exp_kernel[(1,)](torch.ones(4), torch.empty(4), 4, BLOCK=4)  # one def: as before


def test_a_resize_in_another_thread_waits_for_an_interpreted_access():
    """An interpreted kernel's bounds check and its access run under one lock, which a guarded resize_ or set_
    takes too: a second thread cannot move a launch's storage between the check and the access (round 9 did,
    in ring_allreduce, where a call's threads run beside its launch)."""
    tensor = torch.zeros(4)
    done = threading.Event()

    def resize():
        with guard.operator_guard(["torch.softmax"]):
            tensor.resize_(1 << 16)
        done.set()

    with kernel_rule._MEMORY_LOCK:  # as a load, store or atomic of the bounded interpreter holds it
        thread = threading.Thread(target=resize)
        thread.start()
        assert not done.wait(0.3), "the resize ran while an interpreted access held the memory lock"
        assert tensor.numel() == 4
    assert done.wait(10), "the resize never ran once the access was done"
    thread.join()
    assert tensor.numel() == 1 << 16


@triton.jit
def _does_nothing(dst, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # noqa: F841 - the grid function below is where the attack's work was


def _grid_that_loads(meta):
    offs = tl.arange(0, 4)
    tile = tl.load(meta["dst"] + offs)  # under the interpreter, inside the launch: host code touching memory
    tl.store(meta["dst"] + offs, tile)
    return (1,)


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_a_grid_function_may_not_load_or_store():
    """The interpreter runs a launch's grid callable inside the launch, with tl.load and tl.store live: a grid
    function that loaded each row, ran numpy on the tile's raw array and stored it back scored full marks with a
    kernel that did nothing (red team round 10). Only a kernel's body touches memory; the scan flags tl.* calls
    outside kernels too (tests/test_tamper.py)."""
    interpreter_bound.bound_interpreter_memory()
    with launches.watching_launches():
        with pytest.raises(Exception, match="the grid function of a kernel launch read memory"):
            _does_nothing[_grid_that_loads](torch.zeros(4), 4, BLOCK=4)
        _does_nothing[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](torch.zeros(4), 4, BLOCK=4)  # honest


LATE_WRITE = """\
import gc
import traceback

import torch

JOBS = []
PROBE_FILES = tuple(f"/grader/harness/{m}.py" for m in (  # the probes' own code (integrity.PROBE_MODULES)
    "integrity", "opfamilies", "kernel_rule", "launches", "host_reads", "interpreter_bound", "guard", "counters", "probes"))


def _late(depth):
    try:
        yield 1
    finally:  # run by the cyclic collector, whenever it runs
        _collected(depth)


def _arm(depth):
    box = []
    g = _late(depth)
    next(g)
    box.append(g)  # a cycle (its frame holds box): only the collector frees it
    box.append(box)
    gc.set_threshold(1, 1, 1)


def _collected(depth):
    if any(f.filename.endswith(PROBE_FILES) for f in traceback.extract_stack()) and depth < 2000:
        _arm(depth + 1)  # still inside the guard's code: wait for the next collection
        return
    gc.set_threshold(700, 10, 10)
    while JOBS:
        x, y = JOBS.pop()
        y.copy_(torch.softmax(x, -1))


def forward(x):
    y = x * 2
    JOBS.append((x, y))
    _arm(0)
    return y
"""


def test_code_run_by_the_collector_after_a_call_cannot_change_its_reply(tmp_path, monkeypatch):
    """A generator's `finally`, collected just after the guarded call, wrote torch.softmax's answer into the
    returned tensor before the worker sent it (red team round 12: online_softmax 88 of 90). The worker keeps the
    collector off, and the call's objects alive, from the call's end until its reply is encoded. The scan is off
    here (it flags gc.set_threshold), so the worker's own defence is what is tested."""
    with sandboxed_module(tmp_path, "late", LATE_WRITE, ["torch.softmax"], monkeypatch) as mod:
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        for _ in range(3):
            assert torch.equal(mod.forward(x), x * 2), "the reply changed after the call: code ran outside the guard"


PROPERTY = """\
import torch


class Box:
    def __init__(self, x):
        self.x = x

    @property
    def answer(self):  # runs when the tests read box.answer: in the worker, as the student's code
        return torch.softmax(self.x, -1)


def make(x):
    return Box(x)
"""


def test_reading_a_property_of_the_students_object_runs_under_the_rules(tmp_path):
    """An attribute read of a remote object runs the student's descriptor in the worker: under the same guard as
    a call, or a property would be a way around it (round 13's lead)."""
    with sandboxed_module(tmp_path, "prop", PROPERTY, ["torch.softmax"]) as mod:
        box = mod.make(torch.ones(2, 3))
        with pytest.raises(Exception, match="must not call torch.softmax"):
            box.answer
        assert torch.equal(box.x, torch.ones(2, 3)), "a plain attribute still reads"


def test_a_students_exception_is_described_without_running_its_code():
    """The worker describes an exception after the call, where no probe watches: a __str__ or __repr__ of the
    student's never runs there; the message comes from its plain arguments."""
    from grader.harness.worker import _plain_text

    ran = []

    class Loud(ValueError):
        __module__ = "torch"  # a class body may claim any module: the code's own file is what is checked

        def __str__(self):
            ran.append("str")
            return "computed"

    class Arg:
        def __repr__(self):
            ran.append("repr")
            return "arg"

    assert _plain_text(Loud("expected a 2-D tensor", 3)) == "expected a 2-D tensor, 3"
    assert _plain_text(ValueError(Arg())) == "<Arg>"
    assert not ran, f"the student's code ran while the worker described its exception: {ran}"
    assert _plain_text(ValueError("a plain message")) == "a plain message"


SWAP_SOCKET = """\
import os
import socket
import stat

KEEP = []


def forward(x):
    a, b = socket.socketpair()
    for fd in range(3, 256):  # the worker's socket to the grader is a descriptor number like any other
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode) and fd not in (a.fileno(), b.fileno()):
            os.dup2(a.fileno(), fd)  # the worker's reply would go to this socketpair, to be rewritten
    KEEP.append((a, b))
    return x * 2
"""


def test_a_socket_put_on_the_workers_descriptor_gets_no_reply(tmp_path, monkeypatch):
    """Code of the student's could dup2 another socket onto the worker's descriptor and read (and rewrite) the
    replies there (round 13's lead). The worker checks before every send that its descriptor is still the socket it
    was handed; if not, it sends nothing and stops, and the call fails as the student's crash."""
    with sandboxed_module(tmp_path, "swap_socket", SWAP_SOCKET, ["torch.softmax"], monkeypatch) as mod:
        with pytest.raises(Exception) as caught:
            mod.forward(torch.ones(3))
        assert type(caught.value).__name__ == "StudentCrash" and "socket descriptor was replaced" in str(caught.value), (
            f"expected the worker to stop at once and say why, found {type(caught.value).__name__}: {caught.value}")


def test_a_read_inside_a_callback_counts_even_of_the_object_being_read():
    """Nested reads of one tensor count once (numpy.asarray calls __array__, which calls numpy()): but in
    apply_'s callback the student's own code runs, and swapping `box.data` made `box.tolist()` read a
    whole tensor for one counted element (red team round 15: moe_router and gptq loops went uncounted)."""
    host_reads.install_host_read_watch()
    x = torch.arange(1000.0)

    def values(t):
        box = torch.zeros(1)
        keep, out = box.data, []

        def grab(v):
            box.data = t
            out.append(box.tolist())
            box.data = keep
            return v

        box.apply_(grab)
        return out[0]

    with host_reads.reads_counted() as counter:
        got = values(x)
    assert got == x.tolist() and counter.reads >= 1000, f"1000 elements read back, {counter.reads} counted"


def test_a_watched_route_takes_none_of_its_settings_from_the_caller():
    host_reads.install_host_read_watch()
    view = torch.arange(64.0)[:1]  # numpy() of a one-element view reaches the whole storage through strides
    for route in (torch.Tensor.numpy, torch.Tensor.tolist):
        assert not route.__kwdefaults__ and not route.__defaults__, (
            f"{route.__name__}'s wrapper holds settings a call could override (or read the unwatched method from)")
    with host_reads.reads_counted() as counter:
        with pytest.raises(TypeError):
            view.numpy(_whole=False)
    assert counter.reads >= 64, counter.reads


def test_reads_are_counted_in_bytes_too_so_packing_hides_nothing():
    """Values packed several to an element read few elements but all their bytes: the read-back allowance of a
    counted call is in bytes (grader.structure.READ_ALLOWANCE), so eight int8 ids viewed as one int64 and read
    back with .tolist() count what they carry."""
    host_reads.install_host_read_watch()
    ids = torch.randint(0, 8, (960,), dtype=torch.int8)
    with host_reads.reads_counted() as counter:
        packed = ids.view(torch.int64).tolist()
    assert len(packed) == 120
    assert (counter.reads, counter.read_bytes) == (120, 960), (counter.reads, counter.read_bytes)
    with host_reads.reads_counted() as counter:
        ids[:1].numpy()  # a one-element view exposes its whole storage
    assert counter.read_bytes >= 960, counter.read_bytes
