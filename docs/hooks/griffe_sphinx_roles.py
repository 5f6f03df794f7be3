"""A griffe extension for the API reference: gymllm's docstrings use Sphinx roles; render them as Markdown.

``:class:`~gymllm.core.TextEnv``` becomes a cross-reference ``[`TextEnv`][gymllm.core.TextEnv]`` when
the target is a public, documented object that the reference renders (looked up as written, then
relative to the docstring's own object, class and module); any other role becomes a code span, so
no unresolvable link reaches ``mkdocs build --strict``. A reST literal-block marker (``Example::``)
becomes a plain colon (the indented block after it is Markdown code already).

Loaded by mkdocs.yml (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`")


def _target(obj: Any, name: str) -> Any | None:
    """The object ``name`` refers to from ``obj``'s docstring, or None."""
    collection = obj.modules_collection
    scopes = [""]
    scope = obj
    while scope is not None:
        scopes.append(scope.path + ".")
        scope = scope.parent
    for prefix in scopes:
        try:
            found = collection[prefix + name]
            return found.final_target if found.is_alias else found
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError, ValueError):
            continue
    return None


def _rendered(target: Any) -> bool:
    """Whether the reference renders ``target`` (public path, documented, not inside a function)."""
    if any(part.startswith("_") and not part.startswith("__") for part in target.path.split(".")):
        return False
    if not target.path.startswith("gymllm.") and target.path != "gymllm":
        return False
    parent = target.parent
    while parent is not None:
        if parent.is_function:
            return False
        parent = parent.parent
    return bool(target.has_docstrings)


def rewrite(obj: Any, text: str) -> str:
    """``text`` (a docstring of ``obj``) with Sphinx roles as Markdown references or code spans."""

    def one(m: re.Match) -> str:
        body = m.group("body").strip()
        explicit = re.match(r"^(?P<title>.+?)\s*<(?P<name>[^>]+)>$", body)
        name = (explicit.group("name") if explicit else body).lstrip("~").removesuffix("()")
        title = explicit.group("title") if explicit else (name.split(".")[-1] if body.startswith("~") else name)
        target = _target(obj, name)
        if target is not None and _rendered(target):
            return f"[`{title}`][{target.path}]"
        return f"`{title}`"

    text = ROLE.sub(one, text)
    text = re.sub(r"(?m)(?<=\S)::$", ":", text)
    return re.sub(r"(?m)^\s*::$", "", text)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of the loaded package once it is loaded (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
