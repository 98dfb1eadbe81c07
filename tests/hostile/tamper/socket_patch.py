"""Slow every read on the worker's socket: the round trip the grader times as its baseline grows with it."""
# expect: socket
# clocks
import socket

_recv = socket.socket.recv
