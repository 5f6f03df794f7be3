"""A benchmark suite file (TOML): which envs, with which seeds, kwargs, sampling and weights.

    name = "core"
    k = 4                      # defaults for every env (each may be overridden in an [[env]] table)
    num_seeds = 16
    seed_base = 1_000_000      # held-out seeds: seed_base .. seed_base + num_seeds - 1
    max_tokens = 256
    max_turns = 4
    temperature = 0.7
    success_threshold = 1.0

    [[env]]
    id = "gymllm/Arithmetic-v0"          # registered id, 'module:EnvId-v0' or 'module:factory'
    name = "arithmetic"                  # unique in the suite (default: the id)
    kwargs = { digits = 2 }
    seeds = [1_000_000, 1_000_007]       # or num_seeds = 8 (not both)
    weight = 2.0                         # share of a training mixture and of the suite-wide "*" score
    agent = "model"                      # "model" | "tool" (default: tool when the env offers tools)
    system_prompt = "Answer briefly."

Every key of the top level (except ``name``, ``description`` and ``env``) is a default an ``[[env]]``
table may override. :func:`parse_suite` checks everything and raises :class:`SuiteError` naming the
key, the table and the fix (an unknown key with the nearest allowed one, a duplicate name, an unknown
env with the nearest registered ids, a wrong type). Shipped suites live in ``gymllm/suites/data/``;
:func:`load_suite` takes a path or a shipped suite's name (``core``, ``games``, ``reasoning``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import pathlib
import tomllib
from typing import Any, Callable, Mapping, Sequence

from gymllm.utils.seeds import HELD_OUT_SEED_BASE
from gymllm.errors import ConfigError, explain
from gymllm.validation import is_int, require, require_instance

__all__ = [
    "SuiteError",
    "SuiteEnv",
    "Suite",
    "DEFAULTS",
    "SUITES_DIR",
    "shipped_suites",
    "load_suite",
    "parse_suite",
    "apply_overrides",
    "one_off_suite",
]

SUITES_DIR = pathlib.Path(__file__).resolve().parent / "data"

#: the defaults of every env, and their values when the file gives none
DEFAULTS: dict[str, Any] = {
    "k": 4,
    "num_seeds": 16,
    "seed_base": HELD_OUT_SEED_BASE,
    "max_tokens": 256,
    "max_turns": 4,
    "temperature": 0.7,
    "success_threshold": 1.0,
}
_TOP_ONLY = ("name", "description", "env")
_ENV_ONLY = ("id", "name", "kwargs", "seeds", "weight", "agent", "system_prompt")
TOP_KEYS = (*_TOP_ONLY, *DEFAULTS)
ENV_KEYS = (*_ENV_ONLY, *DEFAULTS)


class SuiteError(ConfigError):
    """A suite file that cannot be used; the message names the key, the table and the fix."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SuiteEnv:
    """One env of a suite, every default filled in. ``target``: what the id resolved to (a registry
    id, or a factory for ``module:factory``); ``seeds``: the held-out env seeds, in order (seed ``i`` of
    the list is group ``i``: its sampling seeds follow from ``seed_base`` and ``i``)."""

    id: str
    name: str
    kwargs: dict[str, Any]
    seeds: tuple[int, ...]
    k: int
    weight: float
    max_turns: int
    max_tokens: int
    temperature: float
    success_threshold: float
    seed_base: int
    agent: str | None = None
    system_prompt: str | None = None
    target: Any = dataclasses.field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
            for f in dataclasses.fields(self)
            if f.name != "target"
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Suite:
    """A parsed suite: ``name``, ``envs`` (in file order), ``source`` (the file, or ``"<command line>"``)."""

    name: str
    envs: tuple[SuiteEnv, ...]
    source: str = ""
    description: str = ""

    def env(self, name: str) -> SuiteEnv:
        for e in self.envs:
            if e.name == name:
                return e
        raise KeyError(
            f"suite {self.name!r} has no env named {name!r}; expected one of {[e.name for e in self.envs]}"
        )

    @property
    def weights(self) -> dict[str, float]:
        """Each env's weight over the suite's total (sums to 1)."""
        total = sum(e.weight for e in self.envs)
        return {e.name: e.weight / total for e in self.envs}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "envs": [e.to_dict() for e in self.envs],
        }


