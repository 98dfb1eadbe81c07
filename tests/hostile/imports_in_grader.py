# Leaves a mark if it is ever imported by the grader (root) rather than the sandboxed worker (nobody).
# MARKER is rewritten by the test to a path inside a folder only root can write to.
MARKER = "/nonexistent/marker"
try:
    with open(MARKER, "w") as f:
        f.write("imported here")
except OSError:
    pass


def online_normalizer(chunks):
    raise NotImplementedError


merge_states = online_softmax = softmax_triton = online_normalizer
