"""A backend by name, and the command line's --backend flags.

"local" grades on this machine in the runner's own sandbox (grader/scale/local.py); "docker" and
"apptainer" start one container of the course image per submission (grader/scale/container.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from grader.options import GradeOptions
from grader.scale.backend import BACKENDS, Backend, BackendError
from grader.scale.container import ContainerBackend
from grader.scale.local import LocalBackend

CONTAINER_FLAGS = ("image", "memory", "cpus", "pids", "tmpfs")


def make_backend(name: str, root: Path, image: str | None = None, **container_options) -> Backend:
    """The backend called `name` (a BackendError when it cannot be made, e.g. a
    missing container runtime or image)."""
    if name == "local":
        return LocalBackend(root)
    if name in ("docker", "apptainer"):
        return ContainerBackend(root, runtime=name, image=image, **container_options)
    raise BackendError(f"expected a backend among {list(BACKENDS)}, found {name!r}")


def add_backend_options(parser: argparse.ArgumentParser) -> None:
    """--backend and the container's limits, for `grader grade` and `grader batch`."""
    group = parser.add_argument_group("backend")
    group.add_argument("--backend", choices=BACKENDS, default="local",
                       help="local: this machine, the runner's own sandbox; docker/apptainer: one container of "
                            "the course image per submission")
    group.add_argument("--image", help="the course image (docker) or .sif file (apptainer); default: "
                                       "course.yaml's container.image")
    group.add_argument("--memory", type=int, metavar="MB", help="container memory, swap included (course.yaml)")
    group.add_argument("--cpus", type=float, help="container CPUs (course.yaml)")
    group.add_argument("--pids", type=int, help="container process and thread limit (course.yaml)")
    group.add_argument("--tmpfs", type=int, metavar="MB", help="size of the container's /tmp (course.yaml)")


def backend_from_args(args: argparse.Namespace, root: Path, grade: GradeOptions | None = None) -> Backend:
    """The backend the command line asks for. BackendError for flags that do not go with it: container
    limits without a container, or options only the local backend can honour (`grade`'s host-only flags)
    with one, a missing container runtime or image."""
    if args.backend == "local":
        for flag in CONTAINER_FLAGS:
            if getattr(args, flag, None) is not None:
                raise BackendError(f"--{flag} applies to --backend docker or apptainer, found --backend local")
        return make_backend("local", root)
    host_only = grade.host_only_flags() if grade is not None else []
    if host_only:
        raise BackendError(f"{host_only[0]} applies to --backend local (a container runs its own sandbox, as its "
                           f"own user, with its own files), found --backend {args.backend}")
    for flag in ("memory", "cpus", "pids", "tmpfs"):
        value = getattr(args, flag, None)
        if value is not None and value <= 0:
            raise BackendError(f"expected --{flag} greater than 0, found {value:g}")
    return make_backend(args.backend, root, image=args.image, memory_mb=args.memory, cpus=args.cpus, pids=args.pids,
                        tmpfs_mb=args.tmpfs)
