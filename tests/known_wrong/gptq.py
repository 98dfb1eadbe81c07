"""Known-wrong GPTQ submissions: the bugs students really make, as edits of the reference solution."""

from tests.known_wrong import Mutant

_CHOLESKY = "U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)"
_TAIL = "        W[:, i2:] -= Err1 @ U[i1:i2, i2:]  # the lazy batch: the block's feedback to the rest, at once"
_IN_BLOCK = "            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]  # feedback inside the block, now"

# A textbook submission (the same numbers, the technique skipped) keeps every check of the numbers.
_CORRECTNESS = ["quantizer_public", "hessian_public", "gptq_public", "quantizer", "hessian", "validation", "obq_oracle",
                "diagonal", "block_invariance", "damping_dead", "act_order", "quality"]

MUTANTS = [
    Mutant(
        name="textbook_obq",
        why="I computed each column's feedback row the textbook (OBQ) way: for every column, invert the Hessian of the "
            "columns still to be quantised and scale its first row. Same numbers as the Cholesky factor, no "
            "factorisation done once",
        edits=[(_CHOLESKY, "U = torch.zeros_like(H)\n"
                           "        for k in range(cols):  # the Hessian of the remaining columns, inverted anew\n"
                           "            Hinv = torch.linalg.inv(H[k:, k:])\n"
                           "            U[k, k:] = Hinv[0] / Hinv[0, 0].sqrt()")],
        cause=r"Re-inverting",
        loses=["factor_once", "lazy_batch"],
        keeps=_CORRECTNESS,
    ),
    Mutant(
        name="textbook_obs_downdate",
        why="I kept the inverse of the remaining columns' Hessian up to date instead: after each column I remove it by "
            "the OBS update H_F^-1 - H_F^-1[:, 0] H_F^-1[0, :] / H_F^-1[0, 0], as OBQ does. One inversion, but a "
            "pass over the whole remaining inverse for every column",
        edits=[(_CHOLESKY, "U = torch.zeros_like(H)\n"
                           "        Hinv = torch.cholesky_inverse(torch.linalg.cholesky(H))\n"
                           "        for k in range(cols):  # remove column k from the inverse (OBS), for every column\n"
                           "            U[k, k:] = Hinv[0] / Hinv[0, 0].sqrt()\n"
                           "            Hinv = Hinv[1:, 1:] - torch.outer(Hinv[1:, 0], Hinv[0, 1:]) / Hinv[0, 0]")],
        cause=r"OBS update",
        loses=["factor_once", "lazy_batch"],
        keeps=_CORRECTNESS,
    ),
    Mutant(
        name="lower_cholesky_factor",
        why="I took the lower Cholesky factor of H^-1, so row i of it holds nothing right of the diagonal",
        edits=[(_CHOLESKY, _CHOLESKY.replace("upper=True", "upper=False"))],
        cause=r"UPPER Cholesky factor",
        loses=["gptq_public", "obq_oracle", "block_invariance", "damping_dead", "act_order", "quality", "lazy_batch"],
    ),
    Mutant(
        name="rows_of_the_plain_inverse",
        why="I used the rows of H^-1 itself as the update, without the Cholesky factor that accounts for the columns already done",
        edits=[(_CHOLESKY, "U = torch.cholesky_inverse(torch.linalg.cholesky(H))")],
        cause=r"H\^-1 itself",
        loses=["gptq_public", "obq_oracle", "diagonal", "block_invariance", "damping_dead", "act_order", "quality",
               "lazy_batch"],
    ),
    Mutant(
        name="no_lazy_tail_update",
        why="I updated the columns inside each block but forgot to apply the block's errors to the later columns",
        edits=[(_TAIL, "        pass")],
        cause=r"errors of the earlier blocks",
        loses=["obq_oracle", "block_invariance", "damping_dead", "act_order", "lazy_batch"],
    ),
    Mutant(
        name="eager_updates_no_lazy_batch",
        why="I apply every column's feedback to all later columns right away: correct, but it rewrites most of W per column",
        edits=[
            (_IN_BLOCK, _IN_BLOCK + "\n            W[:, i2:] -= err[:, None] * U[col, i2:][None, :]"),
            (_TAIL, "        pass"),
        ],
        cause=r"every later column after each column",
        loses=["lazy_batch"],
    ),
    Mutant(
        name="eager_updates_in_column_slices",
        why="I apply every column's feedback to all later columns right away, cut into slices of 16 columns so that "
            "no single operation writes much of W (it beat a count of large writes: the total traffic is the same)",
        edits=[
            (_IN_BLOCK, _IN_BLOCK + "\n            for c0 in range(i2, cols, 16):\n"
                        "                W[:, c0 : c0 + 16] -= err[:, None] * U[col, c0 : c0 + 16][None, :]"),
            (_TAIL, "        pass"),
        ],
        cause=r"every later column after each column",
        loses=["lazy_batch"],
    ),
    Mutant(
        name="eager_updates_in_numpy",
        why="I apply every column's feedback to all later columns right away, in numpy on a view of W (no torch "
            "operator runs for it, so a count of torch's memory traffic never sees the eager update)",
        edits=[
            (_IN_BLOCK, _IN_BLOCK + "\n            view = W.numpy()\n"
                        "            view[:, i2:] -= err.numpy()[:, None] * U[col, i2:].numpy()[None, :]"),
            (_TAIL, "        pass"),
        ],
        cause=r"numpy",
        loses=["lazy_batch"],
    ),
    Mutant(
        name="eager_updates_in_row_slices",
        why="The same eager update of all later columns after every column, cut into slices of 32 rows",
        edits=[
            (_IN_BLOCK, _IN_BLOCK + "\n            for r0 in range(0, rows, 32):\n"
                        "                W[r0 : r0 + 32, i2:] -= err[r0 : r0 + 32, None] * U[col, i2:][None, :]"),
            (_TAIL, "        pass"),
        ],
        cause=r"every later column after each column",
        loses=["lazy_batch"],
    ),
    Mutant(
        name="left_looking_per_column",
        why="I never update later columns: each column, right before it is rounded, gathers the errors of all earlier "
            "columns (w = W[:, i] - Err[:, :i] @ U[:i, i]). Few writes, but every column re-reads all earlier errors",
        edits=[
            ("    for i1 in range(0, cols, block_size):\n",
             "    Err = torch.zeros_like(W)\n    for i1 in range(0, cols, block_size):\n"),
            ("            w, d = W1[:, i], U1[i, i]", "            w, d = W[:, col] - Err[:, :col] @ U[:col, col], U1[i, i]"),
            (_IN_BLOCK, "            Err[:, col] = err"),
            (_TAIL, "        pass"),
        ],
        cause=r"re-reading every earlier column's error",
        loses=["lazy_batch"],
    ),
    Mutant(
        name="absolute_damping",
        why="I added percdamp itself to the diagonal instead of percdamp * mean(diag(H))",
        edits=[("H.diagonal().add_(percdamp * torch.diag(H).mean())", "H.diagonal().add_(percdamp)")],
        cause=r"damped by percdamp itself",
        loses=["obq_oracle", "diagonal", "block_invariance", "damping_dead", "act_order"],
    ),
    Mutant(
        name="no_dead_column_fix",
        why="I skipped the dead-column fix: damping keeps H invertible anyway, doesn't it?",
        edits=[("    H[dead, dead] = 1\n    W[:, dead] = 0\n", "")],
        cause=r"dead columns",
        loses=["damping_dead"],
    ),
    Mutant(
        name="grid_fit_before_dead_fix",
        why="I fit the row grids on W before zeroing the dead columns (the order of the reference implementation)",
        edits=[
            ("    dead = torch.diag(H) == 0\n", "    dead = torch.diag(H) == 0\n    if not grouped:\n        scale[:, 0], zero[:, 0] = fit_quantizer(W, bits, sym)\n"),
            ("    if not grouped:  # one grid per row, from the fixed (and permuted) weights\n        scale[:, 0], zero[:, 0] = fit_quantizer(W, bits, sym)\n", ""),
        ],
        cause=r"AFTER zeroing the dead columns",
        loses=["damping_dead"],
    ),
    Mutant(
        name="act_order_not_restored",
        why="I processed the columns in act-order but returned Q in that processing order",
        edits=[("        Q = Q[:, torch.argsort(perm)]", "        pass")],
        cause=r"Q\[:, argsort\(perm\)\]",
        loses=["diagonal", "damping_dead", "act_order"],
    ),
    Mutant(
        name="act_order_ascending",
        why="I sorted diag(H) ascending: the least important columns first",
        edits=[("descending=True, stable=True", "descending=False, stable=True")],
        cause=r"ASCENDING diag\(H\)",
        loses=["damping_dead", "act_order"],
    ),
    Mutant(
        name="static_group_of_the_position",
        why="With act_order and static groups I used the group of the processing position, not of the original column",
        edits=[("group_of = (perm // gs).tolist()", "group_of = (torch.arange(cols) // gs).tolist()")],
        cause=r"group of its PROCESSING position",
        loses=["diagonal", "damping_dead", "act_order"],
    ),
    Mutant(
        name="group_fit_from_stale_weights",
        why="I fit each group from W, which still misses the updates made earlier in the same block (as the reference implementation does)",
        edits=[("current = W1[:, i : end - i1] if end <= i2 else W[:, col:end]", "current = W[:, col:end]")],
        cause=r"same block",
        loses=["obq_oracle", "block_invariance"],
    ),
    Mutant(
        name="zero_not_rounded",
        why="I left the asymmetric zero point as -xmin / scale, not rounded to a whole number",
        edits=[("        zero = torch.round(-xmin / scale)", "        zero = -xmin / scale")],
        cause=r"whole number",
        loses=["quantizer_public", "quantizer", "obq_oracle", "diagonal", "block_invariance", "damping_dead",
               "act_order"],
    ),
    Mutant(
        name="symmetric_only_with_negatives",
        why="Symmetric grids: I set xmin = -xmax only for rows that have a negative value (halving the others' range)",
        edits=[("        xmin = -xmax\n", "        xmin = torch.where(xmin < 0, -xmax, xmin)\n")],
        cause=r"no negative value",
        loses=["quantizer_public", "quantizer"],
    ),
    Mutant(
        name="hessian_not_rescaled",
        why="I added 2/(n + m) x^T x for each batch without rescaling the mean of the earlier batches",
        edits=[("    H.mul_(n / (n + m))\n", "")],
        cause=r"rescal",
        loses=["hessian_public", "hessian"],
    ),
    Mutant(
        name="hessian_counts_calls",
        why="n counts calls, as in the reference implementation's add_batch with a batch of one sequence",
        edits=[("    H.mul_(n / (n + m))\n    n += m\n", "    H.mul_(n / (n + 1))\n    n += 1\n")],
        cause=r"counts? (the )?rows",
        loses=["hessian_public", "hessian"],
    ),
    Mutant(
        name="loss_without_the_half",
        why="I summed (w - q)^2 / d^2 and forgot the factor 1/2",
        edits=[("            losses += err**2 / 2", "            losses += err**2")],
        cause=r"factor 1/2 is missing",
        loses=["gptq_public", "obq_oracle", "diagonal"],
    ),
    Mutant(
        name="no_block_group_check",
        why="I did not check that block_size and group_size divide one another",
        edits=[("    if group_size > 0 and not static_groups and block_size % group_size and group_size % block_size:",
                "    if False:")],
        cause=r"block_size=3 with group_size=4",
        loses=["validation"],
    ),
    Mutant(
        name="nan_scale_where_wrong",
        why="fit_quantizer gets the all-zero rows wrong and reports NaN for their scale (its own quantisation uses "
            "a private grid): `abs(scale - want) > tol` is False for NaN, so the rule check passed it",
        edits=[
            ("def fit_quantizer(w: torch.Tensor, bits: int = 4, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:",
             "def _grid(w: torch.Tensor, bits: int = 4, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:"),
            ("    return scale, zero\n",
             "    return scale, zero\n\n\n"
             "def fit_quantizer(w: torch.Tensor, bits: int = 4, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:\n"
             "    scale, zero = _grid(w, bits, sym)\n"
             "    flat = (w == 0).all(dim=1)  # the rows it does not handle: NaN, where a check cannot see it\n"
             "    return torch.where(flat, torch.full_like(scale, float('nan')), scale), zero\n"),
            ("    fits = [fit_quantizer(Wf[:, s : s + gs], bits, sym)", "    fits = [_grid(Wf[:, s : s + gs], bits, sym)"),
            ("            scale[:, g], zero[:, g] = fit_quantizer(W[:, g * gs : (g + 1) * gs], bits, sym)",
             "            scale[:, g], zero[:, g] = _grid(W[:, g * gs : (g + 1) * gs], bits, sym)"),
            ("        scale[:, 0], zero[:, 0] = fit_quantizer(W, bits, sym)", "        scale[:, 0], zero[:, 0] = _grid(W, bits, sym)"),
            ("                scale[:, g], zero[:, g] = fit_quantizer(current, bits, sym)",
             "                scale[:, g], zero[:, g] = _grid(current, bits, sym)"),
        ],
        cause=r"all-zero row",
        loses=["quantizer_public", "quantizer"],
    ),
    Mutant(
        name="round_half_away_from_zero",
        why="I rounded with floor(x / scale + 0.5), the school rule, instead of torch.round (half to even): "
            "they differ only on exact midpoints, which the old hand-picked rows never hit",
        edits=[("    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)",
                "    q = torch.clamp(torch.floor(x / scale + 0.5) + zero, 0, maxq)")],
        cause=r"half to even",
        loses=["quantizer"],
    ),
    Mutant(
        name="zero_added_before_rounding",
        why="I rounded x / scale + zero in one go: the same except on a midpoint with an odd zero, where half "
            "to even goes the other way",
        edits=[("    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)",
                "    q = torch.clamp(torch.round(x / scale + zero), 0, maxq)")],
        cause=r"before adding zero",
        loses=["quantizer"],
    ),
    Mutant(
        name="static_groups_only_with_act_order",
        why="I honoured static_groups only together with act_order; without it I fit the groups dynamically",
        edits=[("    if grouped and static_groups:  # every group's grid",
                "    if grouped and static_groups and act_order:  # every group's grid"),
               ("            if grouped and not static_groups and col % gs == 0:",
                "            if grouped and not (static_groups and act_order) and col % gs == 0:")],
        cause=r"with or without act_order",
        loses=["obq_oracle"],
    ),
    Mutant(
        name="descending_by_flipping_an_ascending_sort",
        why="For act-order I sorted diag(H) ascending and flipped it: descending, but equal diagonals come out "
            "in reverse order (not a stable descending sort)",
        edits=[("perm = torch.sort(torch.diag(H), descending=True, stable=True).indices",
                "perm = torch.sort(torch.diag(H), stable=True).indices.flip(0)")],
        cause=r"stable descending sort",
        loses=["act_order"],
    ),
    # Contract clauses drawn since issue 36 (the table at the head of grader/hidden/gptq/test_hidden.py).
    Mutant(
        name="half_precision_block_copy",
        why="I kept each block's working copy in W's own dtype, so an fp16 W gets its in-block updates rounded to "
            "fp16 (the contract does all the arithmetic in fp32)",
        edits=[("        W1 = W[:, i1:i2].clone()  # this block", "        W1 = W[:, i1:i2].to(dtype)  # this block"),
               ("        Err1 = torch.zeros_like(W1)", "        Err1 = torch.zeros_like(W1, dtype=torch.float32)")],
        cause=r"in fp32",
        loses=["obq_oracle"],
    ),
    Mutant(
        name="group_size_zero_as_groups",
        why="I took only group_size == -1 to mean \"no groups\"; the contract says group_size <= 0",
        edits=[("    grouped = group_size > 0\n", "    grouped = group_size != -1\n")],
        cause=r"group_size <= 0",
        loses=["obq_oracle"],
    ),
    Mutant(
        name="integer_weights_accepted",
        why="I checked that W is 2-D but not that it is floating point: an integer W is quantised as if it were one",
        edits=[("W.dim() != 2 or not W.is_floating_point()", "W.dim() != 2")],
        cause=r"integer W",
        loses=["validation"],
    ),
    Mutant(
        name="inf_not_rejected",
        why="I rejected NaN in W and H, but not inf",
        edits=[("    if not torch.isfinite(W).all():\n        raise ValueError(\"W holds NaN or inf\")",
                "    if torch.isnan(W).any():\n        raise ValueError(\"W holds NaN\")"),
               ("    if not torch.isfinite(H).all():\n        raise ValueError(\"H holds NaN or inf\")",
                "    if torch.isnan(H).any():\n        raise ValueError(\"H holds NaN\")")],
        cause=r"inf in W",
        loses=["validation"],
    ),
    Mutant(
        name="block_size_not_checked",
        why="I did not check block_size: range() rejects 0 by itself, but a negative block_size runs no block at all "
            "and a float one fails with a TypeError",
        edits=[("    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:\n"
                "        raise ValueError(f\"block_size must be a positive int, found {block_size!r}\")\n", "")],
        cause=r"block_size=-4",
        loses=["validation"],
    ),
    Mutant(
        name="negative_percdamp_accepted",
        why="I did not check percdamp: a negative one undamps H, and the call returns",
        edits=[("    if not percdamp >= 0:\n        raise ValueError(f\"percdamp must be >= 0, found {percdamp!r}\")\n", "")],
        cause=r"percdamp=-0.01",
        loses=["validation"],
    ),
]
