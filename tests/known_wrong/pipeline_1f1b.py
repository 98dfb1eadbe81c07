"""Known-wrong pipeline_1f1b submissions: the mistakes students make, each as an edit of the reference."""

from tests.known_wrong import Mutant

MUTANTS = [
    # ---- schedules ----
    Mutant(
        name="warmup_off_by_one",
        why="1F1B warm-up of p - s forwards instead of p - s - 1: one more microbatch in flight than needed",
        edits=[("warmup = min(p - s - 1, m)", "warmup = min(p - s, m)")],
        loses=["one_f_one_b", "schedules_public"],
        cause=r"forwards before (its|the) first backward",
    ),
    Mutant(
        name="no_cap_when_m_lt_p",
        why="1F1B warm-up of p - s - 1 even when there are fewer microbatches than that",
        edits=[("warmup = min(p - s - 1, m)", "warmup = p - s - 1")],
        loses=["one_f_one_b", "schedules_public"],
        cause=r"capped|its cap",
    ),
    Mutant(
        name="gpipe_backwards_lifo",
        why="GPipe backwards from the last microbatch to the first, the way autograd would pop a stack",
        edits=[('[("B", i) for i in range(m)] for _ in range(num_stages)]',
                '[("B", i) for i in reversed(range(m))] for _ in range(num_stages)]')],
        loses=["gpipe", "schedules_public"],
        cause=r"oldest",
    ),
    Mutant(
        name="1f1b_cooldown_lifo",
        why="1F1B cool-down drains the backwards newest first instead of oldest first",
        edits=[('ops += [("B", i) for i in range(m - warmup, m)]', 'ops += [("B", i) for i in reversed(range(m - warmup, m))]')],
        loses=["one_f_one_b", "schedules_public"],
        cause=r"oldest",
    ),
    Mutant(
        name="1b1f_deadlocks",
        why="steady state runs the backward before the forward: the last stage waits for a forward it never ran",
        edits=[('ops += [("F", warmup + i), ("B", i)]', 'ops += [("B", i), ("F", warmup + i)]')],
        loses=["one_f_one_b", "schedules_public"],
        cause=r"before its own forward",
    ),
    Mutant(
        name="interleaved_contiguous_chunks",
        why="stage s holds chunks s*v .. s*v + v - 1 instead of s, s + p, ...: the chunk mapping is wrong",
        edits=[('forwards = [("F", microbatch(k), local_chunk(k) * p + s)', 'forwards = [("F", microbatch(k), s * v + local_chunk(k))'),
               ('backwards = [("B", microbatch(k), (v - 1 - local_chunk(k)) * p + s)', 'backwards = [("B", microbatch(k), s * v + v - 1 - local_chunk(k))')],
        loses=["interleaved", "schedules_public"],
        cause=r"lives on stage",
    ),
    Mutant(
        name="interleaved_backwards_same_chunk_order",
        why="interleaved backwards visit the chunks in the forward order instead of the reverse",
        edits=[('backwards = [("B", microbatch(k), (v - 1 - local_chunk(k)) * p + s)', 'backwards = [("B", microbatch(k), local_chunk(k) * p + s)')],
        loses=["interleaved", "schedules_public"],
        cause=r"reverse order",
    ),
    Mutant(
        name="interleaved_filters_every_stage",
        why="builds every stage's forwards for each stage and keeps its own: right order, p times the work",
        edits=[('forwards = [("F", microbatch(k), local_chunk(k) * p + s) for k in range(total)]',
                ('forwards = [op for t in range(p) for op in [("F", microbatch(k), local_chunk(k) * p + t) '
                 'for k in range(total)] if op[2] % p == s]'))],
        loses=["interleaved", "schedules_public"],
        cause=r"filter them per stage",
    ),
    Mutant(
        name="interleaved_filters_in_c",
        why="builds every stage's forwards once and filters each stage's own out of them with itertools and "
            "operator functions: p times the work per op, none of it in lines of Python",
        edits=[('    schedule = []\n    for s in range(p):\n        forwards = [("F", microbatch(k), local_chunk(k) * p + s) for k in range(total)]\n', '    from itertools import compress, repeat, chain\n    from operator import eq, mod, itemgetter, add\n    mbs = [microbatch(k) for k in range(total)]\n    lcs = [local_chunk(k) * p for k in range(total)]\n    every = list(zip(repeat("F"), chain.from_iterable(repeat(mbs, p)),\n                     map(add, chain.from_iterable(repeat(lcs, p)), chain.from_iterable(map(repeat, range(p), repeat(total))))))\n    schedule = []\n    for s in range(p):\n        forwards = list(compress(every, map(eq, map(mod, map(itemgetter(2), every), repeat(p)), repeat(s))))\n')],
        loses=["interleaved"],
        cause=r"with the stages|more stages|filter them per stage",
    ),
    # ---- simulator ----
    Mutant(
        name="p2p_on_same_stage",
        why="charges p2p_time for every dependency, even a stage's own forward before its backward",
        edits=[("arrival = finish[dep] + (p2p_time if dep[2] % p != s else 0.0)", "arrival = finish[dep] + p2p_time")],
        loses=["simulate", "simulate_public"],
        cause=r"same stage|a stage's own forward",
    ),
    Mutant(
        name="bubble_over_makespan",
        why="divides the idle time by the makespan instead of by p * makespan",
        edits=[("bubble = (p * makespan - busy) / (p * makespan) if makespan > 0 else 0.0",
                "bubble = (p * makespan - busy) / makespan if makespan > 0 else 0.0")],
        loses=["simulate", "simulate_public"],
        cause=r"p \* makespan",
    ),
    Mutant(
        name="chunk_cost_not_split",
        why="an interleaved chunk op costs the whole forward_time / backward_time instead of 1/v of it",
        edits=[('cost = {"F": forward_time / v, "B": backward_time / v}', 'cost = {"F": forward_time, "B": backward_time}')],
        loses=["simulate", "simulate_public"],
        cause=r"time / v|1/v",
    ),
    Mutant(
        name="duplicates_accepted",
        why="checks that every op is present but not that none is run twice",
        edits=[('raise ValueError(f"stage {s} runs {_show(op, arity)} twice")', "pass")],
        loses=["simulate"],
        cause=r"twice",
    ),
    Mutant(
        name="p2p_between_chunks",
        why="charges p2p_time when an input comes from another chunk, not another stage: wrong only when one stage "
            "holds both chunks (p = 1, interleaved)",
        edits=[("arrival = finish[dep] + (p2p_time if dep[2] % p != s else 0.0)",
                "arrival = finish[dep] + (p2p_time if dep[2] != op[2] else 0.0)")],
        loses=["simulate"],
        cause=r"same stage",
    ),
    Mutant(
        name="count_based_validation",
        why="checks only that each stage runs 2 m v ops: one op swapped for a copy of another, where nothing waits on "
            "the missing one, is timed as if valid",
        edits=[("""        seen = set()
        for op in row:
            if op in seen:
                raise ValueError(f"stage {s} runs {_show(op, arity)} twice")
            seen.add(op)
        for c in range(s, num_chunks, p):
            for mb in range(m):
                for kind in ("F", "B"):
                    if (kind, mb, c) not in seen:
                        raise ValueError(f"stage {s} never runs {_show((kind, mb, c), arity)}")
""", """        if len(row) != 2 * m * (num_chunks // p):
            raise ValueError(f"stage {s} runs {len(row)} ops, expected {2 * m * (num_chunks // p)}")
""")],
        loses=["simulate"],
        cause=r"never runs|lost \(|lacks|twice and never",
    ),
    Mutant(
        name="names_one_stuck_op",
        why="a deadlock's ValueError names only the last stuck stage's op, not every stuck op",
        edits=[('''        raise ValueError("the schedule deadlocks; these ops wait forever: " + ", ".join(stuck))''',
                '''        raise ValueError("the schedule deadlocks; this op waits forever: " + stuck[-1])''')],
        loses=["simulate"],
        cause=r"does not name",
    ),
    Mutant(
        name="walk_rescans_from_stage_0",
        why="after every op, looks for the next runnable op by scanning the stages from stage 0 again",
        edits=[(
            """    ready = deque(range(p))
    while ready:
        s = ready.popleft()
        row = plan.ops[s]
        while next_op[s] < len(row):
            op = row[next_op[s]]
            missing = next((d for d in _dependencies(op, total_chunks) if d not in done), None)
            if missing is not None:
                parked.setdefault(missing, []).append(s)
                break
            yield s, op
            done.add(op)
            next_op[s] += 1
            ready.extend(parked.pop(op, ()))
""",
            """    progress = True
    while progress:
        progress = False
        for s in range(p):
            row = plan.ops[s]
            if next_op[s] < len(row):
                op = row[next_op[s]]
                if all(d in done for d in _dependencies(op, total_chunks)):
                    yield s, op
                    done.add(op)
                    next_op[s] += 1
                    progress = True
                    break
""")],
        loses=["simulate_linear", "simulate_public"],
        cause=r"rescan",
    ),
    Mutant(
        name="next_stage_by_index",
        why="keeps a flag per stage that may run and finds the next one with flags.index(True): one line per op, "
            "but a scan of the stages from stage 0 for every op, done by C",
        edits=[('    done: set[tuple[str, int, int]] = set()\n    parked: dict[tuple[str, int, int], list[int]] = {}\n    ready = deque(range(p))\n    while ready:\n        s = ready.popleft()\n        row = plan.ops[s]\n        while next_op[s] < len(row):\n            op = row[next_op[s]]\n            missing = next((d for d in _dependencies(op, total_chunks) if d not in done), None)\n            if missing is not None:\n                parked.setdefault(missing, []).append(s)\n                break\n            yield s, op\n            done.add(op)\n            next_op[s] += 1\n            ready.extend(parked.pop(op, ()))\n', '    done = set()\n    flag = [True] * p + [True]\n    while True:\n        s = flag.index(True)\n        if s == p:\n            break\n        row = plan.ops[s]\n        if next_op[s] >= len(row):\n            flag[s] = False\n            continue\n        op = row[next_op[s]]\n        missing = next((d for d in _dependencies(op, total_chunks) if d not in done), None)\n        if missing is not None:\n            flag[s] = False\n            continue\n        yield s, op\n        done.add(op)\n        next_op[s] += 1\n        if s > 0:\n            flag[s - 1] = True\n        if s + 1 < p:\n            flag[s + 1] = True\n        flag[(op[2] - 1) % p] = True\n        flag[(op[2] + 1) % p] = True\n')],
        loses=["simulate_linear"],
        cause=r"with the stages|more stages|scanning the stages",
    ),
    Mutant(
        name="walk_rescans_in_c",
        why="rescans the stages from stage 0 after every op as walk_rescans_from_stage_0 does, with the scan run by "
            "itertools (compress over map(done.__contains__, ...)), so that no line runs per stage",
        edits=[('    done: set[tuple[str, int, int]] = set()\n    parked: dict[tuple[str, int, int], list[int]] = {}\n    ready = deque(range(p))\n    while ready:\n        s = ready.popleft()\n        row = plan.ops[s]\n        while next_op[s] < len(row):\n            op = row[next_op[s]]\n            missing = next((d for d in _dependencies(op, total_chunks) if d not in done), None)\n            if missing is not None:\n                parked.setdefault(missing, []).append(s)\n                break\n            yield s, op\n            done.add(op)\n            next_op[s] += 1\n            ready.extend(parked.pop(op, ()))\n', '    done = {None}\n    need = [None] * p  # None: head may run; FIN: stage finished; else the dep it waits on\n    from itertools import compress, count, filterfalse\n    FIN = ("fin",)\n    while True:\n        s = next(compress(count(), map(done.__contains__, need)), None)\n        if s is None:\n            break\n        row = plan.ops[s]\n        op = row[next_op[s]]\n        missing = next(filterfalse(done.__contains__, _dependencies(op, total_chunks)), None)\n        if missing is not None:\n            need[s] = missing\n            continue\n        yield s, op\n        done.add(op)\n        next_op[s] += 1\n        need[s] = None if next_op[s] < len(row) else FIN\n')],
        loses=["simulate_linear"],
        cause=r"with the stages|more stages|scanning the stages",
    ),
    # ---- executor ----
    Mutant(
        name="loss_not_divided_by_m",
        why="backpropagates each microbatch's mean loss as is: gradients and loss m times too large",
        edits=[("y = loss_fn(y, targets[mb]) / m  # mean over microbatches", "y = loss_fn(y, targets[mb])  # mean over microbatches")],
        loses=["run_pipeline", "run_pipeline_public"],
        cause=r"divide each microbatch's loss by m",
    ),
    Mutant(
        name="no_zero_grad",
        why="does not zero the gradients first, so a second step adds to the first one's gradients",
        edits=[("    for stage in stages:\n        stage.zero_grad(set_to_none=True)\n", "")],
        loses=["run_pipeline"],
        cause=r"zero the pieces' gradients",
    ),
    Mutant(
        name="no_detach_between_stages",
        why="hands the next stage the output itself, not a detached leaf: the first backward runs through every stage",
        edits=[("inbox[(mb, c + 1)] = y.detach()", "inbox[(mb, c + 1)] = y")],
        loses=["run_pipeline", "run_pipeline_public", "run_pipeline_memory"],
        cause=r"detached output",
    ),
    Mutant(
        name="keeps_activations",
        why="keeps every microbatch's graph (retain_graph=True and a reference) until the step ends",
        edits=[("x, y = saved.pop((mb, c))", "x, y = saved[(mb, c)]"),
               ("torch.autograd.backward(y, None if c == last else grad_inbox.pop((mb, c)))",
                "torch.autograd.backward(y, None if c == last else grad_inbox.pop((mb, c)), retain_graph=True)")],
        loses=["run_pipeline_memory"],
        keeps=["run_pipeline", "run_pipeline_public"],
        cause=r"retain_graph",
    ),
    Mutant(
        name="all_forwards_first",
        why="ignores the schedule's order: runs every forward, then every backward (GPipe memory whatever the schedule)",
        edits=[("for s, (kind, mb, c) in _walk(plan):\n        if kind == \"F\":",
                "for s, (kind, mb, c) in sorted(_walk(plan), key=lambda item: item[1][0] == \"B\"):\n        if kind == \"F\":")],
        loses=["run_pipeline_memory", "run_pipeline", "run_pipeline_public"],
        cause=r"forwards? runs? before any backward",
    ),
]

