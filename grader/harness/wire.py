"""What travels between the grader and the worker, and how it is framed.

Two directions, two levels of trust:

* grader -> worker (requests): the grader is trusted, so requests are plain pickles. They may carry
  torch modules, generators and anything else the test builds.
* worker -> grader (replies): the worker runs student code, so its bytes are hostile until proven
  otherwise. Replies are written with ``torch.save`` and read with ``torch.load(weights_only=True)``,
  whose unpickler admits only tensors, numbers, strings, bytes, dtypes and plain containers. Richer
  values (named tuples, numpy arrays, remote handles) travel as tagged dicts and are rebuilt here,
  field by field, after validation. A reply that tries to smuggle in any other object fails to decode
  and the test fails with "malformed result"; no code from the worker ever runs in the grader.

Frames are an 8-byte big-endian length followed by the payload.
"""

from __future__ import annotations

import collections
import io
import keyword
import mmap
import pickle
import re
import socket
import struct
import time
import zipfile
from typing import Any, Callable

TAG = "__wire__"
MAX_TEXT = 64 << 10  # characters of an exception's text or traceback that cross (cut in the worker, again here)
MAX_FIELDS = 256  # fields of a named tuple in a reply (the course's have at most 6)
MAX_NAME = 64  # characters of a named tuple's name or field name in a reply (the course's have at most 20)
MAX_CLASSES = 16  # distinct named-tuple classes in one reply (the course's replies hold at most 2)
# Characters of text (str and bytes) in one reply, every occurrence counted: a string shared 4000 times is 2
# bytes a time on the wire, and 2 GB once anything downstream (a message's repr) spells it out. Honest replies
# hold short field names and op names, and two exception texts cut to MAX_TEXT.
MAX_TEXT_TOTAL = 4 << 20
_HEADER = struct.Struct(">Q")
SMALL_FRAME = 1 << 16  # a frame up to this size is read into bytes; a larger one into a mapping

MODULE = "module"  # the root target name for the student's module in a worker's requests


class MalformedReply(Exception):
    """The worker sent bytes that are not a well-formed reply."""


class OnceIterable:
    """An iterable that may be iterated once. A second ``iter()`` raises with a message that teaches.

    Tests pass one where the contract says "the iterable may be consumed only once" (a stream of
    chunks that cannot be rewound). It travels to the worker as the list of its items.
    """

    def __init__(self, items, what: str = "this iterable"):
        self._items = list(items)
        self._what = what
        self._used = False

    def __iter__(self):
        if self._used:
            raise RuntimeError(
                f"{self._what} was already consumed: it can be read only once (one pass over the data)"
            )
        self._used = True
        return iter(self._items)

    def __reduce__(self):
        return (OnceIterable, (self._items, self._what))


class HandleRef:
    """A reference to an object kept in the worker, as it travels inside a request."""

    def __init__(self, hid: int):
        self.id = hid

    def __reduce__(self):
        return (HandleRef, (self.id,))


# --------------------------------------------------------------------------------------------------
# Framing


class FrameTimeout(Exception):
    """A frame did not arrive (or could not be sent) whole before its deadline."""


def _settimeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise FrameTimeout("the deadline passed")
    sock.settimeout(left)


def send_frame(sock: socket.socket, payload: bytes, deadline: float | None = None) -> None:
    """Send one frame; with a `deadline` (time.monotonic()), raise FrameTimeout if the peer stops reading."""
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    try:
        while data:
            _settimeout(sock, deadline)
            sent = sock.send(data[: 1 << 20])
            data = data[sent:]
    except socket.timeout:
        raise FrameTimeout("the peer stopped reading") from None
    finally:
        if deadline is not None:
            sock.settimeout(None)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes | mmap.mmap:
    """Exactly `n` bytes from `sock`, held once: a small frame as bytes, a larger one in an anonymous
    mapping that the bytes fill as they arrive (a header that announces a large frame costs nothing until
    the bytes come, and a frame that does come is held once, never copied: chunks joined at the end took
    twice its size, before anything in it was checked)."""
    if n <= SMALL_FRAME:
        buffer: bytearray | mmap.mmap = bytearray(n)
    else:
        buffer = mmap.mmap(-1, n)
    view, got = memoryview(buffer), 0
    try:
        while got < n:
            _settimeout(sock, deadline)
            try:
                k = sock.recv_into(view[got:], min(n - got, 1 << 20))
            except socket.timeout:
                raise FrameTimeout(f"{got} of {n} bytes arrived before the deadline") from None
            if not k:
                raise EOFError("the connection closed mid-frame")
            got += k
    finally:
        view.release()
    return bytes(buffer) if isinstance(buffer, bytearray) else buffer


