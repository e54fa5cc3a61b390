"""Where compiled diagrams live: every generated module is an ordinary, importable module here.

`penrose.compile` prints a diagram's module source, and this package makes it a real module
named after the source's content, `penrose.generated.<diagram>_<hash>`, registered in
`sys.modules`. So the classes have an importable `__module__`, as torch.compile, torch.export,
`inspect` and `pickle` expect of any class, and compiling the same diagram at the same sizes twice
gives the same module, once.

A model pickles as itself: each generated class reduces an instance to its recipe (the checked
diagram it was generated from, penrose.compiler.Recipe) and its state. Unpickling in a fresh
process regenerates the module from the recipe (`rebuild`), so nothing but penrose needs to be
importable there, and no source text from the pickle is executed.

>>> import penrose, pickle
>>> m = penrose.compile("dim e = 2\\ninput x[e]\\ny = x * 2\\noutput y")
>>> type(m).__module__.startswith("penrose.generated.")
True
>>> type(pickle.loads(pickle.dumps(m))) is type(m)
True
"""

from __future__ import annotations

import hashlib
import linecache
import re
import sys
import types
from collections.abc import Callable
from types import CodeType
from typing import Any, Protocol

__all__ = ["carries", "module_for", "rebuild"]


class _Recipe(Protocol):
    def module(self) -> types.ModuleType: ...


def _stem(label: str) -> str:
    """A diagram's name as the leading part of a module name (an identifier, lower case)."""
    stem = re.sub(r"[^0-9A-Za-z_]+", "_", label).strip("_").lower()[:40]
    return stem if stem[:1].isalpha() else "diagram_" + stem


def module_for(source: str, label: str, to_code: Callable[[str, str], CodeType], namespace: dict[str, Any]) -> types.ModuleType:
    """The module of generated `source`, named after `label` and the source's hash: the
    registered one if this source was loaded before, else a new one, its code made by
    `to_code(source, filename)` and run with `namespace`'s names, then registered."""
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    name = f"{__name__}.{_stem(label)}_{digest}"
    found = sys.modules.get(name)
    if found is not None:
        return found
    filename = f"<{name}>"  # tracebacks and inspect read the lines from linecache
    code = to_code(source, filename)
    module = types.ModuleType(name, None)
    module.__file__ = filename
    module.__dict__.update(namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, module.__dict__)  # generated from validated identifiers only (penrose.compiler)
    sys.modules[name] = module
    setattr(sys.modules[__name__], name.rsplit(".", 1)[1], module)
    return module


def carries(cls: type, recipe: _Recipe) -> None:
    """Make instances of the generated class `cls` pickle as (its recipe, its name, their state)."""
    cls.penrose_recipe = recipe  # type: ignore[attr-defined]
    cls.__reduce_ex__ = _reduce_instance  # type: ignore[method-assign, assignment]


def _reduce_instance(self: Any, protocol: int) -> tuple:
    """`__reduce_ex__` of every generated class: the recipe, the class's name in its module, the state."""
    cls = type(self)
    return (rebuild, (cls.penrose_recipe, cls.__qualname__), self.__getstate__())


def rebuild(recipe: _Recipe, qualname: str) -> Any:
    """An empty instance of the generated class `qualname`, its module made from `recipe` if this
    process has not made it yet (pickle then restores the instance's state)."""
    cls = getattr(recipe.module(), qualname)
    return cls.__new__(cls)
