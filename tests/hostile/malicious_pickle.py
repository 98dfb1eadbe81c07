# Replaces the worker's reply encoder with a pickle that would run a command when unpickled.
# MARKER is rewritten by the test to a path only the grader (root) could create.
import os
import pickle

import grader.harness.wire as wire

MARKER = "/nonexistent/marker"


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


wire.encode_reply = lambda reply, keep: pickle.dumps({"ok": True, "value": Payload()})


def online_normalizer(chunks):
    return None


merge_states = online_softmax = softmax_triton = online_normalizer
