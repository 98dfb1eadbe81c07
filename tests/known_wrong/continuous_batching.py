"""Known-wrong continuous_batching submissions: the mistakes students make, each as an edit of the reference.

The signature is that decodes never wait behind a prefill (`stall_free`). The textbook scheduler is vLLM v0's
default, prefill-prioritising: a step that can admit a waiting request runs prefills only. Its budget, blocks and
token accounting are right (it keeps `invariants` and `scaling`), and its decodes pause for every prefill step, so
it loses `stall_free` (and every check that compares steps with the rules). `waiting_first` admits waiting
requests before the running ones in the same step: the decodes get what the prompt leaves, nothing.
"""

from tests.known_wrong import Mutant

_SCHEDULE = """        scheduled: dict[int, int] = {}
        budget, preempted = self.schedule_running(self.config.max_num_batched_tokens, scheduled)
        if not preempted:
            self.schedule_waiting(budget, scheduled)
        return scheduled
"""

MUTANTS = [
    Mutant(
        name="textbook_prefill_first",
        why="a step that can admit waiting requests runs their prefills only; decodes resume when no prompt is "
            "waiting (vLLM v0's default schedule)",
        cause=r"running requests (are scheduled )?(before|first)|decodes? (never )?wait",
        edits=[(_SCHEDULE, """        scheduled: dict[int, int] = {}
        self.schedule_waiting(self.config.max_num_batched_tokens, scheduled)
        if scheduled:
            return scheduled
        budget, preempted = self.schedule_running(self.config.max_num_batched_tokens, scheduled)
        return scheduled
""")],
        loses=["stall_free", "schedule_equal", "schedule_public"],
        keeps=["invariants", "scaling"],
    ),
    Mutant(
        name="waiting_first",
        why="I admit the waiting prompts first, then give the running decodes whatever budget is left",
        cause=r"running requests (are scheduled )?(before|first)|decodes? (never )?wait",
        edits=[(_SCHEDULE, """        scheduled: dict[int, int] = {}
        old = len(self.running)
        budget = self.schedule_waiting(self.config.max_num_batched_tokens, scheduled)
        newcomers = self.running[old:]
        del self.running[old:]
        budget, preempted = self.schedule_running(budget, scheduled)
        self.running.extend(newcomers)
        return scheduled
""")],
        loses=["stall_free", "schedule_equal", "schedule_public"],
    ),
    Mutant(
        name="preempt_oldest",
        why="when the pool is short I evict the oldest running request, the head of the list",
        cause=r"newest|last running",
        edits=[("victim = self.running.pop()       # the newest running request",
                "victim = self.running.pop(0)")],
        loses=["preemption", "schedule_equal", "schedule_public"],
    ),
    Mutant(
        name="keep_progress_after_preempt",
        why="a preempted request gives back its blocks but keeps its num_computed, so it resumes where it was",
        cause=r"recompute",
        edits=[("        seq.num_blocks = 0\n        seq.num_computed = 0\n        self.waiting.appendleft(seq)\n",
                "        seq.num_blocks = 0\n        self.waiting.appendleft(seq)\n")],
        loses=["invariants", "preemption", "schedule_public"],
    ),
    Mutant(
        name="chunk_emits_token",
        why="every scheduled chunk produces a token, prefill chunks included",
        cause=r"partial (prefill )?chunk",
        edits=[("            if seq.num_computed == seq.num_tokens:  # caught up: this step sampled a new token\n",
                "            if True:  # every forward pass samples a token\n")],
        loses=["metrics", "schedule_equal", "schedule_public"],
    ),
    Mutant(
        name="blocks_for_new_only",
        why="I allocate ceil(n / block_size) new blocks for the n tokens scheduled, forgetting the partly filled "
            "block the request already holds",
        cause=r"already holds count",
        edits=[("        need = cdiv(seq.num_computed + n, self.config.block_size) - seq.num_blocks\n",
                "        need = cdiv(n, self.config.block_size)\n")],
        loses=["invariants", "schedule_equal", "schedule_public"],
    ),
    Mutant(
        name="admit_after_preempt",
        why="after preempting I still admit waiting requests with the budget left",
        cause=r"admits no waiting",
        edits=[("        if not preempted:\n            self.schedule_waiting(budget, scheduled)\n",
                "        self.schedule_waiting(budget, scheduled)\n")],
        loses=["preemption", "schedule_equal"],
    ),
    Mutant(
        name="admit_only_when_idle",
        why="I avoid stalls by admitting waiting requests only when nothing is running",
        cause=r"budget left in every step",
        edits=[("        if not preempted:\n            self.schedule_waiting(budget, scheduled)\n",
                "        if not preempted and len(self.running) == len(scheduled) == 0:\n"
                "            self.schedule_waiting(budget, scheduled)\n")],
        loses=["stall_free", "schedule_equal"],
    ),
    Mutant(
        name="scan_every_request",
        why="when a request finishes I rebuild running by walking every request ever added",
        cause=r"visits the finished requests",
        edits=[("        self.waiting: deque[Seq] = deque()\n",
                "        self.waiting: deque[Seq] = deque()\n        self.everyone: list[Seq] = []\n"),
               ("        self.seqs[request.id] = seq\n        self.waiting.append(seq)\n",
                "        self.seqs[request.id] = seq\n        self.waiting.append(seq)\n        self.everyone.append(seq)\n"),
               ("            self.running = [s for s in self.running if s.request.id in self.seqs]\n",
                "            keep = []\n"
                "            for s in self.everyone:\n"
                "                if s.request.id in self.seqs and s in self.running:\n"
                "                    keep.append(s)\n"
                "            keep.sort(key=self.running.index)\n"
                "            self.running = keep\n")],
        loses=["scaling"],
        keeps=["schedule_equal", "invariants", "preemption", "metrics", "stall_free"],
    ),
]
