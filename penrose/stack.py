"""Room for deep programs: run a pipeline stage where Python's recursion limit is not the limit.

A diagram may hold a sum of 10,000 terms or a call nested 1,000 deep; every stage (parse,
check, compile, fmt, render) walks such trees recursively. `deep(fn)` runs `fn` on a worker
thread with a large stack and a raised recursion limit, once per outermost call (nested calls
run inline). Past even that room, a RecursionError becomes a positioned `PenroseError` through
`too_deep`, never a traceback.

>>> @deep
... def depth(n):
...     return 0 if n == 0 else 1 + depth(n - 1)
>>> depth(20_000)
20000
"""

from __future__ import annotations

import contextvars
import gc
import functools
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from penrose.errors import PenroseError, Span

_P = ParamSpec("_P")
_R = TypeVar("_R")

STACK_BYTES = 512 * 1024 * 1024  # virtual: the pages are touched only as deep as the recursion goes
RECURSION_LIMIT = 200_000

_local = threading.local()
_lock = threading.Lock()
_active = [0]  # threads running deep work; the recursion limit stays raised while any does


def deep(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorator: run `fn` with room for deep recursion (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if getattr(_local, "deep", False):
            return fn(*args, **kwargs)
        result: list[_R] = []
        error: list[BaseException] = []

        context = contextvars.copy_context()  # the caller's context variables come along

        def run() -> None:
            _local.deep = True
            paused = gc.isenabled()
            if paused:  # a stage builds many small records at once: collect after it, not during it
                gc.disable()
            try:
                result.append(context.run(fn, *args, **kwargs))
            except BaseException as e:  # re-raised on the caller's thread
                error.append(e)
            finally:
                if paused:
                    gc.enable()

        with _lock:
            _active[0] += 1
            if _active[0] == 1:
                _saved[0] = sys.getrecursionlimit()
                sys.setrecursionlimit(max(RECURSION_LIMIT, _saved[0]))
            old = threading.stack_size()
            try:
                threading.stack_size(STACK_BYTES)
                worker = threading.Thread(target=run, name=f"penrose-{fn.__name__}", daemon=True)
                worker.start()  # the stack size is read when the thread starts
            finally:
                threading.stack_size(old)
        try:
            worker.join()
        finally:
            with _lock:
                _active[0] -= 1
                if _active[0] == 0:
                    sys.setrecursionlimit(_saved[0])
        if error:
            raise error[0].with_traceback(error[0].__traceback__)
        return result[0]

    return wrapper


_saved = [sys.getrecursionlimit()]


def too_deep(span: Span, what: str = "expression", kind: type[PenroseError] | None = None) -> PenroseError:
    """The error for a program deeper than even `deep` gives room for (`kind`: the PenroseError
    subclass of the stage that met it)."""
    from penrose.errors import PenroseError

    return (kind or PenroseError)(
        f"this {what} nests more than about {RECURSION_LIMIT // 20:,} levels deep; split it into several statements",
        span,
    )
