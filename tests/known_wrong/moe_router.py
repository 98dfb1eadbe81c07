"""Known-wrong MoE router submissions: the mistakes students make, each as an edit of the reference."""

from tests.known_wrong import Mutant

MUTANTS = [
    Mutant(
        name="textbook_dense_experts",
        why="runs every expert on every token and keeps each token's kept choices afterwards (a dense MoE): the "
            "same numbers, E x T expert rows where the technique computes E x capacity",
        edits=[("    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    expert_out = torch.stack([expert(buffers[e]) for e, expert in enumerate(experts)])  # a loop over experts\n"
                "    return combine(expert_out, routing), routing\n",
                "    dense = torch.stack([expert(x) for expert in experts])  # [E, T, d]: every expert on every token\n"
                "    rows = dense[routing.expert_index, torch.arange(num_tokens)[:, None]]  # [T, k, d]\n"
                "    rows = torch.where((routing.slot >= 0)[..., None], rows, torch.zeros_like(rows))  # dropped: nothing\n"
                "    return (routing.combine_weight[..., None] * rows).sum(1), routing\n")],
        loses=["sparse_experts"],
        keeps=["layer_public", "layer", "dispatch_public", "dispatch_combine", "drops", "vectorised"],
        cause=r"every expert on every token",
    ),
    Mutant(
        name="textbook_one_hot_dispatch",
        why="dispatches and combines through a one-hot [T, E, capacity] tensor and einsum (GShard's formulation): "
            "the same numbers, k * T^2 * capacity_factor elements where the assignments are k * T rows",
        edits=[("def dispatch(x: torch.Tensor, routing: Routing, capacity: int) -> torch.Tensor:\n",
                "def _one_hot(routing: Routing, capacity: int) -> torch.Tensor:\n"
                "    \"\"\"[T, E, capacity]: 1 where token t's kept choice sits in (expert e, slot s).\"\"\"\n"
                "    num_experts = routing.tokens_per_expert.shape[0]\n"
                "    mask = torch.zeros(routing.slot.shape[0], num_experts, capacity)\n"
                "    for j in range(routing.slot.shape[1]):  # a loop over k\n"
                "        kept = (routing.slot[:, j] >= 0).float()[:, None, None]\n"
                "        e = torch.nn.functional.one_hot(routing.expert_index[:, j], num_experts).float()\n"
                "        s = torch.nn.functional.one_hot(routing.slot[:, j].clamp(min=0), capacity).float()\n"
                "        mask = mask + kept * e[:, :, None] * s[:, None, :]\n"
                "    return mask\n"
                "\n\n"
                "def dispatch(x: torch.Tensor, routing: Routing, capacity: int) -> torch.Tensor:\n"
                "    if capacity == 0:  # no slot: nothing to one-hot\n"
                "        return _dispatch_by_index(x, routing, capacity)\n"
                "    return torch.einsum('tec,td->ecd', _one_hot(routing, capacity).to(x.dtype), x)\n"
                "\n\n"
                "def _dispatch_by_index(x: torch.Tensor, routing: Routing, capacity: int) -> torch.Tensor:\n"),
               ("    if capacity == 0:  # min_capacity=0 and a tiny factor: every assignment was dropped, there is no row to read\n",
                "    if capacity > 0:\n"
                "        per = torch.zeros(routing.slot.shape[0], num_experts, capacity)  # [T, E, C]: each token's weights\n"
                "        for j in range(routing.slot.shape[1]):  # a loop over k\n"
                "            kept = (routing.slot[:, j] >= 0).float()[:, None, None]\n"
                "            e = torch.nn.functional.one_hot(routing.expert_index[:, j], num_experts).float()\n"
                "            s = torch.nn.functional.one_hot(routing.slot[:, j].clamp(min=0), capacity).float()\n"
                "            per = per + routing.combine_weight[:, j].float()[:, None, None] * kept * e[:, :, None] * s[:, None, :]\n"
                "        used = _one_hot(routing, capacity).sum(0)[..., None] > 0  # unused slots may hold inf: 0 * inf is NaN\n"
                "        clean = torch.where(used, expert_out, torch.zeros_like(expert_out)).float()\n"
                "        return torch.einsum('tec,ecd->td', per, clean).to(expert_out.dtype)\n"
                "    if capacity == 0:  # min_capacity=0 and a tiny factor: every assignment was dropped, there is no row to read\n")],
        loses=["sparse_experts"],
        keeps=["dispatch_public", "dispatch_combine", "layer_public", "layer"],
        cause=r"every expert on every token|one-hot \[T, E, capacity\]",
    ),
    Mutant(
        name="dense_in_a_pre_hook_via_bilinear",
        why="computes every expert on every token inside a forward pre-hook of its own on each expert, each Linear "
            "as torch.nn.functional.bilinear with a ones column (aten._trilinear, for which torch has no FLOP "
            "formula), keeps the rows of each buffer, and calls each expert on its buffer so that the hooks fire. "
            "Red team, issue 36: 95/95 on the CPU while the FLOPs of an op without a formula counted zero and the "
            "traffic inside the experts' calls (hooks included) was left out",
        edits=[("    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    expert_out = torch.stack([expert(buffers[e]) for e, expert in enumerate(experts)])  # a loop over experts\n",
                "    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    token_at = dispatch(torch.arange(num_tokens, dtype=x.dtype)[:, None], routing, capacity)[..., 0].long()\n"
                "    out = [None] * len(experts)\n"
                "\n"
                "    def every_token(e):\n"
                "        def hook(module, args):\n"
                "            rows, ones = x, x.new_ones(num_tokens, 1)\n"
                "            for layer in (module if isinstance(module, nn.Sequential) else [module]):  # each Linear as a bilinear form\n"
                "                if isinstance(layer, nn.Linear):\n"
                "                    rows = torch.nn.functional.bilinear(rows, ones, layer.weight[:, :, None], layer.bias)\n"
                "                else:\n"
                "                    rows = layer(rows)\n"
                "            out[e] = rows[token_at[e]]  # every token computed; the buffer's rows kept\n"
                "        return hook\n"
                "\n"
                "    handles = [expert.register_forward_pre_hook(every_token(e)) for e, expert in enumerate(experts)]\n"
                "    for e, expert in enumerate(experts):  # a loop over experts: each call fires its hook\n"
                "        expert(buffers[e])\n"
                "    for handle in handles:\n"
                "        handle.remove()\n"
                "    expert_out = torch.stack(out)\n")],
        loses=["sparse_experts"],
        keeps=["layer_public", "layer", "dispatch_public", "dispatch_combine", "drops", "vectorised"],
        cause=r"every expert on every token",
    ),
    Mutant(
        name="dense_in_a_forward_hook_via_addbmm",
        why="computes every expert on every token in a forward hook of its own (after each expert's call), each "
            "Linear as torch.addbmm over a batch of one (no FLOP formula in torch's counter), and returns the "
            "buffer's rows from the hook in place of the expert's output",
        edits=[("    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    expert_out = torch.stack([expert(buffers[e]) for e, expert in enumerate(experts)])  # a loop over experts\n",
                "    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    token_at = dispatch(torch.arange(num_tokens, dtype=x.dtype)[:, None], routing, capacity)[..., 0].long()\n"
                "\n"
                "    def every_token(e):\n"
                "        def hook(module, args, output):\n"
                "            rows = x\n"
                "            for layer in (module if isinstance(module, nn.Sequential) else [module]):\n"
                "                if isinstance(layer, nn.Linear):\n"
                "                    rows = torch.addbmm(layer.bias, rows[None], layer.weight.t()[None])\n"
                "                else:\n"
                "                    rows = layer(rows)\n"
                "            return rows[token_at[e]]  # replaces the expert's output\n"
                "        return hook\n"
                "\n"
                "    handles = [expert.register_forward_hook(every_token(e)) for e, expert in enumerate(experts)]\n"
                "    expert_out = torch.stack([expert(buffers[e]) for e, expert in enumerate(experts)])  # a loop over experts\n"
                "    for handle in handles:\n"
                "        handle.remove()\n")],
        loses=["sparse_experts"],
        keeps=["layer_public", "layer", "dispatch_public", "dispatch_combine", "drops", "vectorised"],
        cause=r"every expert on every token",
    ),
    Mutant(
        name="dense_in_a_pre_hook_elementwise",
        why="computes every expert on every token inside a forward pre-hook of its own, each Linear as an "
            "elementwise product summed over the features (no matmul: zero FLOPs by torch's convention, so only "
            "the elements moved can see it); they were left out as the experts' own before the count took in "
            "everything between entering and leaving the call",
        edits=[("    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    expert_out = torch.stack([expert(buffers[e]) for e, expert in enumerate(experts)])  # a loop over experts\n",
                "    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]\n"
                "    token_at = dispatch(torch.arange(num_tokens, dtype=x.dtype)[:, None], routing, capacity)[..., 0].long()\n"
                "    out = [None] * len(experts)\n"
                "\n"
                "    def every_token(e):\n"
                "        def hook(module, args):\n"
                "            rows = x\n"
                "            for layer in (module if isinstance(module, nn.Sequential) else [module]):\n"
                "                if isinstance(layer, nn.Linear):\n"
                "                    rows = (rows[:, None, :] * layer.weight).sum(-1) + layer.bias\n"
                "                else:\n"
                "                    rows = layer(rows)\n"
                "            out[e] = rows[token_at[e]]\n"
                "        return hook\n"
                "\n"
                "    handles = [expert.register_forward_pre_hook(every_token(e)) for e, expert in enumerate(experts)]\n"
                "    for e, expert in enumerate(experts):\n"
                "        expert(buffers[e])\n"
                "    for handle in handles:\n"
                "        handle.remove()\n"
                "    expert_out = torch.stack(out)\n")],
        loses=["sparse_experts"],
        keeps=["layer_public", "layer", "dispatch_public", "dispatch_combine", "drops", "vectorised"],
        cause=r"every expert on every token",
    ),
    Mutant(
        name="capacity_floor",
        why="rounds the capacity down: the last assignments of a fair share find no slot",
        edits=[("math.ceil(k * num_tokens * capacity_factor / num_experts)",
                "math.floor(k * num_tokens * capacity_factor / num_experts)")],
        loses=["probs_public", "capacity", "drops"],
        cause=r"round UP",
    ),
    Mutant(
        name="capacity_without_k",
        why="shares T tokens among the experts instead of the k * T assignments (Switch's top-1 formula kept for top-2)",
        edits=[("math.ceil(k * num_tokens * capacity_factor / num_experts)",
                "math.ceil(num_tokens * capacity_factor / num_experts)")],
        loses=["probs_public", "capacity", "drops"],
        cause=r"k \* T = \d+ assignments|k \* T assignments",
    ),
    Mutant(
        name="token_major_priority",
        why="walks the assignments token by token, so a token's second choice beats later tokens' first choices",
        edits=[("order = torch.arange(num_tokens * k, device=logits.device).view(k, num_tokens).t()  # [T, k]",
                "order = torch.arange(num_tokens * k, device=logits.device).view(num_tokens, k)  # [T, k]")],
        loses=["route_public", "drops", "priority"],
        cause=r"first choices .{0,30}before any second choice",
    ),
    Mutant(
        name="renormalise_after_drop",
        why="renormalises the weights over the kept assignments only, after the capacity drop",
        edits=[("    combine_weight = weight * kept  # dropped -> 0, no renormalisation after the drop\n",
                "    combine_weight = top_p * kept\n"
                "    if renormalize:\n"
                "        combine_weight = combine_weight / combine_weight.sum(-1, keepdim=True).clamp_min(1e-30)\n")],
        loses=["drops", "priority", "layer"],
        cause=r"renormalised over its kept choices only",
    ),
    Mutant(
        name="aux_after_drops",
        why="counts f_e from the kept assignments, so the balancing loss cannot see the overflow it should punish",
        edits=[("    f = wanted.float() / (num_tokens * k)", "    f = tokens_per_expert.float() / (num_tokens * k)")],
        loses=["aux"],
        cause=r"BEFORE capacity drops",
    ),
    Mutant(
        name="topk_tie_order",
        why="takes torch.topk's order among equal probabilities as given (it is unspecified)",
        edits=[("    remaining = probs.detach().clone()\n", "    return torch.topk(probs, k, dim=-1)\n")],
        loses=["route_public", "topk", "drops"],
        cause=r"topk does not promise",
    ),
    Mutant(
        name="loop_over_tokens",
        why="fills the expert buffers with a Python loop over tokens",
        edits=[("    buffers = x.new_zeros(num_experts * capacity, d).index_copy(0, row, x[token[kept]])\n",
                "    buffers = x.new_zeros(num_experts * capacity, d)\n"
                "    for t in range(num_tokens):\n"
                "        for j in range(routing.slot.shape[1]):\n"
                "            if routing.slot[t, j] >= 0:\n"
                "                buffers[routing.expert_index[t, j] * capacity + routing.slot[t, j]] = x[t]\n")],
        loses=["vectorised"],
        cause=r"loops over tokens",
    ),
    Mutant(
        name="running_count_run_by_map",
        why="keeps a running count per expert over the Python list of choices, with map() and itertools.count, "
            "so no line of my file runs per token (the line count stays flat; the values read back grow)",
        edits=[
            ("import math\n", "import collections\nimport itertools\nimport math\nimport operator\nfrom functools import partial\n"),
            ("    grouped, by_expert = torch.sort(sequence, stable=True)\n"
             "    ids = torch.arange(num_experts, device=sequence.device)\n",
             "    counters = collections.defaultdict(itertools.count)\n"
             "    ranks = list(map(next, map(partial(operator.getitem, counters), sequence.tolist())))\n"
             "    return (torch.tensor(ranks, dtype=torch.long, device=sequence.device),\n"
             "            torch.bincount(sequence, minlength=num_experts))\n"
             "    grouped, by_expert = torch.sort(sequence, stable=True)\n"
             "    ids = torch.arange(num_experts, device=sequence.device)\n"),
        ],
        loses=["vectorised_public", "vectorised"],
        cause=r"back into Python",
    ),
    Mutant(
        name="bf16_softmax",
        why="takes the softmax in the logits' own dtype and casts afterwards",
        edits=[("    return torch.softmax(logits.float(), dim=-1)", "    return torch.softmax(logits, dim=-1).float()")],
        loses=["topk"],
        cause=r"fp32 BEFORE the softmax",
    ),
    Mutant(
        name="renormalise_top1",
        why="renormalises for k = 1 too: every weight becomes 1 and the router gets no gradient",
        edits=[("        renormalize = k > 1", "        renormalize = True")],
        loses=["route_public", "topk", "layer"],
        cause=r"k = 1 the weight is the raw router probability",
    ),
    Mutant(
        name="detached_weights",
        why="takes the gate weights off the autograd graph, so the router never learns",
        edits=[("    top_p, expert_index = _top_k(probs, k)  # [T, k] each",
                "    top_p, expert_index = _top_k(probs.detach(), k)  # [T, k] each")],
        loses=["topk", "layer"],
        cause=r"does not require grad",
    ),
    Mutant(
        name="probs_policy_by_weight",
        why="ranks overflowing assignments by the renormalised weight instead of the router probability",
        edits=[("        flat_p = top_p.reshape(-1)", "        flat_p = weight.reshape(-1)")],
        loses=["priority"],
        cause=r"not by the renormalised weight",
    ),
    Mutant(
        name="slot_off_by_one",
        why="counts the assignment itself among those before it (an inclusive running count): buffers start at slot 1 "
            "(a slot decision: it lost topk too until topk judged only the chosen experts and their weights)",
        edits=[("- starts[grouped]\n", "- starts[grouped] + 1\n")],
        loses=["route_public", "capacity", "drops"],
        cause=r"start at 1|fill from slot 0",
    ),
    Mutant(
        name="tokens_per_expert_wanted",
        why="reports how many assignments wanted each expert instead of how many it kept",
        edits=[("    tokens_per_expert = wanted.clamp(max=capacity)", "    tokens_per_expert = wanted")],
        loses=["capacity", "drops"],
        cause=r"tokens_per_expert says \d+, capacity is",
    ),
    Mutant(
        name="combine_reads_dropped_slots",
        why="reads a slot for dropped assignments too and relies on the zero weight (0 * inf is NaN)",
        edits=[("    gathered = torch.where(kept[..., None], gathered, torch.zeros_like(gathered))  # mask, not 0 * weight: 0 * inf is NaN\n",
                "")],
        loses=["dispatch_combine"],
        cause=r"for a dropped one 0",
    ),
    Mutant(
        name="z_loss_not_squared",
        why="forgets the square in the router z-loss",
        edits=[("    z_loss = torch.logsumexp(logits.float(), dim=-1).square().mean()",
                "    z_loss = torch.logsumexp(logits.float(), dim=-1).mean()")],
        loses=["route_public", "aux"],
        cause=r"logsumexp(\(logits\))?\^2",
    ),
    Mutant(
        name="nan_where_weights_are_wrong",
        why="gets the weights of tokens that lost a choice wrong and writes NaN exactly there: `err.max() > tol` is "
            "False for NaN, so the max-error checks passed it (85.3 of 100 before the tests used grader.testing)",
        edits=[("    combine_weight = weight * kept  # dropped -> 0, no renormalisation after the drop\n",
                "    combine_weight = weight * kept  # dropped -> 0, no renormalisation after the drop\n"
                "    lost_one = kept & (~kept).any(dim=-1, keepdim=True)  # kept choices of a token that lost another\n"
                "    combine_weight = torch.where(lost_one, torch.full_like(combine_weight, float('nan')), combine_weight)\n")],
        loses=["drops", "priority", "layer", "vectorised"],
        cause=r"NaN where a finite value is expected",
    ),
    Mutant(
        name="capacity_edge_one_short",
        why="tests for room with the count that includes the assignment itself, so a full expert keeps one "
            "assignment fewer (its only bug is a drop decision: the routing stays valid). Before the drop "
            "decisions were compared first it also lost layer (3 of 9) with a combine_weight message",
        edits=[("    kept = rank < capacity\n",
                "    kept = rank + 1 < capacity  # the count with this assignment must stay below capacity\n"),
               ("    tokens_per_expert = wanted.clamp(max=capacity)  # each expert keeps min(wanted, capacity)",
                "    tokens_per_expert = torch.bincount(expert_index[kept], minlength=num_experts)")],
        loses=["route_public", "capacity", "drops", "priority"],
        cause=r"one assignment fewer than its capacity",
    ),
    Mutant(
        name="probs_ties_to_later_tokens",
        why="sorts the probabilities ascending and flips the order, so among equal probabilities the LATER token "
            "wins a slot under drop_policy='probs' (caught by ties in priority: identical tokens, constant logits)",
        edits=[("by_prob = torch.sort(flat_p, descending=True, stable=True).indices",
                "by_prob = torch.sort(flat_p, stable=True).indices.flip(0)")],
        loses=["priority"],
        cause=r"earlier token",
    ),
    Mutant(
        name="combine_fails_at_capacity_zero",
        why="combine indexes the flat buffer even when capacity is 0 (min_capacity=0, every assignment dropped), "
            "where it has no row at all",
        edits=[("    if capacity == 0:  # min_capacity=0 and a tiny factor: every assignment was dropped, there is no row to read\n"
                "        return expert_out.new_zeros(routing.slot.shape[0], d)\n", "")],
        loses=["dispatch_combine"],
        cause=r"capacity 0",
    ),
    Mutant(
        name="min_capacity_ignored",
        why="route computes the capacity without passing min_capacity on",
        edits=[("    capacity = expert_capacity(num_tokens, num_experts, k, capacity_factor, min_capacity)",
                "    capacity = expert_capacity(num_tokens, num_experts, k, capacity_factor)")],
        loses=["capacity"],
        cause=r"min_capacity=3",
    ),
    # Contract clauses that issue 36 brought into the tests (each clause's table row is in the hidden tests' docstring).
    Mutant(
        name="probs_upcast_half_only",
        why="casts only half-precision logits up to fp32, so fp64 logits give fp64 probabilities, weights and losses",
        edits=[("    return torch.softmax(logits.float(), dim=-1)",
                "    if logits.dtype in (torch.float16, torch.bfloat16):\n"
                "        logits = logits.float()\n"
                "    return torch.softmax(logits, dim=-1)")],
        loses=["topk", "aux"],
        cause=r"fp32 whatever the logits' dtype",
    ),
    Mutant(
        name="tokens_per_expert_int32",
        why="reports the kept counts as int32",
        edits=[("    tokens_per_expert = wanted.clamp(max=capacity)", "    tokens_per_expert = wanted.clamp(max=capacity).int()")],
        loses=["topk"],
        cause=r"'tokens_per_expert': torch\.int32",
    ),
    Mutant(
        name="aux_loss_in_fp64",
        why="counts f_e in fp64, so aux_loss comes back fp64",
        edits=[("    f = wanted.float() / (num_tokens * k)", "    f = wanted.double() / (num_tokens * k)")],
        loses=["aux"],
        cause=r"aux_loss should be a scalar fp32",
    ),
    Mutant(
        name="softmax_without_max_shift",
        why="writes the softmax as exp / sum(exp) without subtracting the row maximum: NaN for logits near 100 or -100",
        edits=[("    return torch.softmax(logits.float(), dim=-1)",
                "    e = logits.float().exp()\n"
                "    return e / e.sum(dim=-1, keepdim=True)")],
        loses=["topk", "aux"],
        cause=r"subtract each row's maximum",
    ),
    Mutant(
        name="z_loss_naive_logsumexp",
        why="computes logsumexp as log(sum(exp(logits))): inf for logits near 100, -inf near -100",
        edits=[("    z_loss = torch.logsumexp(logits.float(), dim=-1).square().mean()",
                "    z_loss = logits.float().exp().sum(dim=-1).log().square().mean()")],
        loses=["aux"],
        cause=r"log\(sum\(exp\(logits\)\)\) overflows",
    ),
    Mutant(
        name="k_checked_against_zero_only",
        why="refuses k = 0 and k > E but lets a negative k through (it then fails inside torch with a RuntimeError)",
        edits=[("    if not 1 <= k <= num_experts:", "    if k == 0 or k > num_experts:")],
        loses=["topk"],
        cause=r"k=-1\b.*expected a ValueError",
    ),
    Mutant(
        name="combine_accumulates_in_bf16",
        why="adds each choice's weighted row to the output in expert_out's dtype, one choice at a time (a loop over k)",
        edits=[("    return (weight * gathered.float()).sum(dim=1).to(expert_out.dtype)",
                "    y = torch.zeros(gathered.shape[0], d, dtype=expert_out.dtype)\n"
                "    for j in range(gathered.shape[1]):\n"
                "        y = y + (weight[:, j] * gathered[:, j].float()).to(expert_out.dtype)\n"
                "    return y")],
        loses=["dispatch_combine"],
        cause=r"accumulate the weighted rows in fp32",
    ),
    Mutant(
        name="layer_combines_token_by_token",
        why="moe_layer sums each token's expert rows in a Python loop over tokens",
        edits=[("    return combine(expert_out, routing), routing\n",
                "    kept = routing.slot >= 0\n"
                "    rows = expert_out[routing.expert_index, routing.slot.clamp(min=0)]  # [T, k, d]\n"
                "    y = torch.stack([(routing.combine_weight[t, :, None] * torch.where(kept[t, :, None], rows[t], 0.0)).sum(0)\n"
                "                     for t in range(num_tokens)])\n"
                "    return y, routing\n")],
        loses=["vectorised"],
        keeps=["layer", "layer_public"],
        cause=r"loops over tokens",
    ),
]
