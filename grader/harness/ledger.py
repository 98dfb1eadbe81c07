"""Which of the student's callables answered a call, and which raised, test by test.

An exception is an answer only where the contract asks for one, and only from code that also answers the
calls the contract says must succeed: a function whose body is ``raise ValueError`` would otherwise pass every
test that expects a ValueError (``pytest.raises`` cannot tell "rejects the bad argument" from "rejects
everything"). The proxies (grader/harness/client.py's ``RemoteCallable``, session.py's ``LocalCallable``) record
each call here; the plugin (grader/plugin.py) keeps a passing test whose calls raised, and scores it only if
each callable that raised there returned a value in some test of the same grade.

What it cannot see: in-process (``make check``), methods of an object the student's class made are called on the
object itself, not through a proxy, so only module-level functions and classes are recorded there; under
``grader grade`` every call goes through a proxy. A driver (``student.drive``) that returns counts as its
function answering, whatever the driver caught on the way. A run of some checks only (``grader grade --check``)
may hold no test where the code answers, so there the rule is off: it judges whole grades.
"""

from __future__ import annotations


class CallLedger:
    def __init__(self) -> None:
        self.answered: set[str] = set()  # callables that returned a value, over the whole grade
        self._raised: list[str] = []  # callables that raised during the current test

    def begin(self) -> None:
        self._raised = []

    def record(self, qualname: str, raised: bool) -> None:
        if not qualname:
            return
        if raised:
            self._raised.append(qualname)
        else:
            self.answered.add(qualname)

    def raised_in_test(self) -> list[str]:
        """The callables that raised during the current test, once each, in order."""
        return list(dict.fromkeys(self._raised))

    def unanswered(self, names: list[str]) -> list[str]:
        """Those of `names` that never returned a value so far in this grade."""
        return [n for n in names if n not in self.answered]


LEDGER = CallLedger()
