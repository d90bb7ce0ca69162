"""pyroute2's netlink message modules without the package's ``__init__``.

``pyroute2/__init__.py`` imports every socket class the library has (IPRoute, IPDB, NDB
with sqlite3, WireGuard, nl80211, ... about 160 modules) to offer them as ``pyroute2.X``.
The daemon needs three message modules (``pyroute2.netlink``, ``.netlink.diag`` and
``.netlink.nfnetlink.nfctsocket``): importing them through the whole package costs about
10 MB of RSS (measured with ``scripts/bench_rss.py``; docs/benchmarks.md), a fifth of the
daemon's.

:func:`install` puts the package in ``sys.modules`` without running its ``__init__``, so a
submodule import loads that submodule and what it needs only. Code that asks the package
itself for a name (``from pyroute2 import IPRoute``, as a test or a plugin might) still
gets it: the first such lookup runs the real ``__init__`` in the same module object, once.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

PACKAGE = "pyroute2"
_lock = threading.RLock()
# What the real __init__ defines among the names the import machinery probes
# (others, such as __path__ or __loader__, are set or rightly absent).
_PACKAGE_DUNDERS = ("__version__", "__all__")


def install() -> None:
    """Make ``import pyroute2.netlink...`` skip ``pyroute2/__init__.py``; idempotent.

    When the package is already imported (whole or lean) nothing changes.
    """
    with _lock:
        if PACKAGE in sys.modules:
            return
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.loader is None:
            return      # not installed: the caller's own import says so
        package = importlib.util.module_from_spec(spec)
        package.__getattr__ = _completing_getattr(package, spec)  # type: ignore[attr-defined]
        sys.modules[PACKAGE] = package


def _completing_getattr(package: ModuleType, spec: Any) -> Any:
    def __getattr__(name: str) -> Any:
        # Module attributes and submodules already imported never come here (PEP 562):
        # this runs only for a name the lean package lacks, such as IPRoute.
        if (name.startswith("__") and name not in _PACKAGE_DUNDERS) or _is_submodule(name):
            # ``from pyroute2 import config`` inside the library asks here first: let the
            # import system load that submodule rather than the whole package.
            raise AttributeError(name)
        with _lock:
            if package.__dict__.get("__getattr__") is not None:
                del package.__dict__["__getattr__"]
                spec.loader.exec_module(package)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None
    return __getattr__


def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{PACKAGE}.{name}") is not None
    except (ImportError, ValueError):
        return False


def is_lean() -> bool:
    """True while ``pyroute2`` is imported without its ``__init__`` having run."""
    package = sys.modules.get(PACKAGE)
    return package is not None and package.__dict__.get("__getattr__") is not None
