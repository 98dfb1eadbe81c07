"""The grading harness: the verdict is decided in a process that never imports student code.

client.py   the grader's side: worker processes and proxies (RemoteModule, RemoteHandle)
worker.py   the only process that imports student code
launch.py   puts the worker in its sandbox (namespaces, hidden folders, limits, unprivileged user)
wire.py     framing and the safe encoding of replies
probes.py   the probes around one call (used by both modes): around_call; the probes themselves live in
            integrity.py, opfamilies.py, guard.py, kernel_rule.py, launches.py, host_reads.py,
            interpreter_bound.py and counters.py (probes.py's docstring says which holds what)
tamper.py   the trusted static scan of a student's file (its tables in scan_rules.py, name resolution and
            constant folding in scan_names.py) and the structural checks' gate (assert_untampered)
session.py  the `student` fixture's object: local (in-process) or sandbox mode
deadline.py the time limit of an in-process test (self-study), where no worker can be killed
"""
