# Tries to reach the outside world; reports the outcome in its error message.
import socket


def online_normalizer(chunks):
    try:
        socket.create_connection(("1.1.1.1", 80), timeout=2)
        outcome = "CONNECTED"
    except OSError as exc:
        outcome = f"blocked: {exc}"
    raise RuntimeError(outcome)


merge_states = online_softmax = softmax_triton = online_normalizer