# Work per op that grows with the micro-batches: caught by MICROBATCH_CLOCK (m from 64 to 4096 at p = 2), which the
# ops probe (m = 32) and the stage probe (m = 2048 at p = 2, where a slow many-micro-batch shape only lowers the
# ratio) both missed (red team round 18: 15/15 and 5/5).
MUTANTS += [
    Mutant(
        "1f1b_checks_each_op_against_the_row",
        "to be sure no op is scheduled twice, I check each new op against the stage's row so far (`op in ops`)",
        [("            ops += [(\"F\", warmup + i), (\"B\", i)]\n",
          "            for op in ((\"F\", warmup + i), (\"B\", i)):\n"
          "                if op in ops:\n"
          "                    raise RuntimeError(f\"{op} scheduled twice\")\n"
          "                ops.append(op)\n")],
        loses=["one_f_one_b"],
        cause=r"grows with the micro-batches",
    ),
    Mutant(
        "simulate_searches_the_finished_ops",
        "simulate keeps each stage's finished ops in a list and finds a dependency's finish time with list.index",
        [("    finish: dict[tuple[str, int, int], float] = {}\n",
          "    done: list[list] = [[] for _ in range(p)]  # per stage: (op, finish time), in order\n"),
         ("            arrival = finish[dep] + (p2p_time if dep[2] % p != s else 0.0)\n",
          "            ops_done = [o for o, _ in done[dep[2] % p]]\n"
          "            arrival = done[dep[2] % p][ops_done.index(dep)][1] + (p2p_time if dep[2] % p != s else 0.0)\n"),
         ("        finish[op] = stage_free[s] = end\n",
          "        stage_free[s] = end\n        done[s].append((op, end))\n")],
        loses=["simulate_linear"],
        cause=r"finish times in a dict",
    ),
]


