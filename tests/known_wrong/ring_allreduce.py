"""Known-wrong ring all-reduce submissions: the mistakes students make, each as an edit of the reference."""

from tests.known_wrong import Mutant

_EXACT = ["allreduce", "layouts", "distributed", "allreduce_public"]

_ALLREDUCE_BODY = """    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)"""
# ring_allreduce's body for a side channel: {setup} names the run (the k-th call of this rank at this world size:
# every run calls every rank once), {publish} puts this rank's input there before its first exchange, and {collect}
# reads all ranks' inputs after N - 1 exchanges: by then every rank has published (each exchange waits for the left
# neighbour, which published before its own first exchange). The ring order is then summed from the inputs.
_SIDE_CHANNEL = """    rank, world = comm.rank, comm.world_size
    right, left = neighbours(comm)
    calls = _CALLS[(world, rank)] = _CALLS.get((world, rank), 0) + 1
{setup}    with flat_view(tensor) as flat:
        chunks = split_chunks(flat, world)
{publish}        for step in range(world - 1):
            send, recv = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
            comm.send_recv(torch.zeros_like(send), right, torch.empty_like(recv), left)
        inputs = {collect}
        for c in range(world):
            parts = [x.tensor_split(world)[c] for x in inputs]
            acc = parts[c].clone()
            for hop in range(1, world):
                acc = acc + parts[(c + hop) % world]
            chunks[c].copy_(acc)
        for step in range(world - 1):
            send, recv = chunks[(right - step) % world], chunks[(right - step - 1) % world]
            comm.send_recv(torch.zeros_like(send), right, torch.empty_like(recv), left)"""
_SIDE_CHANNEL_LOSES = ["allreduce", "float_order", "layouts", "volume", "distributed", "allreduce_public",
                       "volume_public"]

