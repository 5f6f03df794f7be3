"""``TokenizerBundle``: a ``tokenizers.Tokenizer`` with its special tokens and chat template.

* ``encode(text)`` never adds special tokens (special-token *text* inside ``text`` still maps to
  its single id, as in transformers); ``decode(ids)`` keeps special tokens unless asked not to.
* ``apply_chat_template(messages, tools=None, add_generation_prompt=False, tokenize=False)``
  renders with Hugging Face semantics (:mod:`gymllm.models.chat_templates`). When ``tools`` are
  given but the template ignores them (SmolLM2's), the Hermes/Qwen tools block is merged into the
  system message instead of being dropped silently -- the one deliberate difference from
  transformers, so tool envs work with every model.
* ``stop_token_ids``: the eos id plus the chat turn terminators found in the vocabulary.
* ``is_prefix_preserving(roles)``: whether appending one message of each role to a conversation
  that ends with an assistant turn only *appends* text and tokens (what token-in/token-out
  rollouts need to extend a trajectory without re-tokenizing it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from gymllm.errors import ModelLoadError
from gymllm.models.chat_templates import (
    render_chat_template,
    template_supports_tools,
    tools_system_prompt,
)
from gymllm.validation import require, require_instance


def require_file(path: Path, what: str, *, fix: str) -> Path:
    """``path``, or a :class:`~gymllm.errors.ModelLoadError` when there is no such file (``what``: what
    reads it, as the error names it; ``fix``: what to do)."""
    require(
        path.exists(),
        what,
        expected=str(path),
        received="no such file",
        fix=fix,
        error=ModelLoadError,
    )
    return path


_TURN_TERMINATORS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|end|>",
    "<eos>",
)


@dataclasses.dataclass(kw_only=True)
class TokenizerBundle:
    """A tokenizer, its special tokens and its chat template."""

    tokenizer: Any  # tokenizers.Tokenizer
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    extra_stop_tokens: tuple[str, ...] = ()
    add_bos_token: bool = False  # the model expects bos first (Gemma); encode() never adds it

    def __post_init__(self) -> None:
        for field in ("bos_token", "eos_token", "pad_token"):
            tok = getattr(self, field)
            require(
                tok is None or self.tokenizer.token_to_id(tok) is not None,
                f"TokenizerBundle.{field}",
                expected="a token in the vocabulary",
                received=tok,
                fix="name a token the tokenizer knows, or None",
                error=ModelLoadError,
            )

    # ----- ids -----
    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(int(token_id))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int:
        """The pad id (the eos id when the tokenizer has no pad token, else 0)."""
        for tok in (self.pad_token, self.eos_token):
            if tok is not None:
                return self.token_to_id(tok)
        return 0

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        names = [self.eos_token, *self.extra_stop_tokens, *_TURN_TERMINATORS]
        ids: list[int] = []
        for name in names:
            i = None if name is None else self.token_to_id(name)
            if i is not None and i not in ids:
                ids.append(i)
        return tuple(ids)

    # ----- text -----
    def encode(self, text: str) -> list[int]:
        require_instance(
            text,
            str,
            "TokenizerBundle.encode",
            expected="str",
            fix="pass text; for chats use apply_chat_template",
            error=TypeError,
        )
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ----- chat -----
    def apply_chat_template(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **context: Any,
    ) -> str | list[int]:
        """Render (and optionally tokenize) a conversation with the model's chat template."""
        require(
            bool(self.chat_template),
            "apply_chat_template",
            expected="a tokenizer with a chat template",
            received=None,
            fix="load a chat (instruct) model or set chat_template",
            error=ModelLoadError,
        )
        messages = [dict(m) for m in messages]
        if tools and not template_supports_tools(self.chat_template):
            messages = _with_tools_in_system(messages, tools)
            tools = None
        text = render_chat_template(
            self.chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **context,
        )
        return self.encode(text) if tokenize else text

    def is_prefix_preserving(self, roles: Sequence[str] = ("user", "tool")) -> bool:
        """Whether appending a message of each role to an assistant-ended chat only appends."""
        base = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "The sum is 5."},
        ]
        extra = {
            "user": {"role": "user", "content": "And 4 more?"},
            "tool": {"role": "tool", "content": "9", "name": "calculator"},
            "assistant": {"role": "assistant", "content": "Done."},
            "system": {"role": "system", "content": "Be brief."},
        }
        try:
            before = self.apply_chat_template(base)
            for role in roles:
                after = self.apply_chat_template(base + [extra[role]], add_generation_prompt=True)
                if not after.startswith(before):
                    return False
                ids_before, ids_after = self.encode(before), self.encode(after)
                if ids_after[: len(ids_before)] != ids_before:
                    return False
        except Exception:  # a template that refuses a role is not prefix preserving for it
            return False
        return True

    # ----- persistence (Hugging Face layout) -----
    def save(self, directory: str | os.PathLike) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(d / "tokenizer.json"))
        cfg = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "chat_template": self.chat_template,
            "add_bos_token": self.add_bos_token,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> "TokenizerBundle":
        """Read a Hugging Face tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``)."""
        from tokenizers import Tokenizer

        d = Path(directory)
        path = require_file(
            d / "tokenizer.json",
            "tokenizer",
            fix="save the fast tokenizer (tokenizer.json) next to the weights",
        )
        tok = Tokenizer.from_file(str(path))
        cfg = (
            json.loads((d / "tokenizer_config.json").read_text())
            if (d / "tokenizer_config.json").exists()
            else {}
        )
        template = cfg.get("chat_template")
        if template is None and (d / "chat_template.jinja").exists():
            template = (d / "chat_template.jinja").read_text()
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next(
                (t["template"] for t in template if t.get("name") == "default"),
                template[0]["template"],
            )

        def name(key: str) -> str | None:
            v = cfg.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return v if v is not None and tok.token_to_id(v) is not None else None

        return cls(
            tokenizer=tok,
            chat_template=template,
            bos_token=name("bos_token"),
            eos_token=name("eos_token"),
            pad_token=name("pad_token"),
            add_bos_token=bool(cfg.get("add_bos_token", False)),
        )


def _with_tools_in_system(messages: list[dict], tools: Sequence[dict]) -> list[dict]:
    if messages and messages[0].get("role") == "system":
        return [
            {
                "role": "system",
                "content": tools_system_prompt(tools, messages[0].get("content", "")),
            },
            *messages[1:],
        ]
    return [{"role": "system", "content": tools_system_prompt(tools)}, *messages]


def stop_ids(tokenizer: Any, given: Iterable[int] | None = None) -> frozenset[int]:
    """The ids that end a reply: ``given`` when not None, else ``tokenizer``'s ``stop_token_ids``
    (none without a tokenizer or without that attribute)."""
    stops = given if given is not None else getattr(tokenizer, "stop_token_ids", ())
    return frozenset(int(i) for i in (stops or ()))
