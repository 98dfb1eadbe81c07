"""Course-provided code that runs beside the student's code (in the worker, or in-process).

Drivers here are called by tests through ``student.drive("grader.support.<module>:<fn>", sm.fn, ...)``
as ``driver(student_fn, *args)``. They run in the student's process, so their results are as
untrusted as the student's own; they exist to run things that must happen next to the student's
code (a simulated ring of threads, a backward pass, a timed loop), not to judge them.
"""
