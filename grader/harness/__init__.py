"""The grading harness: the verdict is decided in a process that never imports student code.

client.py   the grader's side: worker processes and proxies (RemoteModule, RemoteHandle)
worker.py   the only process that imports student code
launch.py   puts the worker in its sandbox (namespaces, hidden folders, limits, unprivileged user)
wire.py     framing and the safe encoding of replies
probes.py   guards and line counting around one call (used by both modes)
session.py  the `student` fixture's object: local (in-process) or sandbox mode
"""