def shipped_suites() -> list[str]:
    """Names of the suites gymllm ships (``gymllm/suites/data/*.toml``)."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def load_suite(
    ref: str | pathlib.Path, *, resolve: bool = True, overrides: Mapping[str, Any] | None = None
) -> Suite:
    """The suite in file ``ref``, or the shipped suite named ``ref`` (``core``, ``core.toml``).
    ``resolve``: resolve every env id now (imports ``module:...`` ids; unknown ids fail here).
    ``overrides``: values of :data:`DEFAULTS` keys that replace the file's for every env (its
    ``[[env]]`` tables' own values too; ``num_seeds`` or ``seed_base`` also replace a ``seeds`` list)."""
    path = pathlib.Path(ref)
    if not path.is_file():
        shipped = SUITES_DIR / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
        if str(ref) == path.name and shipped.is_file():
            path = shipped
        else:
            names = shipped_suites()
            close = difflib.get_close_matches(path.stem, names, n=2)
            raise SuiteError(
                explain(
                    "--suite",
                    expected=f"a suite TOML file, or a shipped suite: {', '.join(names)}",
                    received=str(ref),
                    fix=(f"did you mean {', '.join(close)}?" if close else "check the path"),
                )
            )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SuiteError(
            explain(
                f"suite {path}",
                expected="valid TOML",
                received=str(e),
                fix="fix the line the parser names",
            )
        ) from e
    return parse_suite(
        apply_overrides(data, overrides or {}),
        source=str(path),
        default_name=path.stem,
        resolve=resolve,
    )


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a suite's data with ``overrides`` (keys of :data:`DEFAULTS`) set for every env."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    require(
        not unknown,
        "suite overrides",
        expected=f"keys of {', '.join(DEFAULTS)}",
        received=unknown,
        fix="override only the per-env defaults",
        error=SuiteError,
    )
    out = {**data, **overrides}
    if isinstance(data.get("env"), list):
        drop = set(overrides) | (
            {"seeds"} if {"num_seeds", "seed_base"} & set(overrides) else set()
        )
        out["env"] = [
            {k: v for k, v in t.items() if k not in drop} if isinstance(t, dict) else t
            for t in data["env"]
        ]
    return out


def _require_key(ok: Any, where: str, key: str, *, expected: str, received: Any, fix: str) -> None:
    """:func:`~gymllm.validation.require` for key ``key`` of the table at ``where``: a
    :class:`SuiteError` naming both unless ``ok``."""
    require(
        ok,
        f"{where}: key {key!r}",
        expected=expected,
        received=received,
        fix=fix,
        error=SuiteError,
    )