# ---- the signature: right numbers, technique skipped (issue 36) ----
# run_pipeline_memory's census (grader/support/pipeline_1f1b.py) counts, per stage, the microbatches whose forward
# calls autograd still holds (a forward of the whole batch counts m) and the storages those forwards saved; the
# peaks the 1F1B check reads come from the trusted simulator.
MUTANTS += [
    Mutant(
        name="textbook",
        why="run_pipeline checks the schedule, then pushes the whole batch through the pieces in one forward and one "
            "backward (the loss the mean of the microbatches' losses) and reports the schedule's peaks: the right loss "
            "and gradients, every activation held at once",
        edits=[("    for s, (kind, mb, c) in _walk(plan):\n        if kind == \"F\":",
                "    for _ in _walk(plan):  # a deadlock still raises; the order is not used\n        pass\n"
                "    peak = [_peak_in_flight(row) for row in plan.ops]\n"
                "    out = torch.cat(list(microbatches))\n"
                "    for piece in stages:\n        out = piece(out)\n"
                "    n = len(microbatches[0])\n"
                "    batch_loss = sum(loss_fn(out[i * n:(i + 1) * n], targets[i]) for i in range(m)) / m\n"
                "    batch_loss.backward()\n    total_loss = batch_loss.item()\n"
                "    for s, (kind, mb, c) in []:\n        if kind == \"F\":")],
        loses=["run_pipeline_memory"],
        keeps=["run_pipeline", "run_pipeline_public"],
        cause=r"one microbatch per forward",
    ),
    Mutant(
        name="forwards_first_reports_the_schedule",
        why="run_pipeline runs every forward of the walk, then every backward (GPipe, whatever the schedule), and "
            "reports the peaks the schedule would have: the right loss, gradients and reported peaks",
        edits=[("for s, (kind, mb, c) in _walk(plan):\n        if kind == \"F\":",
                "for s, (kind, mb, c) in sorted(_walk(plan), key=lambda item: item[1][0] == \"B\"):\n        if kind == \"F\":"),
               ("return PipelineRun(total_loss, grads, peak)",
                "return PipelineRun(total_loss, grads, [_peak_in_flight(row) for row in plan.ops])")],
        loses=["run_pipeline_memory"],
        keeps=["run_pipeline", "run_pipeline_public"],
        cause=r"when the schedule says",
    ),
    Mutant(
        name="keeps_outputs_after_backward",
        why="reads each microbatch's (input, output) at its backward without popping it: autograd frees the graph, "
            "but every output a forward saved stays alive in the dict until the step ends",
        edits=[("x, y = saved.pop((mb, c))", "x, y = saved[(mb, c)]")],
        loses=["run_pipeline_memory"],
        keeps=["run_pipeline", "run_pipeline_public"],
        cause=r"drop every reference",
    ),
    Mutant(
        name="1f1b_is_gpipe",
        why="one_f_one_b_schedule returns GPipe's order: a valid schedule with the same makespan and bubble, that "
            "holds all m microbatches on every stage",
        edits=[('    """1F1B (PipeDream-Flush): warm up with p - s - 1 forwards, then alternate, then drain."""\n',
                '    """1F1B (PipeDream-Flush): warm up with p - s - 1 forwards, then alternate, then drain."""\n'
                '    return gpipe_schedule(num_stages, num_microbatches)\n')],
        loses=["one_f_one_b", "schedules_public"],
        cause=r"GPipe's order",
    ),
    Mutant(
        name="interleaved_all_forwards_first",
        why="the interleaved schedule warms up with every forward (GPipe over the chunks): valid, and every stage "
            "holds all m v (microbatch, chunk) pairs",
        edits=[("warmup = min(2 * (p - s - 1) + (v - 1) * p, total)", "warmup = total")],
        loses=["interleaved", "schedules_public"],
        cause=r"GPipe's order",
    ),
]