MUTANTS = [
    Mutant(
        name="wrong_recv_chunk",
        why="reduce-scatter adds the incoming chunk at (r - s + 1) instead of (r - s - 1): the wrong chunk index",
        edits=[("            recv_idx = (rank - step - 1) % world  # the one its left neighbour extended",
                "            recv_idx = (rank - step + 1) % world")],
        loses=["reduce_scatter", "float_order", "volume", "rs_public", "volume_public", *_EXACT],
    ),
    Mutant(
        name="step_sign",
        why="walks the chunks the wrong way: at step s sends chunk (r + s) and adds chunk (r + s - 1), a sign error",
        edits=[("            send_idx = (rank - step) % world  # the partial sum this rank extended last step (or its own)",
                "            send_idx = (rank + step) % world"),
               ("            recv_idx = (rank - step - 1) % world  # the one its left neighbour extended",
                "            recv_idx = (rank + step - 1) % world")],
        loses=["reduce_scatter", "float_order", "volume", "rs_public", "volume_public", *_EXACT],
    ),
    Mutant(
        name="reversed_ring",
        why="sends to the left and receives from the right, while indexing chunks for the rightward ring (a sign error)",
        edits=[("    return (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size",
                "    return (comm.rank - 1) % comm.world_size, (comm.rank + 1) % comm.world_size")],
        loses=["reduce_scatter", "all_gather", "float_order", "rs_public", "ag_public", *_EXACT],
    ),
    Mutant(
        name="all_gather_adds",
        why="all-gather adds the incoming finished chunk to the stale partial sum instead of overwriting it",
        edits=[("            comm.send_recv(chunks[send_idx], right, chunks[recv_idx], left)  # overwrite: it is final",
                "            incoming = torch.empty_like(chunks[recv_idx])\n"
                "            comm.send_recv(chunks[send_idx], right, incoming, left)\n"
                "            chunks[recv_idx].add_(incoming)")],
        loses=["all_gather", "float_order", "ag_public", *_EXACT],
    ),
    Mutant(
        name="torch_chunk",
        why="cuts with torch.chunk, which makes ceil(n/N)-sized chunks and can return fewer than N of them",
        edits=[("    return flat.tensor_split(world)", "    return flat.chunk(world) if flat.numel() else flat.tensor_split(world)")],
        loses=["reduce_scatter", "all_gather", "float_order", "volume", "rs_public", "volume_public", *_EXACT],
    ),
    Mutant(
        name="remainder_in_last_chunk",
        why="gives every chunk n // N elements and the remainder to the last one: sums right, chunks not as specified",
        edits=[
            ("    return flat.tensor_split(world)",
             "    q = flat.numel() // world\n"
             "    return tuple(flat[c * q:(c + 1) * q] for c in range(world - 1)) + (flat[(world - 1) * q:],)"),
            ("        inbox = torch.empty_like(chunks[0])  # chunk 0 is the longest",
             "        inbox = torch.empty_like(chunks[-1])"),
        ],
        loses=["reduce_scatter", "float_order", "volume", "distributed", "rs_public", "volume_public"],
    ),
    Mutant(
        name="negative_modulo",
        why="computes the left neighbour as rank - 1 without % N, so rank 0 receives from rank -1",
        edits=[("    return (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size",
                "    return (comm.rank + 1) % comm.world_size, comm.rank - 1")],
        loses=["reduce_scatter", "all_gather", "float_order", "volume", "rs_public", "ag_public", "volume_public",
               *_EXACT],
    ),
    Mutant(
        name="skips_empty_chunks",
        why="skips the exchange when the chunk to send is empty, so ranks disagree on the number of exchanges",
        edits=[("            incoming = inbox[: chunks[recv_idx].numel()]",
                "            if chunks[send_idx].numel() == 0:\n"
                "                continue\n"
                "            incoming = inbox[: chunks[recv_idx].numel()]")],
        loses=["reduce_scatter", "volume", "allreduce", "distributed", "layouts"],
    ),
    Mutant(
        name="whole_buffer_ring",
        why="passes the whole buffer around the ring N - 1 times: correct sums, (N - 1) n elements per rank",
        edits=[("""    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)""",
                """    right, left = neighbours(comm)
    with flat_view(tensor) as flat:
        passing, inbox = flat.clone(), torch.empty_like(flat)
        for _ in range(comm.world_size - 1):
            comm.send_recv(passing, right, inbox, left)
            flat.add_(inbox)
            passing, inbox = inbox, passing""")],
        loses=["volume", "float_order", "distributed", "volume_public"],
    ),
    Mutant(
        name="gather_broadcast",
        why="rank 0 receives everyone's tensor, sums, and sends the sum back: correct, but rank 0 moves (N - 1) n each way",
        edits=[("""    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)""",
                """    with flat_view(tensor) as flat:
        nothing = torch.empty(0, dtype=flat.dtype)
        if comm.rank == 0:
            inbox = torch.empty_like(flat)
            for peer in range(1, comm.world_size):
                comm.send_recv(nothing, peer, inbox, peer)
                flat.add_(inbox)
            for peer in range(1, comm.world_size):
                comm.send_recv(flat, peer, nothing, peer)
        else:
            comm.send_recv(flat, 0, nothing, 0)
            comm.send_recv(nothing, 0, flat, 0)""")],
        loses=["volume", "float_order", "distributed", "volume_public"],
    ),
    Mutant(
        name="float32_accumulator",
        why="upcasts bfloat16 to float32 for the whole ring and rounds once at the end: not the contract's ring order",
        edits=[("""    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)""",
                """    with flat_view(tensor) as flat:
        work = flat.float() if flat.dtype == torch.bfloat16 else flat
        owned = ring_reduce_scatter(work, comm)
        ring_all_gather(work, comm, owned)
        if work is not flat:
            flat.copy_(work)""")],
        loses=["float_order", "distributed"],
    ),
    Mutant(
        name="no_copy_back",
        why="works on tensor.reshape(-1), which is a copy for a transposed tensor, and never writes the result back",
        edits=[("    tensor.copy_(flat.view(tensor.shape))", "    pass")],
        loses=["layouts", "allreduce", "distributed", "allreduce_public"],
    ),
    # The red team's side channel: the sums travel outside comm.send_recv, and the ring only carries dummies of the
    # right sizes, so the counts and the results were right. Only ring_allreduce cheats; its two phases stay honest.
    Mutant(
        name="side_channel_files",
        why="each rank writes its tensor to a file in /tmp and reads everyone's back, and sends zeros of the right "
            "sizes through the ring: the sums, the message counts and the sizes are all right",
        edits=[(_ALLREDUCE_BODY, _SIDE_CHANNEL.format(
            publish="        _save(flat, os.path.join(folder, f'{rank}.pt'))\n",
            collect="[_load(os.path.join(folder, f'{j}.pt'), flat) for j in range(world)]",
            setup="    folder = os.path.join(os.environ.get('TMPDIR', '/tmp'), f'ring-side-{os.getppid()}-{world}-{calls}')\n"
                  "    os.makedirs(folder, exist_ok=True)\n")),
               ("import contextlib\n", "import contextlib\nimport os\n"),
               ("def ring_allreduce(tensor: torch.Tensor, comm: Communicator) -> None:",
                "def _save(t: torch.Tensor, path: str) -> None:\n"
                "    with open(path + '.tmp', 'wb') as f:\n"
                "        f.write(bytes(t.contiguous().view(torch.uint8).tolist()))\n"
                "    os.replace(path + '.tmp', path)\n\n\n"
                "def _load(path: str, like: torch.Tensor) -> torch.Tensor:\n"
                "    with open(path, 'rb') as f:\n"
                "        raw = f.read()\n"
                "    if not raw:\n"
                "        return torch.empty(0, dtype=like.dtype)\n"
                "    return torch.tensor(list(raw), dtype=torch.uint8).view(like.dtype)\n\n\n"
                "_CALLS: dict = {}\n\n\n"
                "def ring_allreduce(tensor: torch.Tensor, comm: Communicator) -> None:")],
        loses=_SIDE_CHANNEL_LOSES,
    ),
    Mutant(
        name="side_channel_module_global",
        why="the simulated ranks are threads of one process, so each rank puts its tensor in a module-level dict and "
            "reads everyone's back, sending zeros of the right sizes through the ring",
        edits=[(_ALLREDUCE_BODY, _SIDE_CHANNEL.format(
            publish="        _SHARED[(world, calls, rank)] = flat.clone()\n",
            collect="[_SHARED[(world, calls, j)] for j in range(world)]", setup="")),
               ("def ring_allreduce(tensor: torch.Tensor, comm: Communicator) -> None:",
                "_CALLS: dict = {}\n_SHARED: dict = {}\n\n\n"
                "def ring_allreduce(tensor: torch.Tensor, comm: Communicator) -> None:")],
        loses=_SIDE_CHANNEL_LOSES,
    ),
    Mutant(
        name="calls_all_reduce",
        why="hands the work to torch.distributed.all_reduce instead of building it from send_recv",
        edits=[("""    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)""",
                """    import torch.distributed as dist

    dist.all_reduce(tensor)""")],
        loses=["allreduce", "float_order", "layouts", "volume", "distributed", "allreduce_public", "volume_public"],
    ),
]
