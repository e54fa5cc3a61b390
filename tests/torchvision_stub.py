"""A test-only stand-in for torchvision, so that timm's layers import beside torch 2.13.0.

timm imports torchvision at import time (FrozenBatchNorm2d, transforms, datasets) but its
transformer, mixer and MLP layers never use it; PyPI's torchvision does not import beside this
torch. `install()` makes `import torchvision...` succeed with empty modules whose attributes
are placeholder classes — only when the real torchvision cannot be imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"  # InterpolationMode.NEAREST and the like: a distinct value


class _Module(types.ModuleType):
    __path__: tuple = ()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _Placeholder(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__version__ = "0.0.0+penrose-test-stub"
        return module

    def exec_module(self, module):
        pass


def install() -> bool:
    """Stand in for torchvision when it cannot be imported; True when the stub is in use."""
    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # noqa: BLE001 - missing, or built for another torch
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _Finder())
        return True
