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


def lazy_table(package: str, modules: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The ``{"Name": "pkg.module"}`` table of :func:`lazy_exports` from one entry a module:
    ``{".config": ("LossConfig", "loss_preset")}``. A module with a leading dot is one of
    ``package``'s own (``package + ".config"``); any other is named in full."""
    return {
        name: package + module if module.startswith(".") else module
        for module, names in modules.items()
        for name in names
    }
