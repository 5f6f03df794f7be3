"""The ``multiagent.policies`` map: which seat each trained policy plays.

    policy_map('{"first": "a", "second": "b"}')          # -> {"first": "a", "second": "b"}
    check_policy_seats({"first": "a"}, ["first", "second"], opponent="random")

A policy map is a JSON object from seat to policy name. Several seats may share one policy (its
groups then come from each of them, never mixed in one group). :func:`check_policies` checks a
:class:`~gymllm.rollout.seat_source.MultiAgentSection` on creation (the text, the names and how the
map composes with the other fields); :func:`check_policy_seats` checks the map against a game's seats
once the game is known. The training side is :mod:`gymllm.train.policies`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gymllm.errors import ConfigError, explain
from gymllm.validation import require

__all__ = ["policy_map", "check_policies", "check_policy_seats"]

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
EXAMPLE = """--multiagent.policies '{"player_0": "a", "player_1": "b"}'"""


def policy_map(text: str) -> dict[str, str]:
    """The seat -> policy name map of ``text`` (``""``: no map, ``{}``); a ConfigError names what is wrong."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ConfigError(
            explain(
                "multiagent.policies",
                expected="a JSON object from seat to policy name",
                received=text,
                fix=f"e.g. {EXAMPLE} (quote it for your shell; {e})",
            )
        ) from e
    require(
        isinstance(value, dict) and value,
        "multiagent.policies",
        expected="a non-empty JSON object from seat to policy name",
        received=text,
        fix=f"e.g. {EXAMPLE}",
    )
    bad = {k: v for k, v in value.items() if not k or not isinstance(v, str) or not _NAME.match(v)}
    require(
        not bad,
        "multiagent.policies",
        expected="non-empty seat names mapped to policy names of "
        "letters, digits, '_' and '-' (they name metrics and checkpoint entries)",
        received=bad,
        fix=f"e.g. {EXAMPLE}",
    )
    return dict(value)


def check_policies(section: Any) -> None:
    """Check ``section``'s ``policies`` and ``policy_weights`` and refuse the combinations not served."""
    require(
        section.policy_weights in ("lora", "full"),
        "multiagent.policy_weights",
        expected="'lora' (an adapter per policy on the "
        "shared base) or 'full' (full weights per policy)",
        received=section.policy_weights,
        fix="--multiagent.policy-weights lora",
    )
    require(
        isinstance(section.policies, str),
        "multiagent.policies",
        expected="the JSON text of an object from seat to policy name",
        received=section.policies,
        fix=f"e.g. {EXAMPLE}",
    )
    if not policy_map(section.policies):
        return
    o = section.opponent
    require(
        o != "frozen" and not o.startswith("run:"),
        "multiagent.opponent",
        expected="'self', 'random' or 'MODULE:FN' with "
        "multiagent.policies (a frozen snapshot of which policy is not defined)",
        received=o,
        fix="drop --multiagent.opponent (self-play between the policies), or "
        "use random / MODULE:FN for the seats no policy plays",
    )
    require(
        section.learner_seats == ("all",),
        "multiagent.learner_seats",
        expected="('all',) with multiagent.policies (the policies' seats are the trained seats)",
        received=list(section.learner_seats),
        fix="drop --multiagent.learner-seats and name only the trained seats in "
        "--multiagent.policies",
    )


def check_policy_seats(policies: dict[str, str], possible: list[str], *, opponent: str) -> None:
    """The map's seats must be seats of the game; in self-play every seat needs a policy."""
    unknown = [s for s in policies if s not in possible]
    require(
        not unknown,
        "multiagent.policies",
        expected=f"seats of this game: {possible}",
        received=policies,
        fix=f"drop or rename {unknown}",
    )
    missing = [s for s in possible if s not in policies]
    require(
        opponent != "self" or not missing,
        "multiagent.policies",
        expected=f"a policy for every seat in self-play: {possible}",
        received=policies,
        fix=f"map {missing} too (a seat may reuse a policy name), or "
        "give the other seats to --multiagent.opponent random or MODULE:FN",
    )
