"""Known-wrong activation_checkpointing submissions: the mistakes students make, each as an edit of the reference.

The signature is the bytes saved for backward: `saves` sees every tensor autograd packs during checkpoint's forward
(only the inputs may be there) and counts fn's calls, and `measured` tracks the live saved bytes of a 12-layer stack
run under the student's plan against the plan's predicted peak. The textbook checkpoint calls fn and returns its
outputs: the right values and gradients, with everything saved, so it keeps `grads` and `rng` and loses those two
(and `selective`, whose "core" then saves the s x s scores, and the public test that counts the calls).

The CUDA checks (`grader gpu-check` proves these losses on a GPU; a CPU host leaves them not graded): `cuda_memory`
sees what keeps activations (textbook, forward_with_grad), a plan over the budget (forgets_recompute_spike) and what
cannot run the stack (inputs_not_detached, library_checkpoint); `cuda_overhead` refuses to time a checkpoint whose
saved bytes are not the plan's (textbook, forward_with_grad), and its checked rep's weight gradients catch
grad_wrt_inputs_only.
"""

from tests.known_wrong import Mutant

_NO_GRAD = "        with torch.no_grad():  # autograd.Function.forward already runs without grad; say so\n"
_BACKWARD = (
    "            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])\n"
    "        grads = [a.grad if isinstance(a, torch.Tensor) else None for a in args]\n"
)
_SPIKE_CHECK = (
    "                    if ck and held + seg_a > budget:  # the recompute spike must fit\n"
    "                        continue\n"
)
_PLANNER_START = '''    costs = _costs(costs)
    n = len(costs)
    if n == 0:
        raise ValueError("costs must hold at least one layer")
'''
_GREEDY = _PLANNER_START + '''    plan = [(i, i + 1, False) for i in range(n)]
    for i in sorted(range(n), key=lambda i: -costs[i].a):  # checkpoint the largest layers first
        if peak_bytes(plan, costs) <= budget:
            break
        plan[i] = (i, i + 1, True)
    if peak_bytes(plan, costs) > budget:
        raise ValueError(f"no plan fits a budget of {budget} bytes")
    merged = [plan[0]]
    for seg in plan[1:]:
        if not seg[2] and not merged[-1][2]:
            merged[-1] = (merged[-1][0], seg[1], False)
        else:
            merged.append(seg)
    return merged
'''

MUTANTS = [
    Mutant(
        name="textbook",
        why="my checkpoint just calls fn: the values and gradients are right, and nothing is recomputed",
        cause=r"no_grad",
        edits=[("    return CheckpointFunction.apply(fn, *args)\n", "    return fn(*args)\n")],
        loses=["checkpoint_public", "saves", "measured", "selective", "cuda_memory", "cuda_overhead"],
        keeps=["grads", "rng", "cost_model", "optimal", "sqrt", "planner_public"],
    ),
    Mutant(
        name="forward_with_grad",
        why="I run fn with grad enabled in forward (to be safe), so it saves everything; backward still recomputes",
        cause=r"no_grad",
        edits=[(_NO_GRAD, "        with torch.enable_grad():\n")],
        loses=["checkpoint_public", "saves", "measured", "selective", "cuda_memory", "cuda_overhead"],
        keeps=["grads", "rng", "cost_model", "optimal", "sqrt"],
    ),
    Mutant(
        name="no_rng_restore",
        why="my checkpoint never touches the RNG: the recompute's dropout draws fresh masks, and more numbers",
        cause=r"RNG",
        edits=[("        torch.set_rng_state(ctx.rng_state)\n", ""), ("            torch.set_rng_state(rng_now)\n", "            pass\n")],
        loses=["grads", "rng"],
        keeps=["checkpoint_public", "saves", "cost_model", "optimal", "sqrt", "measured"],
    ),
    Mutant(
        name="rng_not_put_back",
        why="I restore the forward's RNG state for the recompute but never put back the state backward found",
        cause=r"put back",
        edits=[("            torch.set_rng_state(rng_now)\n", "            pass\n")],
        loses=["rng"],
        keeps=["checkpoint_public", "grads", "saves", "measured", "selective"],
    ),
    Mutant(
        name="grad_wrt_inputs_only",
        why="my backward takes torch.autograd.grad(outputs, inputs): the parameters inside fn never get .grad",
        cause=r"no \.grad",
        edits=[(_BACKWARD,
                "            wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]\n"
                "            got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],\n"
                "                                           allow_unused=True))\n"
                "            grads = [next(got) if isinstance(a, torch.Tensor) and a.requires_grad else None\n"
                "                     for a in args]\n"
                "        else:\n"
                "            grads = [None for a in args]\n")],
        loses=["checkpoint_public", "grads", "cuda_overhead"],
        keeps=["saves", "rng", "selective", "measured"],
    ),
    Mutant(
        name="inputs_not_detached",
        why="my recompute runs on the saved inputs themselves, not detached copies, so the earlier graph gets "
            "their gradient a second time",
        cause=r"detach the saved inputs",
        edits=[("            args[i] = t.detach().requires_grad_(t.requires_grad)  # a fresh leaf: the earlier graph is "
                "not ours\n", "            args[i] = t\n")],
        loses=["grads", "cuda_memory", "cuda_overhead"],
        keeps=["cost_model", "optimal", "sqrt"],
    ),
    Mutant(
        name="forgets_recompute_spike",
        why="my peak counts only what the forward leaves held, not the recompute of a checkpointed segment",
        cause=r"recompute spike",
        edits=[("            peak = max(peak, held + sum(c.a for c in costs[start:stop]))\n", "            pass\n"),
               (_SPIKE_CHECK, ""),
               ("                    s = max(spike, held + seg_a) if ck else spike\n", "                    s = spike\n")],
        loses=["planner_public", "cost_model", "optimal", "measured", "cuda_memory"],
        keeps=["grads", "saves", "rng", "selective"],
    ),
    Mutant(
        name="greedy_planner",
        why="my planner checkpoints the largest layers, one at a time, until the plan fits the budget",
        cause=r"FLOPs",
        edits=[(_PLANNER_START, _GREEDY)],
        loses=["planner_public", "optimal"],
        keeps=["cost_model", "grads", "saves", "sqrt", "selective"],
    ),
    Mutant(
        name="library_checkpoint",
        why="I used torch.utils.checkpoint, bound at import",
        cause=r"torch\.utils\.checkpoint",
        edits=[("import torch.nn.functional as F\n",
                "import torch.nn.functional as F\nfrom torch.utils.checkpoint import checkpoint as _library\n"),
               ("    return CheckpointFunction.apply(fn, *args)\n", "    return _library(fn, *args, use_reentrant=False)\n")],
        loses=["checkpoint_public", "grads", "saves", "rng", "measured", "selective", "cuda_memory", "cuda_overhead"],
        keeps=["cost_model", "optimal", "sqrt"],
    ),
]
