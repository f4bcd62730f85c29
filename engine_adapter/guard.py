"""The hooks' reentrancy guard: what the dump does inside a hook is not recorded again.

While a hook hands what it saw to the dump, the dump calls framework APIs itself (reductions,
copies, hashes), and the API wrappers would record them. Every adapter runs its hook bodies
inside ``with guard:``; the wrappers record only while ``guard.depth`` is 0. The depth is per
thread: the dump's writer thread, which stays inside the guard, does not silence training.

>>> guard = ReentryGuard()
>>> with guard:
...     guard.depth
1
>>> guard.depth
0
"""

from __future__ import annotations

import threading


class ReentryGuard(threading.local):
    """How deep this thread is in dump code (0: not at all); a context manager that enters it."""

    depth = 0

    def __enter__(self) -> "ReentryGuard":
        self.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
