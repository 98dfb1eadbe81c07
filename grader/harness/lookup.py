"""A name the tests ask of the student's module, and the message when the file does not define it.

Both modes look names up here: the worker (sandboxed) and the in-process module (self-study). Python's own
"module 'online_softmax' has no attribute 'merge_states'" reads like a bug of the grader to a student whose
file is empty or misnames a function; this says what the contract expected and what the file holds.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any


def student_attribute(owner: Any, name: str) -> Any:
    """``getattr(owner, name)``; for a module without that name, an AttributeError naming what it does define."""
    try:
        return getattr(owner, name)
    except AttributeError:
        if not isinstance(owner, types.ModuleType):
            raise
    file = Path(getattr(owner, "__file__", None) or f"{owner.__name__}.py").name
    own = sorted(n for n, v in vars(owner).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == owner.__name__)
    found = (f"it defines {', '.join(own[:12])}{' ...' if len(own) > 12 else ''}" if own
             else "it defines no function or class (is the file empty?)")
    raise AttributeError(f"expected {file} to define {name!r}, which the contract names; found no such name: {found}")
