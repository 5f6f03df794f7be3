"""Lazy public names for packages: ``__getattr__, __dir__ = lazy_exports(__name__, {"Name": "pkg.module"})``.

A name is imported from its module on first access, so importing a package stays cheap (no JAX
until a JAX-backed name is used). ``cache=True`` stores the value in the package afterwards.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(
    package: str, table: dict[str, str], *, cache: bool = True
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        if cache:
            setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(table) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
