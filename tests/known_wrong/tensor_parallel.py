"""Known-wrong tensor_parallel submissions: the mistakes students make, each as an edit of the reference.

The signature is the communication pattern (`communication`) and, under SP, the size of what autograd keeps
(`activation_memory`). The textbook submission composes the SP column layer from gather_from_sp and a plain matmul: the
values and gradients are right, but autograd keeps the gathered [s, b, h] input and the backward has no second
all-gather, so it loses those two checks and keeps every value check.
"""

from tests.known_wrong import Mutant

_SHARD_NAMES = '_ON_THE_SHARD = ("ln_w", "ln_b", "b2", "ln1_w", "ln1_b", "ln2_w", "ln2_b", "b_o")\n'
_SP_COLUMN = "        return _SPColumnLinear.apply(x, w, b, comm)\n"

MUTANTS = [
    Mutant(
        name="textbook_gathered_input_saved",
        why="I wrote the SP column layer as gather_from_sp(x) @ w.T: autograd keeps the gathered full-sequence input",
        cause=r"as big as a whole|expected an all-gather|must run exactly",
        edits=[(_SP_COLUMN, "        y = gather_from_sp(x, comm) @ w.T\n        return y if b is None else y + b\n")],
        loses=["communication", "activation_memory"],
        keeps=["conjugates", "column_row", "mlp", "sequence_parallel", "distributed", "mlp_public", "sp_public"],
    ),
    Mutant(
        name="f_identity_backward",
        why="f's backward returns the gradient unchanged: x's gradient misses the other ranks' parts",
        cause=r"f's backward all-reduces|f's reduction|must all-reduce",
        edits=[("        return ctx.comm.all_reduce(grad), None\n", "        return grad, None\n")],
        loses=["conjugates_public", "conjugates", "mlp", "sequence_parallel"],
    ),
    Mutant(
        name="g_reduces_backward",
        why="g all-reduces in both directions: upstream gradients are t times too big",
        cause=r"g.s backward is the identity|t times too big|passes the gradient unchanged backward",
        edits=[("    @staticmethod\n    def backward(ctx, grad):\n        return grad, None\n",
                "    @staticmethod\n    def backward(ctx, grad):\n        return ctx.comm.all_reduce(grad), None\n"),
               ("    def forward(ctx, x, comm):\n        return comm.all_reduce(x)\n",
                "    def forward(ctx, x, comm):\n        ctx.comm = comm\n        return comm.all_reduce(x)\n")],
        loses=["conjugates_public", "conjugates", "mlp", "communication"],
    ),
    Mutant(
        name="f_reduces_forward",
        why="f and g swapped: f all-reduces in forward",
        cause=r"f's reduction belongs to the backward|f is the identity",
        edits=[("        ctx.comm = comm\n        return x.view_as(x)\n",
                "        ctx.comm = comm\n        return comm.all_reduce(x)\n")],
        loses=["conjugates_public", "conjugates", "mlp"],
    ),
    Mutant(
        name="row_bias_every_rank",
        why="the row-parallel bias is added before the all-reduce, so it is counted t times",
        cause=r"bias once|counted t times",
        edits=[("    partial = x @ w.T\n", "    partial = x @ w.T if b is None else x @ w.T + b\n"),
               ("    y = reduce_scatter_to_sp(partial, comm) if sequence_parallel else reduce_from_tp(partial, comm)\n"
                "    return y if b is None else y + b\n",
                "    return reduce_scatter_to_sp(partial, comm) if sequence_parallel else reduce_from_tp(partial, comm)\n")],
        loses=["mlp_public", "column_row", "mlp"],
    ),
    Mutant(
        name="fused_contiguous_split",
        why="the fused weight (SwiGLU's gate and up) is cut into t contiguous blocks, ignoring the stride",
        cause=r"stride",
        edits=[("        w = torch.cat([m.chunk(t, dim=0)[r] for m in weight.chunk(stride, dim=0)])\n"
                "        b = None if bias is None else torch.cat([m.chunk(t)[r] for m in bias.chunk(stride)])\n",
                "        w = weight.chunk(t, dim=0)[r]\n"
                "        b = None if bias is None else bias.chunk(t)[r]\n")],
        loses=["column_row", "mlp"],
    ),
    Mutant(
        name="sp_forgot_norm_allreduce",
        why="under SP the norm's gradients stay partial: finalize_grads does nothing",
        cause=r"finalize_grads",
        edits=[("                out[name] = comm.all_reduce(grads[name])\n", "                out[name] = grads[name]\n")],
        loses=["sequence_parallel"],
        keeps=["mlp", "conjugates", "column_row"],
    ),
    Mutant(
        name="sp_row_bias_grad_partial",
        why="under SP finalize_grads sums the norm's gradients but not the row layer's bias, added to the shard",
        cause=r"b2",
        edits=[(_SHARD_NAMES, '_ON_THE_SHARD = ("ln_w", "ln_b", "ln1_w", "ln1_b", "ln2_w", "ln2_b")\n')],
        loses=["sequence_parallel", "communication"],
        keeps=["mlp", "conjugates", "column_row", "activation_memory", "sp_public"],
    ),
    Mutant(
        name="sp_allreduce_then_split",
        why="reduce_scatter_to_sp as an all-reduce then a local slice: right values, twice the traffic",
        cause=r"all-reduce then a slice|must run exactly",
        edits=[("        return comm.reduce_scatter(x, 0)\n",
                "        return comm.all_reduce(x).chunk(comm.world_size)[comm.rank].clone()\n")],
        loses=["communication"],
        keeps=["mlp", "sequence_parallel", "column_row"],
    ),
    Mutant(
        name="ln_on_full_sequence",
        why="under SP I gathered the sequence before the norm, ran the norm on all of it, then kept my rows",
        cause=r"before the norm|as big as a whole|must run exactly",
        edits=[("    y = F.layer_norm(x, x.shape[-1:], params[\"ln_w\"], params[\"ln_b\"], eps=1e-5)\n",
                "    if sequence_parallel:\n"
                "        full = gather_from_sp(x, comm)\n"
                "        y = F.layer_norm(full, full.shape[-1:], params[\"ln_w\"], params[\"ln_b\"], eps=1e-5)\n"
                "        y = y.chunk(comm.world_size)[comm.rank]\n"
                "    else:\n"
                "        y = F.layer_norm(x, x.shape[-1:], params[\"ln_w\"], params[\"ln_b\"], eps=1e-5)\n")],
        loses=["communication", "activation_memory"],
        keeps=["sequence_parallel", "mlp"],
    ),
]

