"""An OpenEnv server's JSON schemas as text: :func:`openenv_schema` (``GET /schema``) and
:class:`SchemaMapping` (action text -> action JSON, observation JSON -> text or chat).

The rules are :mod:`gymllm.envs.openenv_adapter`'s "Schemas" and "Spaces" (module doc): one text
field of the action schema takes the action string unless ``action_field`` / ``action_fn`` say
otherwise; the observation's text likewise; a ``gymllm serve-env`` server marks its observation
schema with :data:`OBSERVATION_HINT`.
"""

from __future__ import annotations

import re
from typing import Any

from gymllm.envs.openenv_config import OpenEnvConfig, OpenEnvError
from gymllm.errors import ConfigError, explain
from gymllm.spaces import Chat, Text
from gymllm.validation import require_instance

__all__ = ["OBSERVATION_HINT", "SchemaMapping", "openenv_schema"]

OBSERVATION_HINT = (
    "x-gymllm-observation"  # key a gymllm server adds to its observation schema: "text" | "chat"
)
_BASE_OBS_FIELDS = ("done", "reward", "metadata")


def openenv_schema(
    base_url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 10.0
) -> dict:
    """The server's ``GET /schema``: ``{"action": ..., "observation": ..., "state": ...}`` JSON schemas."""
    import httpx

    url = re.sub(r"^ws", "http", base_url.rstrip("/")) + "/schema"
    try:
        r = httpx.get(url, timeout=timeout_s, headers=headers)
    except httpx.HTTPError as e:
        raise OpenEnvError(
            explain(
                f"GET {url}",
                expected="an OpenEnv server answering",
                received=f"{type(e).__name__}: {e}",
                fix="start it (`gymllm serve-env ENV_ID --port P`) or check base_url",
            ),
            cause=e,
        ) from e
    if r.status_code != 200:
        raise OpenEnvError(
            explain(
                f"GET {url}",
                expected="HTTP 200 with the env's JSON schemas",
                received=f"HTTP {r.status_code}: {r.text[:200]}",
                fix="pass token=... if the server requires one; check that base_url is an "
                "OpenEnv server",
            ),
            code=f"HTTP_{r.status_code}",
        )
    return r.json()


def _is_text(prop: dict) -> bool:
    if prop.get("type") == "string":
        return True
    return any(isinstance(p, dict) and p.get("type") == "string" for p in prop.get("anyOf", ()))


def _text_prop(prop: dict) -> dict:
    if prop.get("type") == "string":
        return prop
    return next(
        p for p in prop.get("anyOf", ()) if isinstance(p, dict) and p.get("type") == "string"
    )


class SchemaMapping:
    """Action text -> action JSON and observation JSON -> text, from the server's schemas."""

    def __init__(self, cfg: OpenEnvConfig, schema: dict):
        self.cfg = cfg
        action = schema.get("action") or {}
        props = dict(action.get("properties") or {})
        props.pop("metadata", None)
        required = set(action.get("required") or ()) - {"metadata"}
        self.action_field: str | None = None
        self.action_space = Text()
        if cfg.action_fn is None:
            field = cfg.action_field
            if field is None:
                texts = [k for k, p in props.items() if _is_text(p)]
                if len(texts) != 1 or required - {texts[0]}:
                    raise ConfigError(
                        explain(
                            f"from_openenv({cfg.base_url!r})",
                            expected="an action schema with one text field",
                            received=f"fields {sorted(props)} (required: {sorted(required)})",
                            fix="pass action_field='<name>' or action_fn=lambda text: {...}",
                        )
                    )
                field = texts[0]
            elif field not in props:
                raise ConfigError(
                    explain(
                        "from_openenv(action_field)",
                        expected=f"one of {sorted(props)}",
                        received=field,
                        fix="name a field of the server's action schema",
                    )
                )
            self.action_field = field
            if _is_text(props[field]):
                p = _text_prop(props[field])
                self.action_space = Text(
                    min_length=int(p.get("minLength", 0)),
                    max_length=int(p.get("maxLength", 1 << 20)),
                )
        obs = schema.get("observation") or {}
        oprops = {
            k: v for k, v in (obs.get("properties") or {}).items() if k not in _BASE_OBS_FIELDS
        }
        self.hint = obs.get(OBSERVATION_HINT)  # set by gymllm servers
        self.obs_field: str | None = None
        if cfg.observation_fn is None and self.hint is None:
            field = cfg.observation_field
            if field is None:
                texts = [k for k, p in oprops.items() if _is_text(p)]
                if len(texts) == 1:
                    field = texts[0]
                elif "messages" in oprops:
                    field = "messages"
                else:
                    raise ConfigError(
                        explain(
                            f"from_openenv({cfg.base_url!r})",
                            expected="an observation schema with one text field (or 'messages')",
                            received=f"fields {sorted(oprops)}",
                            fix="pass observation_field='<name>' or observation_fn=lambda obs: ...",
                        )
                    )
            elif field not in oprops:
                raise ConfigError(
                    explain(
                        "from_openenv(observation_field)",
                        expected=f"one of {sorted(oprops)}",
                        received=field,
                        fix="name a field of the server's observation schema",
                    )
                )
            self.obs_field = field
        chat = self.hint == "chat" or (
            self.obs_field is not None and not _is_text(oprops.get(self.obs_field, {}))
        )
        self.observation_space = Chat() if chat else Text()

    def action(self, text: str) -> dict:
        if self.cfg.action_fn is not None:
            payload = self.cfg.action_fn(text)
            require_instance(
                payload,
                dict,
                "from_openenv(action_fn)",
                expected="a dict (the action's JSON)",
                fix="return e.g. {'message': text}",
            )
            return payload
        return {self.action_field: text}

    def observation(self, data: dict) -> tuple[Any, float, bool, bool, dict]:
        """An OpenEnv observation payload -> (obs, reward, terminated, truncated, info)."""
        raw = dict(data.get("observation") or {})
        meta = data.get("metadata") or raw.pop("metadata", None) or {}
        raw.pop("metadata", None)
        done = bool(data.get("done", False))
        reward = float(data.get("reward") or 0.0)
        if self.cfg.observation_fn is not None:
            obs, info = self.cfg.observation_fn(raw), dict(meta)
        elif self.hint is not None:  # a gymllm server: text or messages, and the env's own info
            obs = raw["messages"] if raw.get("messages") is not None else raw.get("text", "")
            info = dict(meta.get("info") or {})
        else:
            obs = raw.pop(self.obs_field, "")
            info = dict(meta)
            if raw:
                info["observation"] = raw
        truncated = bool(meta.get("truncated", False))
        terminated = bool(meta.get("terminated", done and not truncated))
        return obs, reward, terminated, truncated, info
