"""The forbidden-call guard (grader/harness/probes.py): every way to reach a forbidden operation is
caught, honest code is left alone, and the guard leaves nothing behind.

Each "form" below is captured the way a student module would capture it at import time (before the
guard is entered), which is what defeated the attribute patches alone.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader.harness import probes
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
            with probes.forbidden(SOFTMAX_NAMES, "write it yourself"):
                SOFTMAX_FORMS[form]()
        return
    with pytest.raises(probes.ForbiddenCall, match="must not call torch") as caught:
        with probes.forbidden(SOFTMAX_NAMES, "write it yourself"):
            SOFTMAX_FORMS[form]()
    assert "write it yourself" in str(caught.value), f"the message should carry the exercise's reason: {caught.value}"


@pytest.mark.parametrize("form", ATTENTION_FORMS, ids=list(ATTENTION_FORMS))
def test_every_form_of_attention_is_caught(form):
    with pytest.raises(probes.ForbiddenCall, match="must not call torch"):
        with probes.forbidden(ATTENTION_NAMES):
            ATTENTION_FORMS[form]()


def test_the_message_names_the_operator_and_the_public_name():
    with pytest.raises(probes.ForbiddenCall) as caught:
        with probes.forbidden(["torch.softmax"], "compute the normaliser yourself"):
            _alias(X, -1)
    message = str(caught.value)
    assert "must not call torch.softmax: compute the normaliser yourself" in message
    assert "aten::_softmax" in message and "an alias, a method, torch.ops" in message, message


def test_only_sdpa_forbidden_leaves_torch_softmax_alone():
    with probes.forbidden(["torch.nn.functional.scaled_dot_product_attention"]):
        out = _alias(X, -1)  # an attention exercise that forbids only sdpa may still use a softmax
    assert torch.allclose(out.sum(-1), torch.ones(3))


def test_honest_code_runs_unchanged_under_the_guard():
    def honest(x):
        m = x.amax(-1, keepdim=True)
        e = torch.exp(x - m)
        return e / e.sum(-1, keepdim=True)

    with probes.forbidden(SOFTMAX_NAMES):
        out = honest(X)
        grad_x = X.clone().requires_grad_()
        honest(grad_x).pow(2).sum().backward()
    assert torch.allclose(out, torch.softmax(X, -1)), "the guard must not change results"
    assert grad_x.grad is not None and grad_x.grad.shape == X.shape


def test_the_guard_leaves_nothing_behind():
    depth, start, softmax = torch._C._len_torch_dispatch_stack(), threading.Thread.start, torch.softmax
    with pytest.raises(probes.ForbiddenCall):
        with probes.forbidden(SOFTMAX_NAMES):
            _alias(X, -1)
    assert torch._C._len_torch_dispatch_stack() == depth, "the dispatch mode stack must be as before"
    assert threading.Thread.start is start and torch.softmax is softmax
    assert "softmax" not in vars(torch.Tensor), "Tensor.softmax is inherited: nothing may be left in its __dict__"
    assert torch.allclose(_alias(X, -1).sum(-1), torch.ones(3)), "softmax works again after the call"


def test_names_outside_the_table_are_patched_but_not_watched():
    assert probes.banned_operators(["torch.exp"]) == {}
    with probes.forbidden(["torch.exp"]):
        with pytest.raises(probes.ForbiddenCall, match="must not call torch.exp"):
            torch.exp(X)
        assert torch._C._len_torch_dispatch_stack() == 0, "no operator guard for a name without operators"


def test_threads_the_call_starts_are_guarded():
    errors: list[BaseException] = []

    def rank():
        try:
            _alias(X, -1)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    with probes.forbidden(["torch.softmax"]):
        thread = threading.Thread(target=rank)
        thread.start()
        thread.join()
    assert len(errors) == 1 and isinstance(errors[0], probes.ForbiddenCall), (
        f"a thread started during the call must run under the guard too, found {errors!r}"
    )


def test_a_custom_operator_is_refused():
    @torch.library.custom_op("probes_test::hidden_softmax", mutates_args=())
    def hidden_softmax(x: torch.Tensor) -> torch.Tensor:
        return _alias(x, -1)  # runs below the guard, where it cannot be seen: hence the refusal

    with pytest.raises(probes.ForbiddenCall, match="probes_test::hidden_softmax, which is not one of torch's own"):
        with probes.forbidden(["torch.softmax"]):
            hidden_softmax(X)


def test_popping_the_guard_is_reported():
    from torch.utils._python_dispatch import _pop_mode

    with pytest.raises(probes.GuardRemoved, match="removed or covered during the call"):
        with probes.forbidden(["torch.softmax"]):
            _pop_mode()
    assert torch._C._len_torch_dispatch_stack() == 0


def test_disabling_the_modes_evades_the_in_process_guard():
    """The limit the trusted scan exists for: code in the same process can switch the guard off
    (tests/test_tamper.py proves the scan flags this very construct)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with probes.forbidden(["torch.softmax"]):
        with _disable_current_modes():
            out = _alias(X, -1)
    assert out.shape == X.shape


