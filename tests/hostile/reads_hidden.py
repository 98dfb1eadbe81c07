# Tries to read the hidden tests and the solutions, and reports what it found in its error message.
import os

ROOT = os.environ.get("COURSE_ROOT", "/work/main")  # the test rewrites this line


def _peek():
    found = []
    for rel in ("grader/hidden/online_softmax/test_hidden.py", "solutions/online_softmax/online_softmax.py"):
        try:
            with open(os.path.join(ROOT, rel)) as f:
                found.append(f"READ {rel}: {f.read(40)!r}")
        except OSError as exc:
            found.append(f"cannot read {rel}: {exc.strerror}")
    raise RuntimeError(" | ".join(found))


def online_normalizer(chunks):
    _peek()


merge_states = online_softmax = softmax_triton = online_normalizer