def _near(key: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"rename it to {close[0]!r}" if close else f"remove it (allowed: {', '.join(allowed)})"


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in table:
        _require_key(
            key in allowed,
            where,
            key,
            expected=f"one of {', '.join(allowed)}",
            received=key,
            fix=_near(key, allowed),
        )


def _int(value: Any, key: str, where: str, lo: int) -> int:
    _require_key(
        is_int(value) and value >= lo,
        where,
        key,
        expected=f"an integer >= {lo}",
        received=value,
        fix=f"set {key} = {max(lo, 1)} or more",
    )
    return value


def _float(value: Any, key: str, where: str, lo: float | None, strict: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if strict else value >= lo
    if not ok:
        bound = "" if lo is None else f" {'>' if strict else '>='} {lo}"
        raise SuiteError(
            explain(
                f"{where}: key {key!r}",
                expected=f"a finite number{bound}",
                received=value,
                fix=f"set {key} = 1.0"
                if key != "temperature"
                else "set temperature = 0.7 (0: greedy)",
            )
        )
    return float(value)


_CHECKS: dict[str, Callable[[Any, str, str], Any]] = {
    "k": lambda v, k, w: _int(v, k, w, 1),
    "num_seeds": lambda v, k, w: _int(v, k, w, 1),
    "seed_base": lambda v, k, w: _int(v, k, w, 0),
    "max_tokens": lambda v, k, w: _int(v, k, w, 1),
    "max_turns": lambda v, k, w: _int(v, k, w, 1),
    "temperature": lambda v, k, w: _float(v, k, w, 0.0),
    "success_threshold": lambda v, k, w: _float(v, k, w, None),
}


def _defaults(table: Mapping[str, Any], base: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for key in DEFAULTS:
        if key in table:
            out[key] = _CHECKS[key](table[key], key, where)
    return out


def _str(value: Any, key: str, where: str, fix: str) -> str:
    _require_key(
        isinstance(value, str) and value.strip(),
        where,
        key,
        expected="a non-empty string",
        received=value,
        fix=fix,
    )
    return value


def _text(table: Mapping[str, Any], key: str, where: str, default: str | None, fix: str) -> Any:
    """``table.get(key, default)``: a string, or ``default`` itself (else a :class:`SuiteError`)."""
    value = table.get(key, default)
    _require_key(
        isinstance(value, str) or value is default,
        where,
        key,
        expected="a string",
        received=value,
        fix=fix,
    )
    return value


def _env(table: Any, index: int, top: Mapping[str, Any], src: str, resolve: bool) -> SuiteEnv:
    where = f"suite {src}, [[env]] #{index + 1}"
    require(
        isinstance(table, dict),
        where,
        expected="a table ([[env]] with id = ...)",
        received=table,
        fix="write each env as an [[env]] table",
        error=SuiteError,
    )
    _require_key(
        "id" in table,
        where,
        "id",
        expected="the env's id",
        received="no id",
        fix="add id = 'gymllm/Arithmetic-v0' (`gymllm envs` lists the ids)",
    )
    env_id = _str(table["id"], "id", where, "set id = 'gymllm/Arithmetic-v0'")
    where = f"suite {src}, [[env]] #{index + 1} (id = {env_id!r})"
    _check_keys(table, ENV_KEYS, where)
    values = _defaults(table, top, where)
    name = _str(table.get("name", env_id), "name", where, "set name = 'arithmetic'")
    _require_key(
        name != "*",
        where,
        "name",
        expected="a name other than '*' (the whole suite's)",
        received=name,
        fix="pick another name",
    )
    kwargs = table.get("kwargs", {})
    _require_key(
        isinstance(kwargs, dict),
        where,
        "kwargs",
        expected="a table of constructor arguments",
        received=kwargs,
        fix="write kwargs = { digits = 2 }",
    )
    if "seeds" in table:
        require(
            "num_seeds" not in table,
            f"{where}: keys 'seeds' and 'num_seeds'",
            expected="one of them",
            received="both",
            fix="drop num_seeds (the seeds list gives the count)",
            error=SuiteError,
        )
        seeds = table["seeds"]
        _require_key(
            isinstance(seeds, list) and seeds and all(is_int(s) and s >= 0 for s in seeds),
            where,
            "seeds",
            expected="a non-empty list of integers >= 0",
            received=seeds,
            fix="write seeds = [1000000, 1000001]",
        )
        if len(set(seeds)) != len(seeds):
            dup = sorted({s for s in seeds if seeds.count(s) > 1})
            raise SuiteError(
                explain(
                    f"{where}: key 'seeds'",
                    expected="distinct seeds",
                    received=f"{dup} repeated",
                    fix="list each seed once",
                )
            )
        seeds_t = tuple(seeds)
    else:
        seeds_t = tuple(range(values["seed_base"], values["seed_base"] + values["num_seeds"]))
    weight = _float(table.get("weight", 1.0), "weight", where, 0.0)
    agent = table.get("agent")
    _require_key(
        agent in (None, "model", "tool"),
        where,
        "agent",
        expected="'model' or 'tool'",
        received=agent,
        fix="set agent = 'tool' for envs with tools, else 'model' (or leave it out)",
    )
    system_prompt = _text(
        table, "system_prompt", where, None, "quote it: system_prompt = 'Answer briefly.'"
    )
    target = None
    if resolve:
        from gymllm.registration import resolve_env_id

        try:
            target = resolve_env_id(env_id, where=f"{where}: key 'id'")
        except ConfigError as e:
            raise SuiteError(str(e)) from e
    return SuiteEnv(
        id=env_id,
        name=name,
        kwargs=dict(kwargs),
        seeds=seeds_t,
        k=values["k"],
        weight=weight,
        max_turns=values["max_turns"],
        max_tokens=values["max_tokens"],
        temperature=values["temperature"],
        success_threshold=values["success_threshold"],
        seed_base=values["seed_base"],
        agent=agent,
        system_prompt=system_prompt,
        target=target,
    )


def parse_suite(
    data: Mapping[str, Any],
    *,
    source: str = "<suite>",
    default_name: str = "suite",
    resolve: bool = True,
) -> Suite:
    """A :class:`Suite` from the TOML's data (see the module doc); :class:`SuiteError` on anything wrong."""
    where = f"suite {source}, top level"
    require_instance(
        data, Mapping, where, expected="a TOML table", fix="write a TOML file", error=SuiteError
    )
    _check_keys(data, TOP_KEYS, where)
    top = _defaults(data, DEFAULTS, where)
    name = _str(data.get("name", default_name), "name", where, "set name = 'my-suite'")
    description = _text(data, "description", where, "", "quote it")
    tables = data.get("env")
    _require_key(
        isinstance(tables, list) and tables,
        where,
        "env",
        expected="at least one [[env]] table",
        received=tables if tables is not None else "none",
        fix="add [[env]] followed by id = 'gymllm/Arithmetic-v0'",
    )
    envs = [_env(t, i, top, source, resolve) for i, t in enumerate(tables)]
    seen: dict[str, int] = {}
    for i, e in enumerate(envs):
        if e.name in seen:
            raise SuiteError(
                explain(
                    f"suite {source}, [[env]] #{i + 1} (id = {e.id!r}): key 'name'",
                    expected="a name unique in the suite",
                    received=f"{e.name!r}, also the name of [[env]] #{seen[e.name] + 1}",
                    fix=f"give one of them a distinct name, e.g. name = '{e.name.rsplit('/', 1)[-1]}-{i + 1}'",
                )
            )
        seen[e.name] = i
    require(
        sum(e.weight for e in envs) > 0,
        f"suite {source}: key 'weight'",
        expected="some env with weight > 0",
        received="every weight 0",
        fix="set weight = 1.0 on the envs to count",
        error=SuiteError,
    )
    return Suite(name=name, envs=tuple(envs), source=source, description=description)


def one_off_suite(
    env_ids: Sequence[str],
    *,
    name: str = "one-off",
    env_kwargs: Mapping[str, Any] | None = None,
    resolve: bool = True,
    **defaults: Any,
) -> Suite:
    """The suite ``gymllm eval env ENV...`` runs: one env per id, ``env_kwargs`` for each, ``defaults`` (any
    of :data:`DEFAULTS`) at the top level."""
    data = {
        "name": name,
        **defaults,
        "env": [{"id": i, **({"kwargs": dict(env_kwargs)} if env_kwargs else {})} for i in env_ids],
    }
    return parse_suite(data, source="<command line>", default_name=name, resolve=resolve)