def recv_frame(sock: socket.socket, max_bytes: int, deadline: float | None = None) -> bytes | mmap.mmap:
    """Read one frame (bytes, or for a large one a read-only-by-convention mapping that reads like a file:
    pass it to `as_file`). With a `deadline` (time.monotonic()), the whole frame must arrive by then or
    FrameTimeout is raised: a peer that sends a header and then stalls cannot hang the reader."""
    try:
        (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
        if n > max_bytes:
            raise MalformedReply(f"reply of {n} bytes exceeds the limit of {max_bytes} bytes")
        return _recv_exact(sock, n, deadline)
    finally:
        if deadline is not None:
            sock.settimeout(None)


class _MappedFile(io.RawIOBase):
    """A mapped frame as a read-only binary file (zipfile and torch.load ask a file if it is seekable,
    which a mapping cannot answer before Python 3.13)."""

    def __init__(self, mapping: mmap.mmap):
        super().__init__()
        self._mapping = mapping
        mapping.seek(0)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._mapping.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._mapping.seek(offset, whence)  # type: ignore[arg-type]  # an io.SEEK_* constant, as mmap takes
        return self._mapping.tell()

    def tell(self) -> int:
        return self._mapping.tell()


def as_file(data: bytes | mmap.mmap) -> io.BufferedReader | io.BytesIO:
    """A frame as a file to read from its start, without a copy of the whole."""
    if isinstance(data, mmap.mmap):
        return io.BufferedReader(_MappedFile(data))
    return io.BytesIO(data)


# --------------------------------------------------------------------------------------------------
# Requests (trusted direction)


def encode_request(request: dict) -> bytes:
    return pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)


def decode_request(data: bytes | mmap.mmap) -> dict:
    return pickle.loads(data)


# --------------------------------------------------------------------------------------------------
# Replies (untrusted direction)


def to_wire(value: Any, keep: Callable[[Any], int]) -> Any:
    """Turn a value into a tree that ``torch.load(weights_only=True)`` can read.

    Objects that cannot travel (instances of the student's classes) are kept in the worker, and
    `keep(obj)` returns the handle id under which the grader can reach them.

    No code of the student's runs here: this runs after the call, outside the probes, so a value
    is recognised by its exact type (a subclass of list, int or Tensor could compute in its
    ``__iter__``, ``__int__`` or ``__torch_function__``), and containers are read through their
    base types' own methods. A subclass travels as a handle, which no test takes for a number.
    """
    import torch

    kind = type(value)
    if value is None or kind in _SCALARS:
        return value
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return torch.Tensor.detach(value)
    if kind is torch.dtype:
        return value
    if kind is torch.Size:
        return tuple(int(v) for v in tuple.__iter__(value))
    if kind is tuple:
        return tuple(to_wire(v, keep) for v in tuple.__iter__(value))
    if kind is list:
        return [to_wire(v, keep) for v in list.__iter__(value)]
    if kind in _DICTS:
        return {TAG: "dict", "items": [[to_wire(k, keep), to_wire(v, keep)] for k, v in dict.items(value)]}
    if kind in (set, frozenset):
        return {TAG: "set", "items": [to_wire(v, keep) for v in kind.__iter__(value)]}
    fields = _namedtuple_fields(kind) if issubclass(kind, tuple) else None
    if fields is not None:
        return {
            TAG: "namedtuple",
            "name": type_name(kind),
            "fields": list(fields),
            "values": [to_wire(v, keep) for v in tuple.__iter__(value)],
        }
    import numpy as np

    if kind is np.ndarray:
        return {TAG: "ndarray", "data": torch.from_numpy(np.ascontiguousarray(value).copy())}
    if kind in _numpy_scalars():
        return value.item()
    return {TAG: "handle", "id": keep(value), "type": type_name(kind)}


