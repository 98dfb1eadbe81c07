"""Known-wrong submissions for speculative decoding: the bugs students really make.

The signature check is `coupling` (the maximal coupling of draft and target: keep x with probability
min(1, p/q), redraw a rejected position from norm(max(0, p - q)), tokens per target call as equation 1).
`textbook` and `textbook_always_reject` emit every position with the target's law but skip the coupling: they
lose `coupling` and keep the correctness checks. `lockstep_rows` (the red team's) advances the whole batch by
its smallest num_accepted + 1: every output keeps the target's law, and only the per-row call count in `coupling`
sees it. `one_percent_bias` and `acceptance_one_point_low` move about 1%
of the probability mass in some cases, the resolution the statistical tests state."""

from tests.known_wrong import Mutant

CORRECTNESS = ["distribution", "accept_rules", "generate", "greedy", "formulas", "reproducible", "vectorised"]

MUTANTS = [
    Mutant(
        name="textbook",
        why="I sampled y_i from the target at every position and kept the draft token while it equalled y_i, emitting "
            "y_i at the first mismatch: every position comes out with the target's law, without min(1, p/q) or the "
            "residual (it keeps a draft only with probability p(x), so fewer tokens per target call)",
        edits=[(
            "    u = _uniform_open_closed((B, gamma), generator, device)\n"
            "    accepted = (q_x > 0) & (u * q_x <= p_x)\n",
            "    cdf = target_probs.double().cumsum(-1)  # y_i ~ p_i at every position, by the inverse CDF\n"
            "    u = torch.rand(B, gamma + 1, 1, generator=generator, device=device, dtype=torch.float64) * cdf[..., -1:]\n"
            "    y = (u >= cdf).sum(-1)\n"
            "    accepted = (q_x > 0) & (draft_tokens.long() == y[:, :gamma])\n",
        ), (
            "    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally\n",
            "    extra = y[rows, num_accepted]\n",
        )],
        loses=["coupling", "accept_public", "generate_public"],
        keeps=CORRECTNESS,
        cause=r"u <= p\(x\)/q\(x\)",
    ),
    Mutant(
        name="textbook_always_reject",
        why="I rejected every draft token and sampled the one token from the target p: each emitted token has the "
            "target's law, but a target call yields one token, as if there were no draft",
        edits=[
            ("accepted = (q_x > 0) & (u * q_x <= p_x)", "accepted = torch.zeros_like(q_x, dtype=torch.bool)"),
            ("residual = (p_next - q_next).clamp(min=0)", "residual = p_next"),
        ],
        loses=["coupling", "accept_public", "accept_rules", "generate_public"],
        keeps=["distribution", "generate"],
        cause=r"u <= p\(x\)/q\(x\)",
    ),
    Mutant(
        name="one_percent_bias",
        why="my residual leaned toward its most likely token: I moved 1% of the probability from the residual's second "
            "most likely token to its most likely one (a cell off by 0.01)",
        edits=[(
            "    mass = residual.sum(dim=-1, keepdim=True)\n",
            "    if residual.shape[-1] > 1:\n"
            "        normed = residual / residual.sum(dim=-1, keepdim=True).clamp(min=1e-30)\n"
            "        top = normed.topk(2, dim=-1)\n"
            "        step = torch.minimum(top.values[:, 1:], torch.full_like(top.values[:, 1:], 0.01))\n"
            "        normed = normed.scatter_add(-1, top.indices[:, :1], step).scatter_add(-1, top.indices[:, 1:], -step)\n"
            "        residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, normed, residual)\n"
            "    mass = residual.sum(dim=-1, keepdim=True)\n",
        )],
        loses=["coupling"],
        cause=r"token drawn after a rejection",
    ),
    Mutant(
        name="acceptance_one_point_low",
        why="where p(x) < q(x) I kept the draft with probability p/q - 0.01, a point below min(1, p/q)",
        edits=[("accepted = (q_x > 0) & (u * q_x <= p_x)",
                "accepted = (q_x > 0) & (u * q_x <= torch.where(p_x < q_x, (p_x - 0.01 * q_x).clamp(min=0), p_x))")],
        loses=["coupling"],
        cause=r"rows that reached it .*min\(1, p/q\)",
    ),
    Mutant(
        name="acceptance_times_0_99",
        why="I kept the draft with probability min(1, p/q) * 0.99",
        edits=[("accepted = (q_x > 0) & (u * q_x <= p_x)", "accepted = (q_x > 0) & (u * q_x <= 0.99 * p_x)")],
        loses=["coupling"],
        cause=r"rows that reached it .*min\(1, p/q\)",
    ),
    Mutant(
        name="p_and_q_swapped",
        why="I mixed up which letter is the target: accept with u <= q(x)/p(x), resample from max(0, q - p)",
        edits=[
            ("accepted = (q_x > 0) & (u * q_x <= p_x)", "accepted = (p_x > 0) & (u * p_x <= q_x)"),
            ("residual = (p_next - q_next).clamp(min=0)", "residual = (q_next - p_next).clamp(min=0)"),
        ],
        loses=["accept_public", "distribution", "accept_rules", "generate"],
        cause=r"max\(0, p - q\) = \[|q/p\)",
    ),
    Mutant(
        name="resample_from_p",
        why="after a rejection I sampled again from the target p instead of the residual max(0, p - q)",
        edits=[("residual = (p_next - q_next).clamp(min=0)", "residual = p_next")],
        loses=["accept_public", "distribution", "generate"],
        cause=r"after a rejection (sample|at position)",
    ),
    Mutant(
        name="resample_from_q",
        why="after a rejection I sampled again from the draft q",
        edits=[("residual = (p_next - q_next).clamp(min=0)", "residual = q_next")],
        loses=["accept_public", "distribution", "accept_rules", "generate"],
        cause=r"after (the|a) rejection (the token comes|at position)",
    ),
    Mutant(
        name="no_stop_at_first_rejection",
        why="I counted every accepted draft token, not just the ones before the first rejection",
        edits=[("num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)", "num_accepted = accepted.long().sum(dim=1)")],
        loses=["distribution", "accept_rules", "generate"],
        cause=r"after the first rejection",
    ),
    Mutant(
        name="bonus_after_rejection",
        why="after a rejection I also appended a bonus token from the next target row",
        edits=[(
            "    return _assemble(draft_tokens, num_accepted, extra), num_accepted\n\n\ndef greedy_accept",
            (
                "    tokens = _assemble(draft_tokens, num_accepted, extra)\n"
                "    more = torch.multinomial(target_probs[rows, (num_accepted + 1).clamp(max=gamma)].float(), 1, generator=generator)\n"
                "    after = (num_accepted + 1).clamp(max=gamma)\n"
                "    tokens = torch.where((num_accepted < gamma)[:, None] & (torch.arange(gamma + 1) == after[:, None]), more, tokens)\n"
                "    return tokens, num_accepted\n\n\ndef greedy_accept"
            ),
        )],
        loses=["accept_public", "distribution", "accept_rules"],
        cause=r"extra token.{0,40}-1",
    ),
    Mutant(
        name="bonus_missing",
        why="when all gamma drafts passed I returned them without the bonus token",
        edits=[(
            "    return _assemble(draft_tokens, num_accepted, extra), num_accepted\n\n\ndef greedy_accept",
            (
                "    tokens = _assemble(draft_tokens, num_accepted, extra)\n"
                "    tokens[:, gamma] = torch.where(num_accepted == gamma, -1, tokens[:, gamma])\n"
                "    return tokens, num_accepted\n\n\ndef greedy_accept"
            ),
        )],
        loses=["accept_public", "distribution", "accept_rules", "generate"],
        cause=r"bonus",
    ),
    Mutant(
        name="target_row_misaligned",
        why="I scored draft token i with the target's row i + 1 (off by one: the target's first row is the prefix's last position)",
        edits=[("p_x = target_probs[:, :gamma].gather", "p_x = target_probs[:, 1:].gather")],
        loses=["accept_public", "distribution", "accept_rules", "generate_public", "generate"],
        cause=r"target row i \(target_probs\[:, i\]\)|draft token i is scored with target row i",
    ),
    Mutant(
        name="nan_when_p_equals_q",
        why="I normalised the residual by its sum, which is 0/0 = NaN when p == q",
        edits=[("residual = torch.where(mass > 0, residual, p_next)", "residual = residual / mass")],
        loses=["distribution", "accept_rules"],
        cause=r"all zeros",
    ),
    Mutant(
        name="empty_residual_fallback_for_the_whole_batch",
        why="when one row's residual was empty I sampled every row from p instead of only that row",
        edits=[("residual = torch.where(mass > 0, residual, p_next)",
                "residual = residual if bool((mass > 0).all()) else p_next")],
        loses=["accept_rules"],
        cause=r"only in THOSE rows",
    ),
    Mutant(
        name="accepts_q_zero",
        why="with q(x) = 0 the ratio p/q is infinite, so I accepted the token",
        edits=[("accepted = (q_x > 0) & (u * q_x <= p_x)", "accepted = u * q_x <= p_x")],
        loses=["accept_rules", "distribution"],
        cause=r"q = 0",
    ),
    Mutant(
        name="loop_over_rows_for_the_resample",
        why="I vectorised the acceptance test but drew the extra token row by row",
        edits=[(
            "extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally",
            "extra = torch.stack([torch.multinomial(residual[b], 1, generator=generator)[0] for b in range(B)])",
        )],
        loses=["vectorised_public", "vectorised"],
        cause=r"loop over (the )?rows|once per element",
    ),
    Mutant(
        name="loop_over_rejected_rows",
        why="I resampled only the rows that had a rejection, one at a time",
        edits=[(
            "extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally",
            (
                "extra = torch.multinomial(p_next, 1, generator=generator).squeeze(1)\n"
                "    for b in (num_accepted < gamma).nonzero().flatten().tolist():\n"
                "        extra[b] = torch.multinomial(residual[b], 1, generator=generator)[0]"
            ),
        )],
        loses=["vectorised"],
        cause=r"loop over (the )?rows",
    ),
    Mutant(
        name="one_draw_per_row_through_map",
        why="I drew the extra token row by row with map() over the rows (no Python line runs per row, so the line "
            "count stays flat; the grader's clock sees the loop)",
        edits=[
            ("from collections.abc import Callable\n", "import functools\nfrom collections.abc import Callable\n"),
            ("extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally",
             "draw = functools.partial(torch.multinomial, num_samples=1, generator=generator)\n"
             "    extra = torch.cat(list(map(draw, residual.unbind(0))))"),
        ],
        loses=["vectorised_public", "vectorised"],
        cause=r"once per element",
    ),
    Mutant(
        name="leading_accepts_counted_by_map",
        why="I counted each row's leading accepted tokens on the Python list of rows, with map() and "
            "itertools.takewhile, so no line runs per row (the values read back grow with the batch)",
        edits=[
            ("from collections.abc import Callable\n",
             "import itertools\nfrom functools import partial\nfrom collections.abc import Callable\n"),
            ("    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)              # [B], in 0..gamma\n",
             "    leading = map(len, map(list, map(partial(itertools.takewhile, bool), accepted.tolist())))\n"
             "    num_accepted = torch.tensor(list(leading), dtype=torch.long, device=device)\n"),
        ],
        loses=["vectorised"],
        cause=r"back into Python",
    ),
    Mutant(
        name="coins_from_a_generator_of_my_own",
        why="I seeded a generator of my own for the acceptance coins, so every call draws the same coins",
        edits=[("u = _uniform_open_closed((B, gamma), generator, device)",
                "u = _uniform_open_closed((B, gamma), torch.Generator(device).manual_seed(0), device)")],
        loses=["reproducible"],
        cause=r"do not come from `generator`",
    ),
    Mutant(
        name="one_coin_per_position_for_the_whole_batch",
        why="I drew one u per draft position and shared it across the rows (rows are no longer independent)",
        edits=[("u = _uniform_open_closed((B, gamma), generator, device)",
                "u = _uniform_open_closed((1, gamma), generator, device)")],
        loses=["distribution"],
        cause=r"decided alike|one fresh u per row and position",  # the statistical diagnosis, or the rule itself
    ),
    Mutant(
        name="global_rng",
        why="I used torch.rand without the generator",
        edits=[("return 1.0 - torch.rand(shape, generator=generator, device=device)",
                "return 1.0 - torch.rand(shape, device=device)")],
        loses=["reproducible"],
        cause=r"from `generator`",
    ),
    Mutant(
        name="residual_fallback_with_a_tolerance",
        why="I fell back to p whenever the residual's mass was below 1e-6, not only when it is 0 (a residual of "
            "mass 2^-24 is still the residual: only the generated nearly-empty-residual cases catch it)",
        edits=[("residual = torch.where(mass > 0, residual, p_next)",
                "residual = torch.where(mass > 1e-6, residual, p_next)")],
        loses=["coupling"],
        cause=r"no tolerance",
    ),
    Mutant(
        name="one_coin_per_row_for_every_position",
        why="I drew one u per row and compared it with the ratio at every position, so the positions' acceptance "
            "tests are not independent",
        edits=[("u = _uniform_open_closed((B, gamma), generator, device)",
                "u = _uniform_open_closed((B, 1), generator, device).expand(B, gamma)")],
        loses=["distribution"],
        cause=r"reused across positions|one fresh u per row and position",
    ),
    Mutant(
        name="greedy_ties_to_the_highest_id",
        why="greedy: I took the last maximal id (an argmax over the flipped vocabulary), so on a tie for the largest "
            "probability the argmax is the highest id, not the lowest",
        edits=[("best = target_probs.argmax(dim=-1)                                     # [B, gamma + 1]",
                "best = target_probs.shape[-1] - 1 - target_probs.flip(-1).argmax(dim=-1)  # [B, gamma + 1]")],
        loses=["greedy"],
        cause=r"LOWEST id",
    ),
    Mutant(
        name="greedy_no_bonus",
        why="greedy: when every draft token matched I forgot the target's last argmax",
        edits=[("    extra = best.gather(1, num_accepted[:, None]).squeeze(1)\n    return _assemble(draft_tokens, num_accepted, extra), num_accepted",
                (
                    "    extra = best.gather(1, num_accepted[:, None]).squeeze(1)\n"
                    "    tokens = _assemble(draft_tokens, num_accepted, extra)\n"
                    "    tokens[:, gamma] = torch.where(num_accepted == gamma, -1, tokens[:, gamma])\n"
                    "    return tokens, num_accepted"
                ))],
        loses=["greedy_public", "greedy"],
        cause=r"bonus is missing",
    ),
    Mutant(
        name="greedy_keeps_matches_after_a_mismatch",
        why="greedy: I kept every matching draft token, even after the first mismatch",
        edits=[("num_accepted = matches.long().cumprod(dim=1).sum(dim=1)", "num_accepted = matches.long().sum(dim=1)")],
        loses=["greedy_public", "greedy"],
        cause=r"first mismatch ends the row",
    ),
    Mutant(
        name="expected_tokens_without_bonus",
        why="equation 1 without the bonus term: 1 + alpha + ... + alpha^(gamma - 1)",
        edits=[("    for _ in range(gamma):\n        term = term * alpha", "    for _ in range(gamma - 1):\n        term = term * alpha")],
        loses=["formulas_public", "formulas"],
        cause=r"bonus",
    ),
    Mutant(
        name="speedup_ignores_draft_cost",
        why="I divided by gamma + 1 passes instead of gamma * c + 1",
        edits=[("return expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost_ratio + 1)",
                "return expected_tokens_per_step(alpha, gamma) / (draft_cost_ratio + 1)")],
        loses=["formulas_public", "formulas"],
        cause=r"gamma \* c \+ 1",
    ),
    Mutant(
        name="speedup_closed_form",
        why="I wrote the speed-up as the paper prints it, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): 0/0 at alpha = 1",
        edits=[("return expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost_ratio + 1)",
                "return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * draft_cost_ratio + 1))")],
        loses=["formulas"],
        cause=r"divides 0 by 0 at alpha = 1",
    ),
    Mutant(
        name="closed_form_nan_at_one",
        why="I used (1 - alpha**(gamma+1)) / (1 - alpha) as written",
        edits=[(
            (
                "    total = alpha * 0 + 1.0  # the k = 0 term, with alpha's type and shape\n"
                "    term = total\n"
                "    for _ in range(gamma):\n"
                "        term = term * alpha\n"
                "        total = total + term\n"
                "    return total"
            ),
            (
                "    if isinstance(alpha, torch.Tensor):\n"
                "        return (1 - alpha ** (gamma + 1)) / (1 - alpha)\n"
                "    return (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha != 1 else float('nan')"
            ),
        )],
        loses=["formulas_public", "formulas"],
        cause=r"0/0|divides 0 by 0",
    ),
    Mutant(
        name="loop_drops_the_extra_token",
        why="my loop advanced each row by num_accepted, dropping the resampled or bonus token",
        edits=[("length = torch.where(active, length + num_accepted + 1, length)",
                "length = torch.where(active, length + num_accepted, length)")],
        loses=["generate_public", "reproducible", "generate"],
        cause=r"num_accepted \+ 1",
    ),
    Mutant(
        name="lockstep_rows",
        why="my loop advanced every unfinished row by the batch's smallest num_accepted + 1, so the rows stay aligned "
            "in one buffer (red team, kept 94/94 on the CPU: each row's output still follows the target, but one "
            "row's rejection throws away what every other row kept; at B = 1000, alpha ~ 0.89, gamma = 4, 64 "
            "tokens took 64 target calls instead of 23)",
        edits=[("length = torch.where(active, length + num_accepted + 1, length)",
                "step = int(num_accepted[active].min()) + 1  # advance the batch in lockstep\n"
                "        length = torch.where(active, length + step, length)")],
        loses=["coupling"],
        keeps=CORRECTNESS + ["generate_public", "accept_public"],
        cause=r"its own num_accepted \+ 1",
    ),
    Mutant(
        name="loop_stops_when_the_first_row_finishes",
        why="my loop ran while the row with the MOST new tokens still needed some (max instead of min), so it "
            "stopped when the fastest row was done and the slower rows returned the buffer's padding",
        edits=[("while int((length - P).min()) < max_new_tokens:", "while int((length - P).max()) < max_new_tokens:")],
        loses=["coupling", "generate"],
        keeps=["distribution", "accept_rules", "greedy", "formulas", "vectorised", "generate_public"],
        cause=r"FEWEST new tokens",
    ),
    Mutant(
        name="loop_target_off_by_one",
        why="my loop read the target's rows from position length instead of length - 1",
        edits=[("target_probs = p[rows[:, None], length[:, None] - 1 + steps]",
                "target_probs = p[rows[:, None], (length[:, None] + steps).clamp(max=p.shape[1] - 1)]")],
        loses=["generate_public", "generate"],
        cause=r"one position late|start at length - 1",
    ),
    Mutant(
        name="loop_forgets_to_write_drafts",
        why="my loop kept the draft tokens in a list but never wrote them into the sequence the models read",
        edits=[("            seq[rows, length + i] = x\n", "")],
        loses=["generate"],
        cause=r"write draft i into the row",
    ),
    Mutant(
        name="loop_one_length_for_all_rows",
        why="my loop read every row at the first row's length",
        edits=[("            q_i = q[rows, length - 1 + i].float()", "            q_i = q[rows, length[0] - 1 + i].float()"),
               ("target_probs = p[rows[:, None], length[:, None] - 1 + steps]",
                "target_probs = p[rows[:, None], length[0] - 1 + steps[None, :]]")],
        loses=["generate"],
        cause=r"ITS own length",
    ),
    Mutant(
        name="loop_counts_draft_calls",
        why="I reported model calls of both models as target calls",
        edits=[("        target_calls += 1\n", "        target_calls += 1 + gamma\n")],
        loses=["generate_public", "generate"],
        cause=r"reported \d+ target calls but the target model was called",
    ),
    Mutant(
        name="formulas_return_tensors_for_floats",
        why="I turned alpha into a tensor first, so a float alpha gives a 0-d tensor, not a float",
        edits=[("    total = alpha * 0 + 1.0  # the k = 0 term, with alpha's type and shape\n",
                "    alpha = torch.as_tensor(alpha, dtype=torch.float64)\n"
                "    total = alpha * 0 + 1.0  # the k = 0 term, with alpha's type and shape\n")],
        loses=["formulas"],
        cause=r"a float alpha gives a float",
    ),
    Mutant(
        name="acceptance_rate_sums_dim_2",
        why="I summed over dim 2 (the vocabulary of a [B, gamma, V] tensor), not over the last dim",
        edits=[("return torch.minimum(p, q).sum(dim=-1)", "return torch.minimum(p, q).sum(dim=2)")],
        loses=["formulas"],
        cause=r"last dim|dim=-1",
    ),
    Mutant(
        name="greedy_argmax_in_float32",
        why="greedy: I cast the target to float32 before the argmax, so float64 values 1e-12 apart tie",
        edits=[("best = target_probs.argmax(dim=-1)                                     # [B, gamma + 1]",
                "best = target_probs.float().argmax(dim=-1)                             # [B, gamma + 1]")],
        loses=["greedy"],
        cause=r"float32",
    ),
    Mutant(
        name="gamma_zero_takes_the_argmax",
        why="with gamma = 0 there is nothing to verify, so I returned the target's most likely token",
        edits=[("    B, gamma = draft_tokens.shape\n    device = target_probs.device\n",
                "    B, gamma = draft_tokens.shape\n    device = target_probs.device\n"
                "    if gamma == 0:\n"
                "        return target_probs[:, 0].argmax(-1, keepdim=True), torch.zeros(B, dtype=torch.long, device=device)\n")],
        loses=["accept_rules"],
        cause=r"not its argmax",
    ),
    Mutant(
        name="loop_one_draft_call_too_many",
        why="my loop called the draft model once more after the gamma drafts (for q at the bonus position), a draft "
            "call per step that the contract does not make",
        edits=[("        # Verify: ONE call of the big model scores all gamma drafts and the position after them.\n",
                "        draft(seq[:, : int(length.max()) + gamma])\n"
                "        # Verify: ONE call of the big model scores all gamma drafts and the position after them.\n")],
        loses=["generate"],
        cause=r"exactly gamma draft calls",
    ),
    Mutant(
        name="generate_counts_calls_in_a_tensor",
        why="I counted the target calls in a tensor and returned it, not a Python int",
        edits=[("    target_calls = 0\n", "    target_calls = torch.zeros((), dtype=torch.long)\n")],
        loses=["generate"],
        cause=r"as a Python int",
    ),
]
