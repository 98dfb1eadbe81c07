"""Known-wrong zero_sharding submissions: the mistakes students make, each as an edit of the reference.

The signature is what each rank holds (`memory`) and sends (`traffic`), and in stage 3 how many gathered layers
are alive at once (`stage3`). The textbook stage 3 gathers every layer once, up front, and keeps them for the
backward: right values, less traffic even, and every layer's full weights alive at once, so it loses `stage3`
and keeps the rest. The all-reduce-then-slice stages 1 and 2 are right too and lose only `traffic`.
"""

from tests.known_wrong import Mutant

_FWD = "            w = gather(i)\n            h = fn(h, w)\n            del w\n"
_BWD = "        w = gather(i).requires_grad_(True)\n"

MUTANTS = [
    Mutant(
        name="textbook_gather_all_up_front",
        why="stage 3 gathers every layer's weights before the forward and keeps them for the backward",
        cause=r"gathered layers were alive at once",
        edits=[(_FWD, "            h = fn(h, ws[i])\n"),
               ("    inputs = []\n    h = x\n", "    inputs = []\n    h = x\n    ws = [gather(i) for i in range(len(layers))]\n"),
               (_BWD, "        w = ws[i].detach().requires_grad_(True)\n")],
        loses=["stage3"],
        keeps=["partition", "adamw", "stages_agree", "memory", "traffic", "clip", "step_public", "memory_public",
               "distributed"],  # distributed compares with the simulated run of the same code: it cannot see the peak
    ),
    Mutant(
        name="stage2_allreduce_then_slice",
        why="stage 2 all-reduces the full gradient, keeps its own slice, then all-gathers the parameters: 3 Psi",
        cause=r"An all-reduce of the full gradient already costs 2 Psi",
        edits=[("            self.grad.copy_(self.comm.reduce_scatter_flat(grad.float()) / n)\n",
                "            a, b = self.ranges[0]\n"
                "            self.grad.copy_(self.comm.all_reduce(grad.float())[a:b] / n)\n")],
        loses=["traffic"],
        keeps=["partition", "adamw", "stages_agree", "memory", "stage3", "clip", "memory_public",
               "distributed"],  # the same calls on processes: distributed does not count elements
    ),
    Mutant(
        name="stage1_allreduce_grads",
        why="stage 1 all-reduces the full gradient and slices it, then all-gathers: right values, 3 Psi sent",
        cause=r"An all-reduce of the full gradient already costs 2 Psi|expected one reduce_scatter_flat",
        edits=[("            mean = (self.comm.reduce_scatter_flat(self.grad.float()) / n).to(self.param_dtype).float()\n",
                "            a, b = self.ranges[0]\n"
                "            mean = (self.comm.all_reduce(self.grad.float())[a:b] / n).to(self.param_dtype).float()\n")],
        loses=["traffic", "step_public"],
        keeps=["partition", "adamw", "stages_agree", "memory", "stage3", "clip"],
    ),
    Mutant(
        name="sum_not_mean",
        why="the reduced gradient is the sum over ranks, never divided by world_size",
        cause=r"MEAN over|divides by world_size|step divides by world_size",
        edits=[("        n = self.comm.world_size\n        if self.stage == 0:\n",
                "        n = 1\n        if self.stage == 0:\n")],
        loses=["step_public", "stages_agree", "stage3"],  # clip keeps: a clipped sum and a clipped mean are equal
    ),
    Mutant(
        name="stage2_keeps_full_grad",
        why="stage 2 keeps a full-size gradient buffer and reduce-scatters from it, as stage 1 does",
        cause=r"Stage 2 keeps only its piece of the gradient|memory_bytes\(\) sums to",
        edits=[("            grad_numel = self.shard_numel if self.stage == 2 else self.numel\n",
                "            grad_numel = self.numel\n"),
               ("        elif self.stage == 1:\n", "        elif self.stage in (1, 2):\n")],
        loses=["memory", "memory_public"],
        keeps=["partition", "adamw", "stages_agree", "traffic", "stage3", "clip", "step_public"],
    ),
    Mutant(
        name="update_bf16_params",
        why="no fp32 master: each step's update is written into param_dtype values, so small updates round away",
        cause=r"fp32 master|rounds away",
        edits=[("        self.master.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)\n",
                "        self.master.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)\n"
                "        self.master.copy_(self.master.to(self.param_dtype))\n")],
        loses=["adamw"],
    ),
    Mutant(
        name="local_norm_clip",
        why="each rank clips by the norm of its own piece of the gradient",
        cause=r"GLOBAL norm|global norm",
        edits=[("            if self.stage > 0:                                # each rank holds only its piece: sum the squares\n"
                "                sq = self.comm.all_reduce(sq.reshape(1))[0]\n", "")],
        loses=["clip", "traffic", "distributed"],  # distributed's stage 2 clips (against the fp64 oracle)
        keeps=["partition", "adamw", "stages_agree", "memory", "stage3"],
    ),
    Mutant(
        name="stage3_no_free",
        why="stage 3 keeps every layer it gathers in the optimizer",
        cause=r"gathered layers were alive at once",
        edits=[("        return comm.all_gather_flat(opt.params()[starts[i]:starts[i + 1]], layers[i][1])\n",
                "        w = comm.all_gather_flat(opt.params()[starts[i]:starts[i + 1]], layers[i][1])\n"
                "        opt.gathered.append(w)\n        return w\n"),
               ("        self.t = 0\n", "        self.t = 0\n        self.gathered: list[torch.Tensor] = []\n")],
        loses=["stage3"],
    ),
    Mutant(
        name="threads_share_params",
        why="stages 1-2 post their new piece in a module-level dict and read the others' pieces from it after a "
            "one-element all-reduce (a barrier): the simulated ranks are threads of one process, so no all-gather "
            "is needed there",
        cause=r"all-gather of the new parameters|all_gather_flat of the new parameters",
        edits=[("def shard_range(", "_SHARED: dict = {}  # rank -> (start, stop, piece): seen by every thread\n\n\n"
                                    "def shard_range("),
               ("            self.param.copy_(self.comm.all_gather_flat(self.master.to(self.param_dtype), self.numel))\n",
                "            a, b = self.ranges[0]\n"
                "            _SHARED[self.comm.rank] = (a, b, self.master.to(self.param_dtype))\n"
                "            self.comm.all_reduce(torch.zeros(1))             # a barrier: every piece is posted\n"
                "            for a, b, piece in [_SHARED[k] for k in range(self.comm.world_size)]:\n"
                "                self.param[a:b] = piece\n")],
        loses=["traffic", "step_public", "distributed"],  # on processes the dict holds this rank's piece only
        keeps=["partition", "adamw", "stages_agree", "memory", "stage3", "clip", "memory_public"],
    ),
    Mutant(
        name="floor_shards",
        why="every piece is numel // world_size: the remainder's elements belong to no rank",
        cause=r"floor every piece|tensor_split",
        edits=[("    start = rank * base + min(rank, extra)\n    stop = start + base + (1 if rank < extra else 0)\n",
                "    start = rank * base\n    stop = start + base\n")],
        loses=["partition_public", "partition", "stages_agree"],
    ),
]