_SCALARS = (bool, int, float, str, bytes)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.<>\[\], -]")
_DICTS = (dict, collections.OrderedDict, collections.defaultdict)


_READING = ("__iter__", "__getitem__", "__len__", "__reduce__", "__reduce_ex__", "__getattribute__", "__getattr__")


def type_name(kind: type) -> str:
    """A class's name, read by type's own descriptor (a metaclass cannot answer for it)."""
    return str(type.__dict__["__name__"].__get__(kind, type))[:100]


def _namedtuple_fields(kind: type) -> tuple[str, ...] | None:
    """The fields of a class made by collections.namedtuple or typing.NamedTuple (or a subclass of one),
    seen only through class dicts; None for anything else, and for a class that changes how a tuple is
    read (its own iteration, indexing, length or pickling)."""
    fields = None
    for klass in type.__dict__["__mro__"].__get__(kind, type):
        if klass is tuple or klass is object:
            continue
        own = type.__dict__["__dict__"].__get__(klass, type)
        if any(name in own for name in _READING):
            return None
        if fields is None and "_fields" in own:
            fields = own["_fields"]
    if type(fields) is not tuple or not all(type(f) is str for f in fields):
        return None
    return fields


_NUMPY_SCALARS: frozenset[type] | None = None


def _numpy_scalars() -> frozenset[type]:
    global _NUMPY_SCALARS
    if _NUMPY_SCALARS is None:
        import numpy as np

        _NUMPY_SCALARS = frozenset(t for t in set(np.sctypeDict.values()) if t.__module__ == "numpy")
    return _NUMPY_SCALARS


def encode_reply(reply: dict, keep: Callable[[Any], int]) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(to_wire(reply, keep), buf)
    return buf.getvalue()


_namedtuple_types: dict[tuple[str, tuple[str, ...]], type] = {}


def make_namedtuple(name: str, fields: list[str], values: list) -> tuple:
    """Rebuild a named tuple of a class made here (used when one travels back to the worker)."""
    return _namedtuple(name, fields)(*values)


def portable(value: Any) -> Any:
    """A named tuple whose class was made by this module, as something pickle can send to the worker."""
    if isinstance(value, tuple) and hasattr(value, "_fields") and type(value).__module__ == __name__:
        return _PortableNamedTuple(type(value).__name__, list(value._fields), [portable(v) for v in value])
    return value


class _PortableNamedTuple:
    def __init__(self, name: str, fields: list[str], values: list):
        self.args = (name, fields, values)

    def __reduce__(self):
        return (make_namedtuple, self.args)


def _namedtuple(name: str, fields: list[str]) -> type:
    if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
        name = "Result"
    if not all(isinstance(f, str) for f in fields):
        raise MalformedReply("named tuple field names must be strings")
    key = (name[:100], tuple(fields))
    if key not in _namedtuple_types:
        made = collections.namedtuple(name[:100], fields, rename=True)  # type: ignore[misc]  # named by the reply
        if len(_namedtuple_types) >= 256:  # reply data chooses the names: a bounded cache, not one class per reply
            return made
        _namedtuple_types[key] = made
    return _namedtuple_types[key]


# What an honest reply needs, measured over every hidden test of the reference solutions (one grade of
# solutions/): a pickle of at most 150 KB, 156 archive entries, 33,000 values. The limits below leave
# margins of 50x and more, and bound what decoding a hostile reply can cost the grader before any value is
# rebuilt: the pickle's size bounds what torch.load builds, the entry count bounds its tensors.
MAX_PICKLE_BYTES = 1 << 20
MAX_ENTRIES = 4096
MAX_NODES = 500_000
MAX_DICT_ITEMS = 16  # the wire's own dicts hold at most 4 keys (tagged nodes); torch's tensor metadata none
MAX_REDUCE_ARGS = 64  # a tensor's rebuild takes a storage, an offset, its size and strides (one per dimension)
_ZIP_END = b"PK\x05\x06"  # end of central directory record (22 bytes, then a comment of up to 64 KiB)