# Attention (tp_attention, shard_attention): heads as the column split.
_LOOP_ATTENTION = '''def _local_attention(q, k, v, causal: bool):
    """The textbook: one head at a time."""
    group = q.shape[2] // k.shape[2]
    nq, nk = q.shape[0], k.shape[0]
    outs = []
    for j in range(q.shape[2]):
        qj, kj, vj = q[:, :, j].transpose(0, 1), k[:, :, j // group].transpose(0, 1), v[:, :, j // group].transpose(0, 1)
        scores = qj @ kj.transpose(-1, -2) / q.shape[-1] ** 0.5
        if causal:
            allowed = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
            scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append((torch.softmax(scores, dim=-1) @ vj).transpose(0, 1))
    return torch.cat(outs, dim=-1)


def _unused_local_attention(q, k, v, causal: bool):
'''

MUTANTS += [
    Mutant(
        name="textbook_attention_head_loop",
        why="I looped over the heads in attention, one matmul per head: right values, one operator chain per head",
        cause=r"grows with the query heads|query heads",
        edits=[("def _local_attention(q, k, v, causal: bool):\n", _LOOP_ATTENTION)],
        loses=["no_head_loop"],
        keeps=["attention_public", "attention", "communication", "mlp", "sequence_parallel", "column_row", "conjugates"],
    ),
    Mutant(
        name="gqa_qkv_equal_thirds",
        why="I cut the fused QKV weight into three equal thirds before sharding: right for MHA, wrong under GQA",
        cause=r"unequal widths|widths differ",
        edits=[('    out["w_qkv"] = torch.cat([m.chunk(t, dim=0)[r] for m in params["w_qkv"].split(widths, dim=0)]).clone()\n',
                '    out["w_qkv"] = torch.cat([m.chunk(t, dim=0)[r] for m in params["w_qkv"].chunk(3, dim=0)]).clone()\n'),
               ('        out["b_qkv"] = torch.cat([m.chunk(t)[r] for m in params["b_qkv"].split(widths)]).clone()\n',
                '        out["b_qkv"] = torch.cat([m.chunk(t)[r] for m in params["b_qkv"].chunk(3)]).clone()\n')],
        loses=["attention_public", "attention"],
        keeps=["communication", "no_head_loop", "mlp", "column_row"],
    ),
    Mutant(
        name="qkv_plain_split",
        why="I sharded the fused QKV weight as one matrix, rank r taking its r-th contiguous block of rows",
        cause=r"block r of each",
        edits=[('    out["w_qkv"] = torch.cat([m.chunk(t, dim=0)[r] for m in params["w_qkv"].split(widths, dim=0)]).clone()\n',
                '    out["w_qkv"] = params["w_qkv"].chunk(t, dim=0)[r].clone()\n'),
               ('        out["b_qkv"] = torch.cat([m.chunk(t)[r] for m in params["b_qkv"].split(widths)]).clone()\n',
                '        out["b_qkv"] = params["b_qkv"].chunk(t)[r].clone()\n')],
        loses=["attention_public", "attention"],
        keeps=["communication", "no_head_loop", "mlp", "column_row"],
    ),
    Mutant(
        name="attention_missing_allreduce",
        why="after attention I multiplied by my w_o shard and added b_o, with no all-reduce: a partial sum",
        cause=r"must run exactly|summed over the ranks|all-reduce its partial",
        edits=[('    return row_parallel_linear(o, params["w_o"], params.get("b_o"), comm, sequence_parallel)\n',
                '    return o @ params["w_o"].T + params["b_o"]\n')],
        loses=["attention_public", "attention", "communication", "sequence_parallel"],  # tp_block uses attention
        keeps=["no_head_loop", "mlp", "column_row"],
    ),
    Mutant(
        name="attention_causal_top_left",
        why="my causal mask is top-left (key j <= query i), as scaled_dot_product_attention's is_causal",
        cause=r"bottom-right",
        edits=[("        allowed = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)\n",
                "        allowed = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(0)\n")],
        loses=["attention"],
        keeps=["attention_public", "communication", "no_head_loop", "mlp"],
    ),
]

MUTANTS += [
    Mutant(
        name="block_finalize_mlp_names_only",
        why="finalize_grads sums ln_w, ln_b and b2 only: in a whole layer under SP, ln1, ln2 and b_o stay partial",
        cause=r"finalize_grads",
        edits=[(_SHARD_NAMES, '_ON_THE_SHARD = ("ln_w", "ln_b", "b2")\n')],
        loses=["sequence_parallel", "communication"],
        keeps=["mlp", "attention", "attention_public", "sp_public", "activation_memory", "no_head_loop"],
    ),
]
