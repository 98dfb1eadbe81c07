"""The grading options: one dataclass, one set of command-line flags, one wire form.

Every command that grades (`grader grade`, `grader batch`, `grader slurm`) registers the same flags
with `add_grade_options` and reads them back with `GradeOptions.from_args`; every hop that carries
options to another process (a batch lane's grading process, a container, a Slurm task's manifest)
writes `to_json` and reads `from_json`. A flag added here reaches all of them, and
tests/test_options.py checks that the commands accept the same ones.

A few options are about the grading host itself (`isolate`, `user`, `hide`, `log_dir`): a container
decides them for itself, so `for_container()` leaves them out of what crosses into one, and a
command with a container backend refuses them rather than ignore them.
"""

from __future__ import annotations

import argparse
import os
import pwd
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = ("all", "public")
MODES = ("sandbox", "local")
# Options that only mean something on the host that runs the sandboxed workers itself.
HOST_ONLY = ("isolate", "user", "hide", "log_dir")


class OptionsError(ValueError):
    """Options that cannot be used (the message says what was expected and what was found)."""


@dataclass(frozen=True)
class GradeOptions:
    exercises: list[str] | None = None  # None: all
    seed: int | None = None  # None: a fresh secret seed
    mode: str = "sandbox"  # or "local" (in-process, for make check)
    tests: str = "all"  # "all" or "public"
    isolate: bool = True
    user: str = "auto"  # as root: each worker a uid of its own (grader/harness/identity.py); or an account
    hide: tuple[str, ...] = ()  # extra folders the worker must not read
    log_dir: Path | None = None  # keep each exercise's pytest output here
    call_timeout_s: float | None = None  # override course.yaml's per-call limit
    time_limit_s: float | None = None  # override course.yaml's per-exercise limit
    checks: list[str] | None = None  # run only these checks' tests (the others: "not run")
    # Stop each check at its first test below full marks; the check's later tests score zero, "not run". For
    # the project's own tests of known-wrong submissions, which need only know that a check lost points.
    first_failure: bool = False
    # Grade on a torch that CI does not test (grader/torchbuild.py), with a warning in the result; without it,
    # such a grade is an error of the grade.
    allow_untested_torch: bool = False

    def __post_init__(self) -> None:
        if self.tests not in TESTS:
            raise OptionsError(f"expected tests among {list(TESTS)}, found {self.tests!r}")
        if self.mode not in MODES:
            raise OptionsError(f"expected mode among {list(MODES)}, found {self.mode!r}")
        for name in ("call_timeout_s", "time_limit_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                flag = "--" + name[: -len("_s")].replace("_", "-")
                raise OptionsError(f"expected {flag} greater than 0 seconds, found {value:g}")

    def check_account(self) -> None:
        """Where this machine grades (the local backend, as root), `user` must be an account it has: each worker
        drops to it, and without it every exercise fails later as "the test process exited with code 3". Options
        made for another machine (a container's, sent on the wire) are not checked here."""
        if self.user in ("auto", "") or os.geteuid() != 0:
            return
        try:
            pwd.getpwnam(self.user)
        except KeyError:
            raise OptionsError(f"expected --user {self.user!r} to name an account on this machine (as root, the "
                               f"student's code runs as it), found none: create it (the Gradescope bundle's setup.sh "
                               f"creates 'student'), or use --user auto (GRADER_USER=auto)") from None

    # -- the command line ---------------------------------------------------------------------------

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GradeOptions:
        """The options of a command whose parser `add_grade_options` filled."""
        return cls(exercises=args.exercise or None, seed=args.seed, tests=args.tests, checks=args.check or None,
                   call_timeout_s=args.call_timeout, time_limit_s=args.time_limit, isolate=not args.no_isolate,
                   user=args.user, log_dir=Path(args.log_dir).absolute() if args.log_dir else None,
                   allow_untested_torch=args.allow_untested_torch)

    def host_only_flags(self) -> list[str]:
        """The flags set here that only the local backend can honour."""
        default = GradeOptions()
        flags = {"isolate": "--no-isolate", "user": "--user", "log_dir": "--log-dir"}
        return [flag for name, flag in flags.items() if getattr(self, name) != getattr(default, name)]

    # -- the wire form ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["log_dir"] = str(self.log_dir) if self.log_dir else None
        data["hide"] = list(self.hide)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradeOptions:
        if not isinstance(data, dict):
            raise OptionsError(f"expected the grading options as a JSON object, found {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise OptionsError(f"expected grading options among {sorted(known)}, found {unknown[0]!r}")
        data = dict(data)
        data["log_dir"] = Path(data["log_dir"]) if data.get("log_dir") else None
        data["hide"] = tuple(data.get("hide") or ())
        return cls(**data)

    def for_container(self) -> GradeOptions:
        """These options less the host's own: what a grading container is told (paths on the host
        mean nothing inside it, and the container chooses its own identity and sandbox)."""
        default = GradeOptions()
        return dataclasses.replace(self, **{name: getattr(default, name) for name in HOST_ONLY})

    def replace(self, **changes: Any) -> GradeOptions:
        return dataclasses.replace(self, **changes)


def add_grade_options(parser: argparse.ArgumentParser) -> None:
    """The flags of every grading command; `GradeOptions.from_args` reads them back."""
    group = parser.add_argument_group("grading options")
    group.add_argument("--exercise", "-e", action="append", help="grade only this exercise (repeatable)")
    group.add_argument("--seed", type=int, help="seed for the hidden tests' inputs (default: a fresh secret one each)")
    group.add_argument("--tests", choices=TESTS, default="all", help="all tests, or only the public ones")
    group.add_argument("--check", action="append", help="run only this check's tests (repeatable); the others: not run")
    group.add_argument("--call-timeout", type=float, metavar="S", help="override course.yaml's per-call limit (seconds)")
    group.add_argument("--time-limit", type=float, metavar="S", help="override course.yaml's per-exercise limit (seconds)")
    group.add_argument("--no-isolate", action="store_true",
                       help="run workers without namespaces (debugging; local backend only)")
    group.add_argument("--user", default="auto",
                       help="as root, the worker's identity: 'auto' (a uid of its own per grade) or an account's "
                            "name (local backend only)")
    group.add_argument("--allow-untested-torch", action="store_true",
                       help="grade on a torch the course's tests do not run on (grader doctor names it); every "
                            "result then carries a warning")
    group.add_argument("--log-dir", help="keep each exercise's pytest output in this folder (local backend only; "
                                         "a batch keeps one sub-folder per submission)")