def check_archive(data: bytes | mmap.mmap, max_bytes: int) -> None:
    """Refuse a reply archive (torch.save's zip) that would cost more to load than any honest reply: too
    many entries, a pickle over `MAX_PICKLE_BYTES`, compressed entries, or entries whose sizes add up to
    more than `max_bytes`. Reads the central directory only after its own size and count are checked."""
    end = data.rfind(_ZIP_END, max(0, len(data) - (1 << 16) - 22))
    if end < 0 or len(data) < end + 22:
        raise MalformedReply("the worker's reply is not a torch.save archive")
    entries, directory_size, directory_at = struct.unpack("<HII", data[end + 10:end + 20])
    if entries > MAX_ENTRIES or directory_size > MAX_ENTRIES * 1024:  # 0xFFFF: a zip64 count, past the limit too
        raise MalformedReply(f"the result holds more than {MAX_ENTRIES} tensors")
    if directory_size >= 0xFFFFFFFF or directory_at >= 0xFFFFFFFF:
        raise MalformedReply("the worker's reply is a zip64 archive; no reply needs one")
    try:
        archive = zipfile.ZipFile(as_file(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error) as exc:
        raise MalformedReply(f"the worker's reply is not a readable archive: {type(exc).__name__}") from None
    if len(infos) > MAX_ENTRIES:
        raise MalformedReply(f"the result holds more than {MAX_ENTRIES} tensors")
    names = [info.filename for info in infos]
    folder = names[0].split("/", 1)[0] if names else ""
    if len(set(names)) != len(names) or any(n.split("/", 1)[0] != folder for n in names):
        raise MalformedReply("the worker's reply repeats an entry or mixes folders; torch.save writes neither")
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise MalformedReply("the worker's reply holds a compressed entry; torch.save writes none")
        if info.filename == f"{folder}/data.pkl":  # the one torch.load reads
            if info.file_size > MAX_PICKLE_BYTES:
                raise MalformedReply(f"the result's structure takes more than {MAX_PICKLE_BYTES >> 20} MiB to describe "
                                     "(hundreds of thousands of values): return tensors, not long lists of numbers")
            pickled = info
        total += info.file_size
    if total > max_bytes + MAX_PICKLE_BYTES:
        raise MalformedReply(f"the result's tensors hold more than {max_bytes >> 20} MiB in all")
    if "pickled" not in locals():
        raise MalformedReply("the worker's reply holds no data.pkl")
    check_pickle(archive.read(pickled))


# The opcodes of what torch.save writes for a wire tree (protocol 2): memo, containers, scalars, strings, bytes,
# globals and persistent ids (the tensors). Everything else is refused: sets (EMPTY_SET, ADDITEMS), BUILD, INST,
# OBJ, NEWOBJ, extension codes, text-mode opcodes. What torch.load builds from the rest is bounded below.
_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "BINPUT", "LONG_BINPUT", "MEMOIZE", "BINGET",
    "LONG_BINGET", "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_DICT", "SETITEM", "SETITEMS", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "BINUNICODE",
    "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "NONE", "NEWTRUE", "NEWFALSE",
    "GLOBAL", "REDUCE", "BINPERSID",
})
_GLOBALS = frozenset({"torch._utils _rebuild_tensor_v2", "collections OrderedDict", "_codecs encode"})


class _Node:
    """What the scan knows of one value on the unpickler's stack: a container's size so far, an int's value,
    a storage's number of elements (all in `size`)."""

    __slots__ = ("kind", "size", "name", "items")

    def __init__(self, kind: str = "any", size: int = 0, name: str = "", items: tuple = ()):
        self.kind, self.size, self.name, self.items = kind, size, name, items


def _allowed_global(name: str) -> bool:
    module, _, attr = name.partition(" ")
    if name in _GLOBALS:
        return True
    if module != "torch":
        return False
    import torch

    # Storages of the plain dtypes; not the quantized ones (QInt8Storage...): no contract returns those, and a
    # quantized tensor without its quantizer is a surface of torch's no reply needs.
    return (attr.endswith("Storage") and not attr.startswith("Q")) or isinstance(getattr(torch, attr, None), torch.dtype)


