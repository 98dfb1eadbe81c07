# Looks for everything of the course a worker must never see: the checkout's .git, the solutions, the
# hidden checks, the project's tests, the machine's secrets and the grading processes' environment.
# Reports what it found in its error message (the grade's tests assert none of it was readable).
import glob
import os
import subprocess

ROOT = os.environ.get("COURSE_ROOT", "/work/main")  # the test rewrites this line

TARGETS = [".git/HEAD", "solutions/online_softmax/online_softmax.py", "grader/hidden/online_softmax/test_hidden.py",
           "tests/test_hostile.py", "course.yaml"]


def _peek():
    found = []
    for rel in TARGETS:
        try:
            with open(os.path.join(ROOT, rel), "rb") as f:
                found.append(f"READ {rel}: {f.read(30)!r}")
        except OSError as exc:
            found.append(f"cannot read {rel}: {exc.strerror}")
    for path in ["/etc/shadow", "/root/.bash_history"] + glob.glob("/proc/*/environ"):
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
        except OSError:
            continue
        if b"GRADER_SEED" in data or path == "/etc/shadow":
            found.append(f"READ {path}")
    try:
        out = subprocess.run(["git", "-C", ROOT, "show", "HEAD:solutions/online_softmax/online_softmax.py"],
                             capture_output=True, timeout=20)
        found.append("READ git show" if out.returncode == 0 and out.stdout else f"git show failed ({out.returncode})")
    except (OSError, subprocess.SubprocessError) as exc:
        found.append(f"git show failed ({type(exc).__name__})")
    found.append(f"uid {os.getuid()} euid {os.geteuid()}")
    raise RuntimeError(" | ".join(found))


def online_normalizer(chunks):
    _peek()


merge_states = online_softmax = softmax_triton = online_normalizer
