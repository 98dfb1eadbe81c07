"""The grading options: every grading command takes the same flags, every hop carries the same
options, and the flags a container cannot honour are refused rather than ignored."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from grader import cli
from grader.options import GradeOptions, OptionsError, add_grade_options
from grader.scale import slurm
from grader.scale.backend import BackendError
from grader.scale.backends import backend_from_args
from grader.scale.batch import BatchOptions, options_of

ROOT = Path(__file__).resolve().parents[1]
EVERY_FLAG = ["-e", "online_softmax", "-e", "gptq", "--seed", "7", "--tests", "public", "--check", "normalizer",
              "--call-timeout", "9", "--time-limit", "90", "--no-isolate", "--user", "nobody", "--log-dir", "logs"]


def grading_flags(parser: argparse.ArgumentParser) -> set[str]:
    group = next(g for g in parser._action_groups if g.title == "grading options")
    return {flag for action in group._group_actions for flag in action.option_strings}


def subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.parser(student_only=False)._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_every_grading_command_takes_the_same_grading_flags():
    reference = argparse.ArgumentParser()
    add_grade_options(reference)
    expected = grading_flags(reference)
    assert {"--exercise", "--seed", "--tests", "--check", "--call-timeout", "--time-limit", "--no-isolate", "--user",
            "--log-dir"} <= expected
    for name in ("grade", "batch", "slurm"):
        assert grading_flags(subcommand(name)) == expected, f"`grader {name}` must take the grading options as `grade` does"


@pytest.mark.parametrize("command, positional", [("grade", ["sub"]), ("batch", ["subs", "--out", "r"]),
                                                 ("slurm", ["subs", "--out", "r"])])
def test_every_grading_command_reads_the_flags_into_the_same_options(command, positional, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = cli.parser(student_only=False).parse_args([command, *positional, *EVERY_FLAG])
    opts = GradeOptions.from_args(args)
    assert opts == GradeOptions(exercises=["online_softmax", "gptq"], seed=7, tests="public", checks=["normalizer"],
                                call_timeout_s=9.0, time_limit_s=90.0, isolate=False, user="nobody",
                                log_dir=tmp_path / "logs")


def test_options_survive_the_wire_unchanged():
    opts = GradeOptions(exercises=["gptq"], seed=3, tests="public", checks=["a", "b"], call_timeout_s=2.5,
                        time_limit_s=60.0, isolate=False, user="grader", hide=("/srv/subs",), log_dir=Path("/tmp/l"),
                        first_failure=True)
    assert GradeOptions.from_json(json.loads(json.dumps(opts.to_json()))) == opts


def test_a_container_is_told_only_what_means_something_inside_it():
    opts = GradeOptions(exercises=["gptq"], seed=3, checks=["a"], time_limit_s=60.0, isolate=False, user="grader",
                        hide=("/srv/subs",), log_dir=Path("/tmp/l"))
    inside = opts.for_container()
    assert (inside.exercises, inside.seed, inside.checks, inside.time_limit_s) == (["gptq"], 3, ["a"], 60.0)
    assert (inside.isolate, inside.user, inside.hide, inside.log_dir) == (True, "auto", (), None), (
        "paths and identities of the grading host mean nothing inside a container")


@pytest.mark.parametrize("data, expected", [
    ({"exercise": ["gptq"]}, "found 'exercise'"),
    ({"tests": "hidden"}, "expected tests among ['all', 'public'], found 'hidden'"),
    ({"time_limit_s": 0}, "expected --time-limit greater than 0 seconds, found 0"),
    ([], "expected the grading options as a JSON object, found list"),
])
def test_options_that_cannot_be_used_are_refused_with_what_was_expected(data, expected):
    with pytest.raises(OptionsError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        GradeOptions.from_json(data)


@pytest.mark.parametrize("flag", [["--no-isolate"], ["--user", "nobody"], ["--log-dir", "logs"]])
def test_a_container_backend_refuses_the_flags_only_the_local_backend_honours(flag):
    args = cli.parser(student_only=False).parse_args(["grade", "sub", "--backend", "docker", *flag])
    with pytest.raises(BackendError, match=f"{flag[0]} applies to --backend local"):
        backend_from_args(args, ROOT, GradeOptions.from_args(args))


def test_slurm_with_a_container_runtime_refuses_them_too(tmp_path, capsys):
    code = slurm.main(["slurm", str(tmp_path), "--out", str(tmp_path / "r"), "--runtime", "docker", "--no-isolate"])
    assert code == 2 and "--no-isolate applies to --runtime local" in capsys.readouterr().err


def test_a_batch_keeps_each_submissions_pytest_logs_apart(tmp_path):
    batch = BatchOptions(tmp_path / "subs", tmp_path / "out", grade=GradeOptions(log_dir=tmp_path / "logs"))
    assert options_of(batch.grade, "ann").log_dir == tmp_path / "logs" / "ann"
    assert options_of(GradeOptions(), "ann").log_dir is None


def test_an_account_is_checked_where_the_grade_runs_not_where_options_are_made():
    """Options for a container name the container's account ('grader'), which the host may lack: making them never
    fails; the local backend checks the account before it grades (as root, each worker drops to it)."""
    import os

    opts = GradeOptions(user="no-such-account-for-the-course")  # made anywhere, sent anywhere
    assert GradeOptions.from_json(opts.to_json()) == opts
    if os.geteuid() != 0:
        opts.check_account()  # not root: no worker drops to an account, nothing to check
        return
    with pytest.raises(OptionsError, match="expected --user 'no-such-account-for-the-course' to name an account"):
        opts.check_account()
    GradeOptions(user="root").check_account()