def _check_call(function: _Node, args: _Node) -> None:
    """The calls the wire's pickles make, with the arguments torch.save gives them: bytes as
    ``_codecs.encode(<a string>, 'latin1')`` (any other codec can grow its input without bound, or take time
    quadratic in it: nested 'hex' made 11 GB of 1.6 KB, 'punycode' 240 s of 190 KB), ``OrderedDict()`` empty
    (a tensor's hooks), and a tensor's rebuild. Anything else, or a call fed a call's result, is refused."""
    name = function.name if function.kind == "global" else ""
    if name == "_codecs encode":
        ok = (args.kind == "tuple" and args.size == 2 and len(args.items) == 2
              and args.items[0].kind == "str" and args.items[1].kind == "str" and args.items[1].name == "latin1")
    elif name == "collections OrderedDict":
        ok = args.kind == "tuple" and args.size == 0
    elif name == "torch._utils _rebuild_tensor_v2":
        ok = args.kind == "tuple" and all(item.kind != "reduced" or item is args.items[-1] for item in args.items)
        if ok:
            _check_tensor_extent(args.items)
    else:
        ok = False
    if not ok:
        raise MalformedReply(f"the worker's reply makes a call the wire never writes ({name or 'a computed function'})")


def _check_tensor_extent(items: tuple) -> None:
    """A tensor's rebuild (storage, offset, size, stride, ...) must stay inside its storage: the rebuild's
    ``set_`` resizes a resizable storage to whatever the view claims, before any budget could count it (torch
    2.13 refuses to resize a storage read from the archive; the scan does not rest on that)."""
    def ints(node: _Node) -> list[int] | None:
        if node.kind != "tuple" or len(node.items) != node.size or any(i.kind != "int" for i in node.items):
            return None
        return [i.size for i in node.items]

    if len(items) < 4 or items[0].kind != "storage" or items[1].kind != "int":
        raise MalformedReply("the worker's reply rebuilds a tensor in a form torch.save never writes")
    size, stride, offset = ints(items[2]), ints(items[3]), items[1].size
    if size is None or stride is None or len(size) != len(stride) or min([offset, *size, *stride], default=0) < 0:
        raise MalformedReply("the worker's reply rebuilds a tensor in a form torch.save never writes")
    if 0 not in size and offset + sum((n - 1) * st for n, st in zip(size, stride)) >= items[0].size:
        raise MalformedReply("the worker's reply holds a tensor that claims more elements than its storage holds")


def check_pickle(data: bytes) -> None:
    """Refuse a reply pickle that would cost torch.load more than any honest reply: an opcode the wire never
    writes, a global other than a tensor's rebuild, a storage, a dtype or the bytes codec, a dict of more than
    `MAX_DICT_ITEMS` items (the unpickler builds dicts in C: colliding keys make that quadratic, past any deadline),
    or a call with more than `MAX_REDUCE_ARGS` arguments (`OrderedDict(pairs)` builds a dict too). The scan
    follows the unpickler's stack and memo, so a dict fetched again from the memo is still the same dict."""
    import pickletools

    stack: list[_Node] = []
    marks: list[int] = []
    memo: dict[int, _Node] = {}
    arg: Any  # its type follows from the opcode (an int, a str, ...)
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name not in _OPCODES:
                raise MalformedReply(f"the worker's reply holds a pickle opcode the wire never writes ({name})")
            if name == "MARK":
                marks.append(len(stack))
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name == "GLOBAL":
                if not _allowed_global(arg):
                    raise MalformedReply(f"the worker's reply names a global the wire never writes ({arg[:80]!r})")
                stack.append(_Node("global", name=arg))
            elif name in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE"):
                stack.append(_Node(name[6:].lower()))
            elif name in ("SETITEMS", "APPENDS", "TUPLE", "POP_MARK"):
                at = marks.pop()
                items = len(stack) - at
                popped = tuple(stack[at:]) if name == "TUPLE" and items <= MAX_REDUCE_ARGS else ()
                del stack[at:]
                if name == "TUPLE":
                    stack.append(_Node("tuple", items, items=popped))
                elif name != "POP_MARK":
                    stack[-1].size += items // 2 if name == "SETITEMS" else items
            elif name in ("SETITEM", "APPEND"):
                del stack[-(2 if name == "SETITEM" else 1):]
                stack[-1].size += 1
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                popped = tuple(stack[len(stack) - n:])
                del stack[len(stack) - n:]
                stack.append(_Node("tuple", n, items=popped))
            elif name == "REDUCE":
                args = stack.pop()
                function = stack.pop()
                if args.size > MAX_REDUCE_ARGS or any(item.size > MAX_REDUCE_ARGS for item in args.items
                                                     if item.kind not in ("int", "storage")):
                    raise MalformedReply("the worker's reply rebuilds a value from more arguments than any reply needs")
                _check_call(function, args)
                stack.append(_Node("reduced"))
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("POP", "BINPERSID"):
                top = stack.pop()
                if name == "BINPERSID":  # ('storage', <type>, <key>, <location>, <numel>)
                    numel = top.items[-1] if top.kind == "tuple" and len(top.items) == 5 else None
                    stack.append(_Node("storage", numel.size) if numel is not None and numel.kind == "int"
                                 else _Node())
            elif name in ("BININT", "BININT1", "BININT2", "LONG1"):
                stack.append(_Node("int", arg))
            elif name in ("BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"):
                stack.append(_Node("str", name=arg if len(arg) <= 16 else ""))
            elif name not in ("PROTO", "FRAME", "STOP"):
                stack.append(_Node())  # a number, bytes or None
            if stack and stack[-1].kind == "dict" and stack[-1].size > MAX_DICT_ITEMS:
                raise MalformedReply(f"the worker's reply holds a dict of more than {MAX_DICT_ITEMS} items; the wire "
                                     "never writes one")
    except (IndexError, KeyError, ValueError) as exc:
        raise MalformedReply(f"the worker's reply is not a well-formed pickle: {type(exc).__name__}") from None


