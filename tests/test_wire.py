"""The reply decoder admits data only; the probes behave the same in both modes."""

import collections
import io
import os
import pickle

import numpy as np
import pytest
import torch

from grader.harness import counters, guard, integrity, wire


def roundtrip(value):
    handles = []
    data = wire.encode_reply({"ok": True, "value": value}, keep=lambda obj: handles.append(obj) or len(handles))
    return wire.decode_reply(data, make_handle=lambda hid, name: ("handle", hid, name))["value"], handles


def test_values_roundtrip_field_by_field():
    Point = collections.namedtuple("Point", "x y")
    value = {"t": torch.arange(3), "n": Point(1.5, [torch.ones(2)]), "a": np.arange(4), ("k", 1): {1, 2},
             "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "none": None}
    back, _ = roundtrip(value)
    assert torch.equal(back["t"], torch.arange(3))
    assert type(back["n"]).__name__ == "Point" and back["n"].x == 1.5 and torch.equal(back["n"].y[0], torch.ones(2))
    assert isinstance(back["a"], np.ndarray) and back["a"].tolist() == [0, 1, 2, 3]
    assert back[("k", 1)] == {1, 2} and back["dtype"] is torch.bfloat16 and back["size"] == (2, 3)


def test_objects_that_cannot_travel_become_handles():
    class Manager:
        pass

    back, kept = roundtrip(Manager())
    assert back == ("handle", 1, "Manager") and isinstance(kept[0], Manager)


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_reply_that_would_run_code_is_rejected():
    with pytest.raises(wire.MalformedReply, match="not a torch.save archive"):
        wire.decode_reply(pickle.dumps({"ok": True, "value": Payload()}), make_handle=None)
    buf = io.BytesIO()
    torch.save({"ok": True, "value": Payload()}, buf)
    with pytest.raises(wire.MalformedReply):
        wire.decode_reply(buf.getvalue(), make_handle=None)


def test_untagged_dicts_and_unknown_tags_are_rejected():
    for tree in ({"ok": True}, {wire.TAG: "evil"}):
        buf = io.BytesIO()
        torch.save(tree, buf)
        with pytest.raises(wire.MalformedReply):
            wire.decode_reply(buf.getvalue(), make_handle=None)


def test_once_iterable_refuses_a_second_pass():
    it = wire.OnceIterable([1, 2], "the chunks")
    assert list(it) == [1, 2]
    with pytest.raises(RuntimeError, match="the chunks was already consumed"):
        list(it)
    assert list(pickle.loads(pickle.dumps(wire.OnceIterable([3])))) == [3]


def test_forbidden_restores_functions_and_methods():
    original, method = torch.softmax, torch.Tensor.softmax
    with guard.forbidden(["torch.softmax", "torch.Tensor.softmax"], "write it yourself"):
        with pytest.raises(integrity.ForbiddenCall, match="must not call torch.softmax: write it yourself"):
            torch.softmax(torch.ones(2), 0)
        with pytest.raises(integrity.ForbiddenCall):
            torch.ones(2).softmax(0)
    assert torch.softmax is original and torch.Tensor.softmax == method
    assert "softmax" not in vars(torch.Tensor)


def test_line_counter_counts_only_the_named_file(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("def loop(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total\n")
    namespace = {}
    exec(compile(src.read_text(), str(src), "exec"), namespace)
    counts = []
    for n in (3, 30):
        with counters.LineCounter(str(src)) as counter:
            namespace["loop"](n)
        counts.append(counter.count)
    assert counts[1] > counts[0] > 0, counts


def test_a_named_tuple_from_the_worker_can_travel_back(tmp_path):
    """Results come back as named tuples of classes made by the decoder; tests pass them on again."""
    from grader.harness.client import Sandbox
    from grader.harness.session import StudentSession

    path = tmp_path / "nt.py"
    path.write_text("import collections\nPair = collections.namedtuple('Pair', 'a b')\n"
                    "def make():\n    return Pair(1, [2])\ndef total(p):\n    return p.a + p.b[0]\n")
    student = StudentSession("sandbox", lambda _id: path, Sandbox(), lambda _id: 30.0)
    try:
        mod = student.load("nt")
        pair = mod.make()
        assert type(pair).__name__ == "Pair" and pair.a == 1
        assert mod.total(pair) == 3
    finally:
        student.close()


def test_a_view_that_repeats_a_tiny_storage_is_counted_by_what_it_stands_for():
    """zeros(1).expand(2**28) is 4 bytes on the wire and 1 GiB here: the reply's limit counts the
    latter, and a view that fits is materialised, so no message or oracle meets an overlapping view."""
    import torch

    from grader.harness import wire

    big = wire.encode_reply({"ok": True, "value": torch.zeros(1).expand(1 << 28)}, lambda obj: 0)
    assert len(big) < 4096
    with pytest.raises(wire.MalformedReply, match=r"more than 256 MiB in all \(one of shape \[268435456\] stands for 1024 MiB\)"):
        wire.decode_reply(big, lambda *a: None, max_bytes=256 << 20)
    small = wire.encode_reply({"ok": True, "value": torch.arange(3.0)[:1].expand(1000)}, lambda obj: 0)
    value = wire.decode_reply(small, lambda *a: None, max_bytes=1 << 20)["value"]
    assert value.shape == (1000,) and value.untyped_storage().nbytes() == 4000 and value.stride() == (1,)


def test_to_wire_runs_none_of_the_students_code():
    """The reply is built after the call, outside the probes: a subclass that computes when read
    (its own __iter__, __int__, __torch_function__) travels as a handle, never through its methods."""
    import collections

    from grader.harness.wire import to_wire

    ran = []

    class Rows(list):
        def __iter__(self):
            ran.append("list.__iter__")
            return super().__iter__()

    class Count(int):
        def __int__(self):
            ran.append("int.__int__")
            return 0

    class Lazy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            ran.append("__torch_function__")
            return super().__torch_function__(func, types, args, kwargs or {})

    Point = collections.namedtuple("Point", "x y")

    class Sneaky(Point):
        def __iter__(self):
            ran.append("namedtuple.__iter__")
            return super().__iter__()

    class Route(Point):  # an honest subclass of a named tuple still travels as one
        __slots__ = ()

    for value in (Rows([1]), Count(3), torch.ones(2).as_subclass(Lazy), Sneaky(1, 2)):
        wired = to_wire(value, keep=lambda _v: 5)
        assert wired["__wire__"] == "handle", f"{type(value).__name__} travelled as {wired}"
    assert ran == [], f"to_wire ran the student's {ran}"
    assert to_wire(Route(1, torch.ones(1)), keep=lambda _v: 5)["fields"] == ["x", "y"]


def test_the_worker_sends_a_bounded_exception_text():
    """The grader reads what the worker sends: a 200 MB exception message is cut in the worker."""
    from grader.harness import worker

    try:
        raise ValueError("x" * (worker.MAX_TEXT * 4))
    except ValueError as exc:
        text, trace = worker._exception_text(exc), worker.student_traceback(exc, __file__)
    assert len(text) < worker.MAX_TEXT + 100 and text.endswith("more characters)")
    assert len(trace) < worker.MAX_TEXT + 100


def _resources(fn):
    """(seconds, peak resident MiB growth) of fn() in this process, and what it raised."""
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    try:
        fn()
        raised = None
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        raised = exc
    return time.monotonic() - start, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, raised


def _raw_reply(tree) -> bytes:
    """Bytes a hostile worker could send: any tree torch.save writes, not only what to_wire makes."""
    buf = io.BytesIO()
    torch.save(tree, buf)
    return buf.getvalue()


@pytest.mark.parametrize("what, tree, expect", [
    ("5,000 0-d tensors (the red team sent 500,000)", lambda: [torch.zeros(()) for _ in range(5_000)],
     "more than 4096 tensors"),
    ("a list shared 2**22 times", lambda: _shared_dag(22), "more than 500,000 values"),
    ("600,000 empty lists (the red team sent 20,000,000)", lambda: [[] for _ in range(600_000)],
     "more than 1 MiB to describe"),
])
def test_a_reply_of_many_small_values_is_refused_before_it_costs_the_grader(what, tree, expect):
    """Decoding used to rebuild whatever the worker sent: half a million 0-d tensors cost the grader's
    process 1.2-3 GB and ran past the call's deadline. The archive's entries and its pickle are bounded
    before torch.load runs, and values are counted as they are rebuilt (a shared list counts each time)."""
    data = _raw_reply(tree())
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(data, lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and expect in str(raised), f"{what}: found {raised!r}"
    assert seconds < 5 and grew_mib < 300, f"{what}: refusing took {seconds:.1f} s and {grew_mib:.0f} MiB"


def _shared_dag(depth: int) -> list:
    x = [0]
    for _ in range(depth):
        x = [x, x]
    return x


def test_an_archive_unlike_torch_saves_is_refused():
    """torch.save writes stored (uncompressed) entries: a compressed one could expand past every limit."""
    import zipfile

    data = _raw_reply([torch.zeros(1000)])
    source = zipfile.ZipFile(io.BytesIO(data))
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info))
    with pytest.raises(wire.MalformedReply, match="compressed entry"):
        wire.decode_reply(packed.getvalue(), lambda *a: None)
    with pytest.raises(wire.MalformedReply, match="not a torch.save archive"):
        wire.decode_reply(b"\x80\x04K\x01.", lambda *a: None)
    assert torch.equal(wire.decode_reply(data, lambda *a: None)[0], torch.zeros(1000))


def test_rebuilding_a_reply_stops_at_its_deadline():
    import time

    data = wire.encode_reply({"ok": True, "value": [[i] for i in range(30_000)]}, lambda obj: 0)
    with pytest.raises(wire.MalformedReply, match="longer to rebuild than the call's time limit"):
        wire.decode_reply(data, lambda *a: None, deadline=time.monotonic() - 1)
    assert len(wire.decode_reply(data, lambda *a: None, deadline=time.monotonic() + 60)["value"]) == 30_000


def _archive(pickled: bytes) -> bytes:
    """A reply archive laid out as torch.save's, holding the given pickle: what a worker that writes its own
    frame to the socket can send."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as out:
        out.writestr("archive/data.pkl", pickled)
        out.writestr("archive/version", "3\n")
    return buf.getvalue()


def _colliding_dict(n: int) -> bytes:
    """A protocol-2 pickle of one dict whose n int keys all hash alike (k * (2**61 - 1)): quadratic to build."""
    body = b"".join(pickle.dumps(k * (2**61 - 1), protocol=2)[2:-1] + b"N" for k in range(1, n + 1))
    return b"\x80\x02}(" + body + b"u."


@pytest.mark.parametrize("what, pickled, expect", [
    ("a dict of colliding keys", _colliding_dict(20_000), "dict of more than 16 items"),
    ("a set", b"\x80\x02]\x8f(K\x01K\x02\x90.", "opcode the wire never writes (EMPTY_SET)"),
    ("an OrderedDict built from pairs", b"\x80\x02ccollections\nOrderedDict\n]("
     + b"".join(b"K%cK\x00\x86" % i for i in range(100)) + b"e\x85R.", "more arguments than any reply needs"),
    ("a global the wire never writes", b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00id\x85R.", "global the wire never writes"),
], ids=["colliding dict", "set", "OrderedDict of pairs", "os.system"])
def test_a_pickle_the_wire_never_writes_is_refused_before_torch_load(what, pickled, expect):
    """A worker can write its own frame to the socket. A dict of 20,000 colliding keys cost torch.load 4 s (580,000
    would take hours, in C, past every deadline) and 8 MiB of EMPTY_SET opcodes 1.9 GB: the pickle is scanned first."""
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(_archive(pickled), lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and expect in str(raised), f"{what}: found {raised!r}"
    assert seconds < 2 and grew_mib < 100, f"{what}: refusing took {seconds:.1f} s and {grew_mib:.0f} MiB"


def test_a_named_tuple_of_many_fields_is_refused_before_its_class_is_made():
    """400,000 field names cost 2 bytes each on the wire (one memoised string) and ~200 MB per million in the
    grader, where collections.namedtuple built the class before anything counted the fields."""
    tree = {wire.TAG: "namedtuple", "name": "Evil", "fields": ["a"] * 400_000, "values": [1]}
    data = _raw_reply(tree)
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(data, lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and "at most 256" in str(raised), raised
    assert seconds < 5 and grew_mib < 150, f"refusing took {seconds:.1f} s and {grew_mib:.0f} MiB"


def test_a_mutation_path_indexes_only_by_ints_and_strs():
    """A reply's `mutated` paths are walked here: a tensor key ([25000, 1] and [1, 25000] zeros) used to build a
    25000 x 25000 tensor by advanced indexing in the grader (2.7 GB from a 400 KB reply)."""
    from grader.harness.client import _copy_back

    H = torch.zeros(4, 4)
    a, b = torch.zeros(25000, 1, dtype=torch.int64), torch.zeros(1, 25000, dtype=torch.int64)
    seconds, grew_mib, raised = _resources(lambda: _copy_back(([H], {}), [[[0, 0, (a, b)], torch.ones(4, 4)]]))
    assert raised is None and grew_mib < 100 and torch.equal(H, torch.zeros(4, 4)), (raised, grew_mib)
    _copy_back(([H], {}), [[[0, 0], torch.ones(4, 4)]])
    assert torch.equal(H, torch.ones(4, 4)), "a plain path still copies the allowed change back"


def test_dict_keys_that_share_one_hash_are_refused():
    """A tagged dict whose int keys all hash alike (k * (2**61 - 1)) would take quadratic time to build here."""
    keys = [k * (2**61 - 1) for k in range(1, 5000)]
    data = _raw_reply({wire.TAG: "dict", "items": [[k, None] for k in keys]})
    with pytest.raises(wire.MalformedReply, match="magnitude no contract returns"):
        wire.decode_reply(data, lambda *a: None)
    fine = wire.encode_reply({"ok": True, "value": {i: -i for i in range(5000)}}, lambda obj: 0)
    assert wire.decode_reply(fine, lambda *a: None)["value"][4999] == -4999


def _nested_encode(depth: int) -> bytes:
    """encode(encode(...encode('a', 'latin1')..., 'hex'), 'hex'): each level doubles the bytes."""
    body = b"c_codecs\nencode\nX\x01\x00\x00\x00aX\x06\x00\x00\x00latin1\x86R"
    for _ in range(depth):
        body = b"c_codecs\nencode\n" + body + b"X\x03\x00\x00\x00hex\x86R"
    return b"\x80\x02" + body + b"."


@pytest.mark.parametrize("what, pickled", [
    ("nested hex, 2**30 bytes from 1.6 KB", _nested_encode(30)),
    ("punycode of many distinct characters", b"\x80\x02c_codecs\nencode\nX" + len("".join(map(chr, range(0x10000, 0x10400))).encode()).to_bytes(4, "little")
     + "".join(map(chr, range(0x10000, 0x10400))).encode() + b"X\x08\x00\x00\x00punycode\x86R."),
], ids=["hex", "punycode"])
def test_bytes_are_rebuilt_only_the_way_torch_save_writes_them(what, pickled):
    """The unpickler runs _codecs.encode for bytes; with any codec it grew 1.6 KB into 11 GB (nested 'hex') or spent
    240 s on 190 KB ('punycode') inside torch.load, before any budget or deadline. Only encode(<str>, 'latin1')."""
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(_archive(pickled), lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and "a call the wire never writes" in str(raised), raised
    assert seconds < 2 and grew_mib < 50, f"{what}: {seconds:.1f} s, {grew_mib:.0f} MiB"


def test_the_pickle_scanned_is_the_one_torch_load_reads():
    """A hostile pickle first and a benign one last under the same name: torch.load read the first, the scan the
    last (an EMPTY_SET reply passed). Repeated or mixed entries are refused."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        out.writestr("archive/data.pkl", b"\x80\x02]\x8f(K\x01\x90.")
        out.writestr("archive/data.pkl", b"\x80\x02N.")
    with pytest.raises(wire.MalformedReply, match="repeats an entry"):
        wire.decode_reply(buf.getvalue(), lambda *a: None)


def _with_pickle_edit(data: bytes, old: bytes, new: bytes) -> bytes:
    """An honest reply archive with one edit to its pickle: what a worker writing its own frame can send."""
    import zipfile

    src, buf = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            body = src.read(info)
            if info.filename.endswith("/data.pkl"):
                assert old in body, "the honest pickle changed shape; update the edit"
                body = body.replace(old, new, 1)
            out.writestr(info.filename, body)
    return buf.getvalue()


def test_a_tensor_larger_than_its_storage_is_refused_before_torch_load():
    """torch.load's rebuild calls set_, which resizes a resizable storage to what the view claims. The scan checks
    each tensor's extent (offset, sizes, strides) against its storage's length before torch.load runs, so the
    grader does not rest on torch refusing to resize a storage read from the archive (torch 2.13 does)."""
    honest = wire.encode_reply({"ok": True, "value": torch.zeros(1)}, lambda obj: 0)
    assert torch.equal(wire.decode_reply(honest, lambda *a: None)["value"], torch.zeros(1))
    forged = _with_pickle_edit(honest, b"QK\x00K\x01\x85", b"QK\x00J\xff\xff\xff\x7f\x85")
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(forged, lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and "claims more elements than its storage" in str(raised), raised
    assert seconds < 2 and grew_mib < 50, f"refusing took {seconds:.1f} s and {grew_mib:.0f} MiB"
    offset_past_end = _with_pickle_edit(honest, b"QK\x00K\x01\x85", b"QK\x01K\x01\x85")
    with pytest.raises(wire.MalformedReply, match="claims more elements"):
        wire.decode_reply(offset_past_end, lambda *a: None)


def test_a_string_shared_many_times_counts_each_time():
    """A 540 KB string returned 4000 times is 2 bytes a repeat on the wire; the grader's repr of the value in a
    message then built gigabytes (the red team's grader pytest reached 8.6 GB). Every occurrence of text counts."""
    s = "x" * 540_000
    data = wire.encode_reply({"ok": True, "value": [s] * 4000}, lambda obj: 0)
    assert len(data) < 1_100_000, "the repeats are shared in the pickle: this reply is small on the wire"
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(data, lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and "MiB of text in all" in str(raised), raised
    assert seconds < 2 and grew_mib < 50, f"refusing took {seconds:.1f} s and {grew_mib:.0f} MiB"
    names = [f"op{i}" for i in range(30_000)]  # far more text than any honest reply, still well within
    assert wire.decode_reply(wire.encode_reply({"ok": True, "value": names}, lambda obj: 0), lambda *a: None)["value"] == names


@pytest.mark.parametrize("tree, expect", [
    ({wire.TAG: "namedtuple", "name": "R" * 400_000, "fields": ["a"], "values": [1]}, "at most 64 characters"),
    ({wire.TAG: "namedtuple", "name": "R", "fields": ["f" * 1_000_000], "values": [1]}, "at most 64 characters"),
    ([{wire.TAG: "namedtuple", "name": f"R{i}", "fields": ["a"], "values": [i]} for i in range(40)],
     "more than 16 kinds of named tuple"),
    ({wire.TAG: "handle", "id": 1, "type": [["t" * 1000] * 100] * 100}, "type is not a short string"),
    ({wire.TAG: "dict", "items": [[((k * (2**61 - 1),),), None] for k in range(1, 300)]}, "magnitude no contract"),
], ids=["long name", "long field name", "many classes", "handle type", "nested tuple keys"])
def test_a_reply_that_would_make_the_grader_build_or_hash_too_much_is_refused(tree, expect):
    """Each class of named tuple costs collections.namedtuple a build that grows with its names (a 1 MB field name:
    0.05 s; 9000 fresh classes took 145 s, past the deadline); a forged handle's type went through str() whole."""
    seconds, grew_mib, raised = _resources(lambda: wire.decode_reply(_raw_reply(tree), lambda *a: None))
    assert isinstance(raised, wire.MalformedReply) and expect in str(raised), raised
    assert seconds < 2 and grew_mib < 100, f"refusing took {seconds:.1f} s and {grew_mib:.0f} MiB"


def test_a_quantized_storage_is_refused():
    """No contract returns a quantized tensor; rebuilt without its quantizer it is a surface of torch no reply needs."""
    honest = wire.encode_reply({"ok": True, "value": torch.zeros(4, dtype=torch.int8)}, lambda obj: 0)
    forged = _with_pickle_edit(honest, b"torch\nCharStorage", b"torch\nQInt8Storage")
    with pytest.raises(wire.MalformedReply, match="global the wire never writes"):
        wire.decode_reply(forged, lambda *a: None)


def test_a_forged_error_is_read_as_strings_only():
    """The error fields of a reply went through str() whole: a nested list of shared strings was hundreds of GB."""
    from grader.harness.client import WorkerProcess

    nested = [["t" * 1000] * 100] * 100
    exc = WorkerProcess._student_error(None, {"type": nested, "mro": [nested, "ValueError"], "message": nested,
                                              "traceback": nested})
    assert len(str(exc)) < 100 and exc.student_traceback == "" and len(type(exc).__name__) < 100
    honest = WorkerProcess._student_error(None, {"type": "ValueError", "mro": ["ValueError", "Exception"],
                                                 "message": "bad shape", "traceback": "line 3"})
    assert isinstance(honest, ValueError) and "bad shape" in str(honest) and honest.student_traceback == "line 3"


def test_a_forged_exception_description_is_refused_without_formatting_it():
    """A getattr reply's `mro` went through str() entry by entry: a list of a thousand references to one tensor cost
    7 s an entry, after the reply had passed every decoding limit (a call held 102 s against a 30 s timeout)."""
    import time

    from grader.harness.client import CallOptions, StudentCrash, _attribute

    t = torch.zeros(1000, dtype=torch.bool)
    start = time.monotonic()
    with pytest.raises(StudentCrash, match="unreadable form"):
        _attribute({"kind": "exception", "mro": [[t] * 1000] * 49}, None, "module", ["x"], CallOptions())
    assert time.monotonic() - start < 1
    cls = _attribute({"kind": "exception", "mro": ["BadShape", "ValueError", "Exception"]}, None, "module", ["x"],
                     CallOptions())
    assert issubclass(cls, ValueError) and cls.__name__ == "BadShape"


FRAME_PROBE = """
import resource, socket, sys, threading, time
from grader.harness import wire

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

mode, size_mib = sys.argv[1], int(sys.argv[2])
ours, theirs = socket.socketpair()
chunk = bytes(1 << 20)

def send():
    theirs.sendall(wire._HEADER.pack(size_mib << 20))
    for _ in range(size_mib if mode == "whole" else 1):
        theirs.sendall(chunk)  # one buffer, resent: the sender pays nothing for what it announces

threading.Thread(target=send, daemon=True).start()
before = peak_mib()
try:
    frame = wire.recv_frame(ours, 1 << 30, time.monotonic() + (60 if mode == "whole" else 2))
    print("got", len(frame), frame[:4] == bytes(4))
except wire.FrameTimeout:
    print("timeout")
print("grew", peak_mib() - before)
"""


def _probe(mode: str, size_mib: int) -> tuple[str, float]:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", FRAME_PROBE, mode, str(size_mib)], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr
    first, grew = run.stdout.splitlines()
    return first, float(grew.split()[1])


def test_a_large_frame_is_held_once_not_twice():
    first, grew = _probe("whole", 256)
    assert first == f"got {256 << 20} True"
    assert grew < 256 * 1.25, (f"reading a 256 MiB frame grew the reader by {grew:.0f} MiB: the bytes must be held "
                               "once (chunks joined at the end cost twice the frame, before any check)")


def test_an_announced_frame_costs_nothing_until_its_bytes_arrive():
    first, grew = _probe("header", 512)
    assert first == "timeout"
    assert grew < 64, f"a header announcing 512 MiB (1 MiB sent) grew the reader by {grew:.0f} MiB"


def test_a_handles_type_name_carries_no_escape_sequence():
    made = []
    tree = {wire.TAG: "handle", "id": 3, "type": "\x1b]0;ALL PASSED\x07\x1b[2J\x1b[32mgptq 100/100\x1b[0m"}
    data = io.BytesIO()
    torch.save(tree, data)
    wire.decode_reply(data.getvalue(), lambda hid, name: made.append(name) or name)
    assert made and "\x1b" not in made[0] and "\x07" not in made[0], made


def test_a_reply_larger_than_a_small_frame_decodes_from_its_mapping():
    import socket
    import threading

    value = {"ok": True, "value": torch.arange(100_000, dtype=torch.float32)}  # 400 kB: read into a mapping
    data = wire.encode_reply(value, lambda obj: 0)
    assert len(data) > wire.SMALL_FRAME
    ours, theirs = socket.socketpair()
    threading.Thread(target=lambda: theirs.sendall(wire._HEADER.pack(len(data)) + data), daemon=True).start()
    frame = wire.recv_frame(ours, 1 << 30)
    reply = wire.decode_reply(frame, lambda hid, name: None)
    assert torch.equal(reply["value"], value["value"])
