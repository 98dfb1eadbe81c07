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

# The textbook all-reduces: the same numbers, bit for bit (each chunk summed in the ring order from the full inputs),
# computed without the ring. They replace ring_allreduce only, so its two phases stay the reference's. The signature
# is the ring's messages: every check that runs ring_allreduce reads them (the simulated ranks' counted trace, and
# the real processes' digests), so each of these loses all of those checks and keeps the phases'.


def _ring_order_from_inputs(indent: str) -> str:
    """Source lines that write into `flat` each chunk summed in the ring order from `inputs`, every rank's full
    tensor: chunk c is ((x_c + x_(c+1)) + ...) + x_(c-1), the contract's numbers, bit for bit."""
    return "\n".join(indent + line for line in [
        "for c, chunk in enumerate(split_chunks(flat, world)):",
        "    parts = [x.tensor_split(world)[c] for x in inputs]",
        "    acc = parts[c].clone()",
        "    for hop in range(1, world):",
        "        acc = acc + parts[(c + hop) % world]",
        "    chunk.copy_(acc)",
    ])


_TEXTBOOK_LOSES = _SIDE_CHANNEL_LOSES
_TEXTBOOK_KEEPS = ["reduce_scatter", "all_gather", "rs_public", "ag_public"]

MUTANTS = [
    Mutant(
        name="wrong_recv_chunk",
        cause=r"same chunk index",
        why="reduce-scatter adds the incoming chunk at (r - s + 1) instead of (r - s - 1): the wrong chunk index",
        edits=[("            recv_idx = (rank - step - 1) % world  # the one its left neighbour extended",
                "            recv_idx = (rank - step + 1) % world")],
        loses=["reduce_scatter", "float_order", "volume", "rs_public", "volume_public", *_EXACT],
    ),
    Mutant(
        name="step_sign",
        cause=r"chunk \(r - s\) % N|chunk indices",
        why="walks the chunks the wrong way: at step s sends chunk (r + s) and adds chunk (r + s - 1), a sign error",
        edits=[("            send_idx = (rank - step) % world  # the partial sum this rank extended last step (or its own)",
                "            send_idx = (rank + step) % world"),
               ("            recv_idx = (rank - step - 1) % world  # the one its left neighbour extended",
                "            recv_idx = (rank + step - 1) % world")],
        loses=["reduce_scatter", "float_order", "volume", "rs_public", "volume_public", *_EXACT],
    ),
    Mutant(
        name="reversed_ring",
        cause=r"right neighbour",
        why="sends to the left and receives from the right, while indexing chunks for the rightward ring (a sign error)",
        edits=[("    return (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size",
                "    return (comm.rank - 1) % comm.world_size, (comm.rank + 1) % comm.world_size")],
        loses=["reduce_scatter", "all_gather", "float_order", "rs_public", "ag_public", *_EXACT],
    ),
    Mutant(
        name="all_gather_adds",
        cause=r"overwrite",
        why="all-gather adds the incoming finished chunk to the stale partial sum instead of overwriting it",
        edits=[("            comm.send_recv(chunks[send_idx], right, chunks[recv_idx], left)  # overwrite: it is final",
                "            incoming = torch.empty_like(chunks[recv_idx])\n"
                "            comm.send_recv(chunks[send_idx], right, incoming, left)\n"
                "            chunks[recv_idx].add_(incoming)")],
        loses=["all_gather", "float_order", "ag_public", *_EXACT],
    ),
    Mutant(
        name="torch_chunk",
        cause=r"tensor_split\(flat, N\)",
        why="cuts with torch.chunk, which makes ceil(n/N)-sized chunks and can return fewer than N of them",
        edits=[("    return flat.tensor_split(world)", "    return flat.chunk(world) if flat.numel() else flat.tensor_split(world)")],
        loses=["reduce_scatter", "all_gather", "float_order", "volume", "rs_public", "volume_public", *_EXACT],
    ),
    Mutant(
        name="remainder_in_last_chunk",
        cause=r"tensor_split\(flat, N\)",
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
        cause=r"% world_size",
        why="computes the left neighbour as rank - 1 without % N, so rank 0 receives from rank -1",
        edits=[("    return (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size",
                "    return (comm.rank + 1) % comm.world_size, comm.rank - 1")],
        loses=["reduce_scatter", "all_gather", "float_order", "volume", "rs_public", "ag_public", "volume_public",
               *_EXACT],
    ),
    Mutant(
        name="skips_empty_chunks",
        cause=r"empty or not",
        why="skips the exchange when the chunk to send is empty, so ranks disagree on the number of exchanges",
        edits=[("            incoming = inbox[: chunks[recv_idx].numel()]",
                "            if chunks[send_idx].numel() == 0:\n"
                "                continue\n"
                "            incoming = inbox[: chunks[recv_idx].numel()]")],
        loses=["reduce_scatter", "volume", "allreduce", "distributed", "layouts"],
    ),
    Mutant(
        name="whole_buffer_ring",
        cause=r"one phase",
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
        cause=r"sends one chunk",
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
        cause=r"own dtype",
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
        cause=r"copy the result back|copied back",
        why="works on tensor.reshape(-1), which is a copy for a transposed tensor, and never writes the result back",
        edits=[("    tensor.copy_(flat.view(tensor.shape))", "    pass")],
        loses=["layouts", "allreduce", "distributed", "allreduce_public"],
    ),
    # The red team's side channel: the sums travel outside comm.send_recv, and the ring only carries dummies of the
    # right sizes, so the counts and the results were right. Only ring_allreduce cheats; its two phases stay honest.
    Mutant(
        name="side_channel_files",
        cause=r"only channel",
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
        cause=r"only channel",
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
        cause=r"all_reduce",
        why="hands the work to torch.distributed.all_reduce instead of building it from send_recv",
        edits=[("""    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)""",
                """    import torch.distributed as dist

    dist.all_reduce(tensor)""")],
        loses=["allreduce", "float_order", "layouts", "volume", "distributed", "allreduce_public", "volume_public"],
    ),
    # Textbook: right numbers, technique skipped (issue 36). Each sums in the ring order from the full inputs, so
    # its results equal the contract's bit for bit (tests/test_ring_allreduce_signature.py shows it in-process);
    # only its messages give it away.
    Mutant(
        name="textbook_allgather_then_sum",
        cause=r"one phase",
        why="every rank passes its whole tensor around the ring (an all-gather of full tensors, (N - 1) n elements "
            "per rank) and sums all N copies locally, in the ring order",
        edits=[(_ALLREDUCE_BODY, """    rank, world = comm.rank, comm.world_size
    right, left = neighbours(comm)
    with flat_view(tensor) as flat:
        inputs = [flat.clone() if j == rank else torch.empty_like(flat) for j in range(world)]
        for step in range(world - 1):
            comm.send_recv(inputs[(rank - step) % world], right, inputs[(rank - step - 1) % world], left)
""" + _ring_order_from_inputs(" " * 8))],
        loses=_TEXTBOOK_LOSES,
        keeps=_TEXTBOOK_KEEPS,
    ),
    Mutant(
        name="textbook_root_reduce",
        cause=r"sends one chunk",
        why="rank 0 receives every rank's whole tensor, sums them in the ring order and sends the sum back to each: "
            "rank 0 moves (N - 1) n elements each way",
        edits=[(_ALLREDUCE_BODY, """    rank, world = comm.rank, comm.world_size
    with flat_view(tensor) as flat:
        nothing = torch.empty(0, dtype=flat.dtype)
        if rank == 0:
            inputs = [flat.clone()] + [torch.empty_like(flat) for _ in range(1, world)]
            for peer in range(1, world):
                comm.send_recv(nothing, peer, inputs[peer], peer)
""" + _ring_order_from_inputs(" " * 12) + """
            for peer in range(1, world):
                comm.send_recv(flat, peer, nothing, peer)
        else:
            comm.send_recv(flat, 0, nothing, 0)
            comm.send_recv(nothing, 0, flat, 0)""")],
        loses=_TEXTBOOK_LOSES,
        keeps=_TEXTBOOK_KEEPS,
    ),
    Mutant(
        name="textbook_direct_exchange",
        cause=r"direct exchange|\(r \+ 1\) % N",
        why="reduce-scatter and all-gather by direct exchange: at step s rank r sends to rank (r + s) % N the chunk "
            "that rank finishes, and later its own finished chunk: 2(N - 1) messages of one chunk, the ring's volume "
            "when N divides n, but not the ring (every pair of ranks talks)",
        edits=[(_ALLREDUCE_BODY, """    rank, world = comm.rank, comm.world_size
    with flat_view(tensor) as flat:
        chunks = split_chunks(flat, world)
        mine = (rank + 1) % world  # the chunk this rank finishes, as in the ring
        copies = {rank: chunks[mine].clone()}
        for step in range(1, world):
            dst, src = (rank + step) % world, (rank - step) % world
            copies[src] = torch.empty_like(chunks[mine])
            comm.send_recv(chunks[(dst + 1) % world], dst, copies[src], src)
        acc = copies[mine].clone()
        for hop in range(1, world):
            acc = acc + copies[(mine + hop) % world]
        chunks[mine].copy_(acc)
        for step in range(1, world):
            dst, src = (rank + step) % world, (rank - step) % world
            comm.send_recv(chunks[mine], dst, chunks[(src + 1) % world], src)""")],
        loses=_TEXTBOOK_LOSES,
        keeps=_TEXTBOOK_KEEPS,
    ),
    # Contract clauses drawn on every grade since issue 36 (before, by chance or not at all).
    Mutant(
        name="returns_the_tensor",
        cause=r"returns nothing",
        why="ring_allreduce and ring_all_gather return the tensor as well as writing it in place; the contract says "
            "they return None",
        edits=[("    if comm.world_size == 1:\n        return\n", "    if comm.world_size == 1:\n        return tensor\n"),
               (_ALLREDUCE_BODY, _ALLREDUCE_BODY + "\n    return tensor"),
               ("            comm.send_recv(chunks[send_idx], right, chunks[recv_idx], left)  # overwrite: it is final",
                "            comm.send_recv(chunks[send_idx], right, chunks[recv_idx], left)  # overwrite: it is final\n"
                "    return tensor")],
        loses=["layouts", "all_gather"],
        keeps=["allreduce", "float_order", "volume", "reduce_scatter"],
    ),
    Mutant(
        name="phases_skip_copy_back",
        cause=r"caller's tensor",
        why="ring_reduce_scatter and ring_all_gather work on tensor.reshape(-1) and never copy it back: right when "
            "ring_allreduce hands them its flat buffer, lost on a non-contiguous tensor given to them directly",
        edits=[("    right, left = neighbours(comm)\n    with flat_view(tensor) as flat:\n        chunks = split_chunks(flat, world)\n"
                "        inbox",
                "    right, left = neighbours(comm)\n    with contextlib.nullcontext(tensor.reshape(-1)) as flat:\n"
                "        chunks = split_chunks(flat, world)\n        inbox"),
               ("    with flat_view(tensor) as flat:\n        chunks = split_chunks(flat, world)\n        for step",
                "    with contextlib.nullcontext(tensor.reshape(-1)) as flat:\n        chunks = split_chunks(flat, world)\n"
                "        for step")],
        loses=["reduce_scatter", "all_gather"],
        keeps=["allreduce", "float_order", "layouts", "volume", "rs_public", "ag_public"],
    ),
]