class _Budget:
    """What one reply may hold once rebuilt: its tensors' logical bytes and its number of values, by a
    deadline. A tensor travels as its storage, so a view that repeats a small storage
    (``zeros(1).expand(2**28)``) is a few bytes on the wire and a huge tensor here: it is counted by what
    it stands for, and materialised, so nothing downstream meets an overlapping view. Values are counted
    as they are rebuilt, so a list that appears many times (shared in the pickle) counts every time."""

    def __init__(self, max_bytes: int, max_nodes: int = MAX_NODES, deadline: float | None = None):
        self.bytes_left, self.nodes_left, self.max_bytes = max_bytes, max_nodes, max_bytes
        self.max_nodes, self.deadline = max_nodes, deadline
        self.text_left = MAX_TEXT_TOTAL
        self.classes: set = set()

    def text(self, value: str | bytes) -> None:
        self.text_left -= len(value)
        if self.text_left < 0:
            raise MalformedReply(f"the result holds more than {MAX_TEXT_TOTAL >> 20} MiB of text in all "
                                 "(a string that appears many times counts each time)")

    def named_class(self, name: Any, fields: list) -> type:
        """The class of a named tuple in the reply: short identifier names only, a few distinct classes a reply
        (each is built by collections.namedtuple, whose cost grows with its names), the deadline checked first."""
        for text in (name, *fields):
            if not isinstance(text, str) or len(text) > MAX_NAME:
                raise MalformedReply(f"named tuple names must be strings of at most {MAX_NAME} characters")
        self.classes.add((name, tuple(fields)))
        if len(self.classes) > MAX_CLASSES:
            raise MalformedReply(f"the result holds more than {MAX_CLASSES} kinds of named tuple")
        self.check_deadline()
        return _namedtuple(name, list(fields))

    def node(self) -> None:
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise MalformedReply(f"the result holds more than {self.max_nodes:,} values")
        if self.nodes_left % 4096 == 0:
            self.check_deadline()

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise MalformedReply("the result took longer to rebuild than the call's time limit")

    def tensor(self, t: Any) -> Any:
        logical = t.numel() * t.element_size()
        self.bytes_left -= logical
        if self.bytes_left < 0:
            raise MalformedReply(f"the result's tensors hold more than {self.max_bytes >> 20} MiB in all "
                                 f"(one of shape {list(t.shape)} stands for {logical >> 20} MiB)")
        if logical and t.untyped_storage().nbytes() < logical:
            t = t.contiguous() if not t.is_contiguous() else t.clone()  # an expanded or overlapping view
        return t

_HASH_SAFE = 1 << 60  # ints and floats below this magnitude hash to themselves: no two such keys collide


