"""A warm start for the sandboxed worker.

A cold worker is a fresh ``python -I -m grader.harness.launch`` that sets up the sandbox and then execs
``python -I -m grader.harness.worker``, which imports torch and the probes: about 1.3 s of CPU on a quiet
2-core machine, for every exercise of every submission (and for every known-wrong grade of the project's
tests). The zygote pays that once per grading process. It is the same fork server as the grader's own
pytest processes (grader/forkserver.py), run as ``python -I -m grader.harness.zygote`` with exactly the
worker's environment, which imports what the worker imports and then forks one child per worker. The child
does what the cold launcher does (namespaces, the allow-list view, limits, the unprivileged uid, seccomp;
grader/harness/launch.py) and runs the worker in the same process instead of exec'ing a new one.

What keeps each worker as independent as a cold one:

- The zygote never holds a submission, a hidden test, a seed or a grade's configuration. It is started fresh
  (never forked from a trusted process), with the worker's environment only: its memory is what importing
  torch, numpy, Triton and the grader's harness made. A request carries no data: the sandbox's description
  and its descriptors are read by the child, after the fork, from a socket of the request's own.
- The child closes every descriptor but the worker's own (the request's socket, the status pipe, the
  student's file, the log), so it holds neither the zygote's socket nor another worker's status socket.
- The worker runs on a bare stack: once the sandbox is set up, the child leaves every frame of the launcher
  and of the server by an exception (launch.WorkerReady) and runs the worker from the module's top. A
  submission that walks its stack or the collector's objects finds neither its sandbox's description (the
  folders the grader hides, the host's scratch folder, the cgroups) nor the server's table of its children
  (another grade's pid): red team, the first round on the zygote.
- It reseeds numpy's global generator from the OS (a cold worker draws one at import); Python's `random`
  reseeds itself after fork. torch's default generator is untouched in the zygote, as in a fresh process.
- The zygote is not dumpable (no process of its uid may ptrace it or read its memory); the child is made
  dumpable again only for the launcher's steps, as a fresh process is, and the worker makes itself not
  dumpable before it imports the student's module, as before.
- The worker dies with its grader: the launcher dies with the zygote (PR_SET_PDEATHSIG), the zygote kills
  a child whose client closed its status socket (the grader's test process died or gave it up), and the
  zygote ends when the grading process that started it closes its socket.

What differs from a cold start, and why it is accepted: all workers of one zygote share its address-space
layout and its string-hash secret (a worker could learn them, and they protect nothing the grader relies
on); the memory that held the sandbox's description is freed, not wiped, so a scan of the worker's own raw
memory may find those paths (all of them outside the worker's view, and named in the README); numpy's
generator is reseeded with 32 bits of the OS's entropy; and the pages the zygote imported are charged,
copy-on-write, to the zygote's memory cgroup, not to the worker's own (the address-space limit, RLIMIT_AS,
counts them as before).

Used when the runner started one (``GRADER_WORKER_ZYGOTE``, passed to the grader's pytest with its socket)
and the worker's environment is the zygote's; never with CUDA (a CUDA worker is started cold until a GPU has
proved the warm one); ``GRADER_COLD_START=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

from grader import forkserver
from grader.harness.launch import WorkerReady

# What the zygote imports: what the worker imports at its start, and what every exercise file imports.
WARM_MODULES = ("grader.harness.worker", "grader.harness.launch", "grader.harness.view", "grader.harness.seccomp",
                "numpy", "torch", "triton", "triton.language")
ENV_VAR = "GRADER_WORKER_ZYGOTE"  # "FD:DIGEST": the zygote's socket in the grader's pytest, and its environment
PR_SET_DUMPABLE = 4


def environment_digest(env: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(env.items())).encode()).hexdigest()[:16]


class Zygote(forkserver.Server):
    """The runner's handle: started with the worker's environment `env`."""

    def __init__(self, env: dict[str, str]):
        super().__init__(env, "grader.harness.zygote", flags=("-I",), cwd="/")
        self.digest = environment_digest(self.env)

    def handle(self) -> str:
        """What the grader's pytest finds in ENV_VAR, beside this zygote's socket (kept under its number)."""
        return f"{self.sock.fileno()}:{self.digest}"


def launch(control: socket.socket, config: dict, fds: dict[str, int], log_fd: int) -> forkserver.ForkedProcess:
    """Start a worker warm: `config` is the cold launcher's (grader/harness/launch.py), `fds` its descriptors
    by their config keys (sock_fd, status_fd, module_fd), `log_fd` its stdout and stderr. The caller closes its
    own copies of the descriptors afterwards, as after a cold start."""
    import array

    keys = sorted(fds)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        child = forkserver.request_child(control, {}, [theirs.fileno()])
        # Read by the child only: the zygote never sees the sandbox's description.
        message = json.dumps({"config": config, "keys": keys}).encode()
        ours.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [log_fd, *(fds[k] for k in keys)]))])
        return child
    finally:
        ours.close()
        theirs.close()


def from_environment(env: dict[str, str]) -> socket.socket | None:
    """A socket to the zygote (the caller closes it), if the runner passed one to this process (the grader's
    pytest) and the worker's environment `env` is the zygote's; else None: start the worker cold."""
    if os.environ.get("GRADER_COLD_START") == "1":
        return None
    fd_text, _, digest = os.environ.get(ENV_VAR, "").partition(":")
    if not fd_text.isdigit() or digest != environment_digest(env):
        return None
    try:
        os.set_inheritable(int(fd_text), False)  # no program this process starts inherits it
        control = socket.socket(fileno=os.dup(int(fd_text)))
    except OSError:
        return None
    if control.family != socket.AF_UNIX or control.type != socket.SOCK_SEQPACKET:
        control.close()
        return None
    return control


# --------------------------------------------------------------------------------------------------
# The zygote's side


def _not_dumpable(flag: int) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, flag, 0, 0, 0)


def _worker_child(_request: dict, fds: list[int], own: list[int]) -> None:
    """In the forked child: read the sandbox's description from the request's socket, do what a cold launcher
    does, and leave by WorkerReady (launch.main lets it through) for `_main` to run the worker."""
    try:
        _set_up(fds, own)
    except WorkerReady:
        raise
    except SystemExit as exc:
        _exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:  # noqa: BLE001 - report, then exit like a crashed interpreter
        import traceback

        traceback.print_exc()
        _exit(1)
    _exit(0)  # pragma: no cover - launch.main ends in the worker or exits


def _set_up(fds: list[int], own: list[int]) -> None:
    forkserver.reset_child(own)
    _not_dumpable(1)  # as a fresh process is: the launcher's steps (a user namespace's maps) need it
    (request_fd,) = fds
    with socket.socket(fileno=request_fd) as request:
        message, received = forkserver._receive(request)
    payload = json.loads(message)
    config, keys = payload["config"], payload["keys"]
    log_fd, *worker_fds = received
    if len(worker_fds) != len(keys):
        raise OSError(f"expected {len(keys)} descriptors for the worker, found {len(worker_fds)}")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for key, fd in zip(keys, worker_fds):
        config[key] = fd
    keep = {0, 1, 2, *worker_fds}
    for fd in map(int, os.listdir("/proc/self/fd")):  # nothing of the zygote's reaches the worker
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in worker_fds:
        os.set_inheritable(fd, True)
    _fresh_process_state()
    from grader.harness import launch

    launch.main(config, run_worker=_ready)  # raises WorkerReady, or exits


def _ready(argv: list[str]) -> None:
    raise WorkerReady(argv)


def _exit(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _fresh_process_state() -> None:
    """What a fresh interpreter would not share with its siblings."""
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again, inside the sandbox
    try:
        import numpy

        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))  # a cold worker seeds it from the OS
    except ImportError:  # pragma: no cover
        pass


def _run_worker(argv: list[str]) -> None:
    """The worker, in this process (the launcher's last step, instead of an exec); never returns."""
    from grader.harness import worker

    sys.argv = [worker.__file__, *argv]
    code = 0
    try:
        worker.main(sys.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - as an interpreter reports an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    _exit(code)


def _main() -> None:
    """The zygote; in each child, once the sandbox is set up, the worker (with no frame of the server's or the
    launcher's below it: they were left by WorkerReady)."""
    _not_dumpable(0)  # no process of this uid may ptrace the zygote, or read its memory
    argv: list[str] | None = None
    try:
        forkserver.serve(socket.socket(fileno=int(sys.argv[1])), WARM_MODULES, _worker_child)
    except WorkerReady as ready:
        argv = ready.argv
    if argv is None:
        return  # the server: its client closed the socket
    import gc

    gc.collect()  # what the frames held (the sandbox's description): gone before the student's module loads
    _run_worker(argv)


if __name__ == "__main__":
    _main()