# ---- contract clauses drawn for issue 36 (one mutant each) ----
MUTANTS += [
    Mutant(
        name="1f1b_accepts_float_sizes",
        why="one_f_one_b_schedule checks only that p and m are at least 1: 2.0 stages get past it",
        edits=[("    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches)\n"
                "    p, m = num_stages, num_microbatches\n    schedule = []\n",
                "    if num_stages < 1 or num_microbatches < 1:\n"
                "        raise ValueError(f\"sizes must be >= 1, found {num_stages}, {num_microbatches}\")\n"
                "    p, m = num_stages, num_microbatches\n    schedule = []\n")],
        loses=["one_f_one_b"],
        cause=r"float, not an int",
    ),
    Mutant(
        name="interleaved_accepts_no_microbatches",
        why="the interleaved schedule checks p, v and m % p, but not m itself: m = 0 passes m % p == 0 and gives "
            "empty stages",
        edits=[("    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches, num_chunks=num_chunks)\n",
                "    _check_positive(num_stages=num_stages, num_chunks=num_chunks)\n")],
        loses=["interleaved"],
        cause=r"m = 0 microbatches",
    ),
    Mutant(
        name="negative_times_accepted",
        why="simulate never checks its times: a negative forward_time is simulated as if it were one",
        edits=[('        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:\n'
                '            raise ValueError(f"{name} must be a number >= 0, found {value!r}")\n', "        pass\n")],
        loses=["simulate"],
        cause=r"time is >= 0",
    ),
    Mutant(
        name="empty_pipeline_takes_no_time",
        why="simulate answers a schedule whose stages hold no ops with a makespan of 0 instead of refusing it",
        edits=[("    plan = _plan(schedule)\n    p, v = plan.num_stages, plan.num_chunks\n",
                "    if isinstance(schedule, list) and schedule and not any(schedule):\n"
                "        return SimResult(0.0, 0.0, [0] * len(schedule), [[] for _ in schedule])\n"
                "    plan = _plan(schedule)\n    p, v = plan.num_stages, plan.num_chunks\n")],
        loses=["simulate"],
        cause=r"no ops",
    ),
    Mutant(
        name="float_ids_accepted",
        why="an op's microbatch and chunk are checked to be >= 0 but not to be ints: ('F', 1.5) gets past, and "
            "fails later with a TypeError",
        edits=[("if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in op[1:]):",
                "if any(x < 0 for x in op[1:]):")],
        loses=["simulate"],
        cause=r"not an int",
    ),
    Mutant(
        name="long_ops_accepted",
        why="an op is checked to have at least two items: ('F', 0, 0, 0) is taken for an interleaved op",
        edits=[("len(op) not in (2, 3)", "len(op) < 2")],
        loses=["simulate"],
        cause=r"four items",
    ),
    Mutant(
        name="default_times_equal",
        why="simulate's backward_time defaults to 1.0, the forward's, not the contract's 2.0",
        edits=[("backward_time: float = 2.0", "backward_time: float = 1.0")],
        loses=["simulate"],
        cause=r"default times are not the contract's",
    ),
    Mutant(
        name="pieces_not_counted",
        why="run_pipeline never compares the pieces with the schedule: a piece too many is given a zero gradient, "
            "one too few fails with an IndexError",
        edits=[("    if len(stages) != p * v:\n", "    if False:\n")],
        loses=["run_pipeline"],
        cause=r"three pieces for a 2-stage",
    ),
    Mutant(
        name="microbatches_not_counted",
        why="run_pipeline never compares the microbatches and targets with the schedule: extra ones are ignored",
        edits=[("    if len(microbatches) != m or len(targets) != m:\n", "    if False:\n")],
        loses=["run_pipeline"],
        cause=r"microbatches for a schedule of",
    ),
    Mutant(
        name="missing_op_accepted",
        why="the schedule's ops are checked for duplicates but not for completeness: a stage that never runs a "
            "backward nothing waits on is run (and timed) without it",
        edits=[('                        raise ValueError(f"stage {s} never runs {_show((kind, mb, c), arity)}")\n',
                "                        pass\n")],
        loses=["run_pipeline", "simulate"],
        cause=r"never runs|lost \(|lacks",
    ),
    Mutant(
        name="mse_hardcoded",
        why="run_pipeline scores every microbatch with mean squared error, whatever loss_fn it is handed",
        edits=[("y = loss_fn(y, targets[mb]) / m  # mean over microbatches",
                "y = torch.nn.functional.mse_loss(y, targets[mb]) / m  # mean over microbatches")],
        loses=["run_pipeline"],
        cause=r"loss_fn you are handed",
    ),
    Mutant(
        name="casts_to_float32",
        why="run_pipeline feeds the first piece microbatches[mb].float(): a float64 model cannot take them",
        edits=[("x = microbatches[mb] if c == 0 else", "x = microbatches[mb].float() if c == 0 else")],
        loses=["run_pipeline"],
        cause=r"cast nothing",
    ),
    Mutant(
        name="skips_parameters_without_gradient",
        why="run_pipeline returns the gradients that exist, leaving out a frozen parameter's instead of giving it "
            "zeros",
        edits=[("[(q.grad if q.grad is not None else torch.zeros_like(q)).detach().clone() for q in stage.parameters()]",
                "[q.grad.detach().clone() for q in stage.parameters() if q.grad is not None]")],
        loses=["run_pipeline"],
        cause=r"zeros for a parameter",
    ),
]