def _key(value: Any, budget: _Budget, index: int) -> Any:
    """A dict key or set member from a reply, checked before it is hashed here. Numbers of large magnitude can be
    chosen to share one hash (k * (2**61 - 1)), which makes building the dict quadratic: refused (no contract
    returns such keys); a tuple's members likewise, at any depth. Strings and bytes hash with a per-process
    secret."""
    pending = [value]
    while pending:
        n = pending.pop()
        if isinstance(n, tuple):
            pending.extend(n)
        elif isinstance(n, (int, float)) and not isinstance(n, bool) and not -_HASH_SAFE < n < _HASH_SAFE:
            raise MalformedReply("the result holds a dict key or set member of a magnitude no contract returns")
    if index % 256 == 255:
        budget.check_deadline()
    return value


def from_wire(tree: Any, make_handle: Callable[[int, str], Any], budget: _Budget | None = None) -> Any:
    """Rebuild a value from its wire tree, checking every node's type (and, with `budget`, the reply's
    size once rebuilt) on the way."""
    import torch

    budget = budget or _Budget(1 << 62)
    budget.node()
    if isinstance(tree, torch.Tensor):
        return budget.tensor(tree)
    if isinstance(tree, (str, bytes)):
        budget.text(tree)
        return tree
    if tree is None or isinstance(tree, (bool, int, float, torch.dtype)):
        return tree

    def again(value: Any) -> Any:
        return from_wire(value, make_handle, budget)

    if isinstance(tree, tuple):
        return tuple(again(v) for v in tree)
    if isinstance(tree, list):
        return [again(v) for v in tree]
    if isinstance(tree, dict):
        kind = tree.get(TAG)
        if kind == "namedtuple":
            fields, values = tree["fields"], tree["values"]
            if not isinstance(fields, list) or not isinstance(values, list) or len(fields) != len(values) \
                    or len(fields) > MAX_FIELDS:
                raise MalformedReply(f"named tuple with a wrong number of fields or values (at most {MAX_FIELDS})")
            for _ in fields:
                budget.node()
            cls = budget.named_class(tree["name"], fields)
            return cls(*[again(v) for v in values])
        if kind == "dict":
            built: dict = {}
            for i, (k, v) in enumerate(tree["items"]):
                built[_key(again(k), budget, i)] = again(v)
            return built
        if kind == "set":
            return {_key(again(v), budget, i) for i, v in enumerate(tree["items"])}
        if kind == "ndarray":
            data = tree["data"]
            if not isinstance(data, torch.Tensor):
                raise MalformedReply("ndarray payload is not a tensor")
            return budget.tensor(data).numpy()
        if kind == "handle":
            if not isinstance(tree.get("id"), int):
                raise MalformedReply("handle without an integer id")
            kind_name = tree.get("type", "object")
            if not isinstance(kind_name, str) or len(kind_name) > 200:
                raise MalformedReply("handle whose type is not a short string")
            # The name of a class of the student's: it reaches reprs, messages and pytest's own output
            # (the instructor's --log-dir), so only a name's characters travel, never an escape sequence.
            return make_handle(tree["id"], _SAFE_NAME.sub("?", kind_name) or "object")
        raise MalformedReply(f"unknown wire tag {kind!r}")
    raise MalformedReply(f"unexpected {type(tree).__name__} in reply")


def decode_reply(data: bytes | mmap.mmap, make_handle: Callable[[int, str], Any], max_bytes: int = 1 << 30,
                 deadline: float | None = None) -> Any:
    """Decode untrusted reply bytes. Raises MalformedReply for anything but a well-formed tree, for one
    whose tensors stand for more than `max_bytes` once rebuilt, for one larger than any honest reply in
    structure (`check_archive`, `MAX_NODES`), and for one not rebuilt by `deadline` (time.monotonic())."""
    import torch

    check_archive(data, max_bytes)
    try:
        tree = torch.load(as_file(data), weights_only=True, map_location=None)
    except Exception as exc:  # noqa: BLE001 - any failure to decode hostile bytes is a malformed reply
        raise MalformedReply(f"the worker's reply could not be decoded safely: {type(exc).__name__}") from None
    try:
        return from_wire(tree, make_handle, _Budget(max_bytes, deadline=deadline))
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise MalformedReply(f"malformed reply: {exc}") from None