# --------------------------------------------------------------------------------------------------
# The table itself


def _registered_operators() -> set[str]:
    import torch.distributed  # noqa: F401 - registers the c10d operators
    import torch.distributed._functional_collectives  # noqa: F401 - and the functional ones

    names = {name.split(".")[0] for name in torch._C._dispatch_get_all_op_names()}  # "aten::_softmax.out"
    return {name for name in names if name.partition("::")[0] in probes.TORCH_NAMESPACES}


def test_every_operator_in_the_table_exists():
    registered = _registered_operators()
    families = {f for families in probes.FORBIDDEN_OPS.values() for f in families}
    missing = sorted(op for f in families for op in f.ops if op not in registered)
    assert not missing, f"operators in the table that torch {torch.__version__} does not register: {missing}"


def test_every_softmax_attention_and_collective_operator_is_in_a_family():
    """A new torch that adds, say, aten::_softmax_v2 must be noticed here, not by a student."""
    covered = {op for families in probes.FORBIDDEN_OPS.values() for f in families for op in f.ops}
    not_collectives = {"barrier", "monitored_barrier_", "send", "recv_", "recv_any_source_", "isend", "irecv",
                       "wait_tensor", "batch_p2p_ops", "check_for_nan", "_wrap_tensor_autograd"}
    wanted = set()
    for op in _registered_operators():
        namespace, _, name = op.partition("::")
        if namespace in ("c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional"):
            if name not in not_collectives:
                wanted.add(op)
        elif any(word in name for word in ("softmax", "logsumexp", "attention", "transformer_encoder")):
            wanted.add(op)
    wanted -= {"aten::_fused_sdp_choice"}  # chooses a kernel, computes nothing
    assert not wanted - covered, f"operators no family covers: {sorted(wanted - covered)}"


def _course_forbid_names() -> set[str]:
    """Every string in a `forbid=[...]` of the course's tests, plus the ring's collectives."""
    from grader.support.ring_allreduce import forbidden_collectives

    names = set(forbidden_collectives())
    for path in [*ROOT.glob("exercises/*/test_public.py"), *ROOT.glob("grader/hidden/*/test_*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "forbid" and isinstance(node.value, (ast.List, ast.Tuple)):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return names


def test_every_name_the_course_forbids_has_operators():
    names = _course_forbid_names()
    assert "torch.softmax" in names and "torch.distributed.all_reduce" in names, sorted(names)
    unwatched = sorted(n for n in names if n not in probes.FORBIDDEN_OPS)
    assert not unwatched, f"forbidden names with no operator guard (add them to probes.FORBIDDEN_OPS): {unwatched}"


_COLLECTIVES_SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from grader.harness import probes
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
            with probes.forbidden(forbidden_collectives(), "build it from send_recv"):
                form()
            print("MISSED", name)
        except probes.ForbiddenCall:
            print("CAUGHT", name)
    with probes.forbidden(forbidden_collectives()):
        dist.barrier()  # not a collective the exercise forbids
    print("BARRIER OK")
    dist.destroy_process_group()

    import os
    softmax = torch.softmax
    with probes.forbidden(["torch.softmax"]):
        pid = os.fork()  # as run_distributed starts its ranks: the child inherits the guard
        if pid == 0:
            try:
                softmax(t, 0)
                os._exit(3)
            except probes.ForbiddenCall:
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
