"""Tokenizer: an HF tokenizer directory behind the few calls the engine makes.

`Tokenizer.from_dir(path)` reads `tokenizer.json` (the `tokenizers` library runs it) and
`tokenizer_config.json` (chat template, special tokens); a `chat_template.jinja` next to them wins over
the config's template, as newer HF exports write it there. Chat templates are rendered by jinja2 in a
sandbox with the helpers HF templates expect (`raise_exception`, `tojson`, `strftime_now`) and HF's
assistant-mask tags `{% generation %}…{% endgeneration %}` (their body renders as is). The embedded
default tokenizer lives in `default_tokenizer.py`.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken

# Chat-message ends get checkpoint positions in the last this many messages (chat_message_boundaries).
BOUNDARY_MESSAGES = 32


class ChatTemplateError(ValueError):
    """The messages are malformed, the tokenizer has no chat template, or the template failed."""


class Tokenizer:
    """Text ↔ token ids, and chat messages → prompt text."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        extra_eos_token_ids: Sequence[int] = (),
    ):
        """`special_tokens`: role → token text (`bos_token`, `eos_token`, `pad_token`, `unk_token`);
        the template sees them under those names. `extra_eos_token_ids` also end generation."""
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        eos = (
            [self.token_to_id(self.special_tokens["eos_token"])] if "eos_token" in self.special_tokens else []
        )
        self.eos_token_ids = tuple(dict.fromkeys(i for i in [*eos, *extra_eos_token_ids] if i is not None))

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`, `generation_config.json`,
        each optional)."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {path} (flashstate reads the `tokenizers` format an HF fast tokenizer "
                "saves; convert slow tokenizers with transformers' save_pretrained)"
            )
        backend = tokenizers.Tokenizer.from_file(str(file))
        config = _read_json(path / "tokenizer_config.json")
        for token in (config.get("added_tokens_decoder") or {}).values():
            if backend.token_to_id(token["content"]) is None:
                backend.add_special_tokens([special_token(token["content"])])
        template = config.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        elif isinstance(template, list):  # [{"name": ..., "template": ...}]: the "default" one
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default", next(iter(named.values()), None))
        special = {
            k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        extra = _read_json(path / "generation_config.json").get("eos_token_id")
        extra = [extra] if isinstance(extra, int) else list(extra or [])
        return cls(backend, template, special, extra)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce (added tokens included)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def id_limit(self) -> int:
        """One past the largest id that has a token (added tokens included); larger ids decode to nothing."""
        return max(self.backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text → ids. Pass `add_special_tokens=False` for a rendered chat prompt: the template already
        holds every special token the model expects."""
        return _encode(self.backend, text, add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def special_token_texts(self) -> frozenset[str]:
        """The texts of the tokens `decode(..., skip_special_tokens=True)` drops."""
        return frozenset(t.content for t in self.backend.get_added_tokens_decoder().values() if t.special)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        """The ids `decode(..., skip_special_tokens=True)` drops."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def with_chat_template(self, template: str) -> Tokenizer:
        """This tokenizer rendering chats with `template` (the same backend)."""
        _compile(template)  # a template that does not parse fails here, not on the first request
        other = Tokenizer(self.backend, template, self.special_tokens)
        other.eos_token_ids = self.eos_token_ids
        return other

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...], OpenAI style: `tool_calls` on assistant
        messages, role "tool" for results) into prompt text. `kwargs` reach the template as variables."""
        if self.chat_template is None:
            raise ChatTemplateError("this tokenizer has no chat template")
        _check_messages(messages)
        if tools is not None and not (
            isinstance(tools, Sequence) and all(isinstance(t, Mapping) for t in tools)
        ):
            raise ChatTemplateError("tools must be a list of dicts (OpenAI tool schemas)")
        context = {
            **self.special_tokens,
            **kwargs,
            "messages": [dict(m) for m in messages],
            "tools": [dict(t) for t in tools] if tools else None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return _compile(self.chat_template).render(**context)
        except ChatTemplateError:
            raise
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            LookupError,
            AttributeError,
            ArithmeticError,
        ) as e:
            # A template tripping over the messages it was given (content None concatenated, a missing
            # key...) is a bad request, not a server fault.
            raise ChatTemplateError(f"chat template failed: {e}") from e

    def chat_message_boundaries(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token positions in the full prompt where a chat message ends: strictly increasing, the last is
        always the full prompt length (`len(encode(apply_chat_template(...), add_special_tokens=False))`).

        The end of message k is where the render of `messages[:k + 1]` (without a generation prompt) stops
        inside the full render (`chat_message_ends`), rounded down to a token boundary of the full prompt's
        tokenization, so every position is a prefix of the prompt's tokens."""
        full, ends = self.chat_message_ends(messages, tools, add_generation_prompt, **kwargs)
        _, token_ends = self.encode_with_ends(full)
        return message_positions(token_ends, ends)

    def chat_message_ends(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> tuple[str, list[int]]:
        """The full render, and the character offsets in it where messages end: the end of message k is
        the length of the render of `messages[:k + 1]` (without a generation prompt). Fallback: when that
        render is not a prefix of the full render (templates that rewrite earlier turns, e.g. drop
        reasoning from all but the last assistant message) or the template refuses the shorter list,
        message k gets no offset.

        Only the last BOUNDARY_MESSAGES messages get offsets: each takes a render of the conversation up
        to it, so the work stays linear in its length however many messages an agent sends; a turn's new
        messages (what the cache lacks) are at its end, and earlier ends were positions of earlier turns.
        """
        full = self.apply_chat_template(messages, tools, add_generation_prompt, **kwargs)
        ends: list[int] = []
        for k in range(max(len(messages) - BOUNDARY_MESSAGES, 0) + 1, len(messages) + 1):
            try:
                prefix = self.apply_chat_template(messages[:k], tools, False, **kwargs)
            except ChatTemplateError:
                continue
            if full.startswith(prefix):
                ends.append(len(prefix))
        return full, ends

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """`encode(text, add_special_tokens=False)` and each token's end as a character offset in `text`
        (non-decreasing)."""
        encoding = _encode(self._untrimmed, text, add_special_tokens=False)
        return encoding.ids, [end for _, end in encoding.offsets]

    @cached_property
    def _untrimmed(self) -> tokenizers.Tokenizer:
        """The backend without its post-processor: the same ids when no special tokens are added, and offsets
        straight from the pre-tokenizer (a ByteLevel post-processor's `trim_offsets` shrinks whitespace
        tokens' spans)."""
        plain = tokenizers.Tokenizer.from_str(self.backend.to_str())
        plain.post_processor = None
        return plain


def load_chat_template(value: str) -> str:
    """A `--chat-template` value: the file it names, or else the template itself when it holds `{`, `}`
    or a newline (vLLM's rule). ValueError when it is neither, ChatTemplateError when it does not parse."""
    path = Path(value)
    if path.is_file():
        template = path.read_text()
    elif any(c in value for c in "{}\n"):
        template = value
    else:
        raise ValueError(f"chat template {value!r} is neither a file nor a template")
    _compile(template)
    return template


def message_positions(token_ends: Sequence[int], char_ends: Sequence[int]) -> list[int]:
    """Token positions of messages ending at `char_ends`: each rounded down to a token boundary (the
    tokens whose end is at or before it), and the prompt's length; positive, strictly increasing."""
    positions = [bisect_right(token_ends, end) for end in char_ends]
    positions.append(len(token_ends))
    return sorted({p for p in positions if p > 0})


class JsonObject(dict):
    """A tool call's `arguments` object parsed from the JSON text a client sent: templates iterate it as
    a dict (`arguments|items`), and `tojson` without options writes back `text`, the client's exact
    text, so a turn the model generated renders as the same tokens (the prefix cache's hit)."""

    __slots__ = ("text",)

    def __init__(self, value: dict, text: str):
        super().__init__(value)
        self.text = text


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def _token_text(value: str | Mapping | None) -> str | None:
    if isinstance(value, Mapping):  # old configs: {"content": "<s>", "__type": "AddedToken", ...}
        return value.get("content")
    return value


def special_token(text: str) -> AddedToken:
    return AddedToken(text, special=True, normalized=False)


def _check_messages(messages: Any) -> None:
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"message {i} must be a dict with 'role' and 'content', got {m!r:.80}")
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"message {i} has no string 'role': {dict(m)!r:.80}")
        content = m.get("content")
        if content is None and "content" not in m and not m.get("tool_calls"):
            raise ChatTemplateError(f"message {i} ({m['role']}) has neither 'content' nor 'tool_calls'")
        if content is not None and not isinstance(content, str | list):
            raise ChatTemplateError(
                f"message {i} content must be a string or a list of parts, got {type(content).__name__}"
            )


class _TemplateRaised(jinja2.TemplateError):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators=None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own `tojson` HTML-escapes <, >, & and '; prompts need the plain JSON.
    plain = not ensure_ascii and indent is None and separators is None and not sort_keys
    if plain and isinstance(value, JsonObject):
        return value.text
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTags(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: HF marks the assistant's tokens for training masks with
    them; rendering a prompt keeps the body as it is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the `generation` name
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTags]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse (line {e.lineno}): {e.message}") from e


def _encode(backend: tokenizers.Tokenizer, text: str, add_special_tokens: bool) -> tokenizers.Encoding:
    """`backend.encode`, without the GIL: the single-text `encode` holds it throughout (a 20k-token prompt
    takes tens of ms), and the engine thread, which steps on the same GIL, stalls for as long; the batch
    call releases it while it runs."""
    return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]


# --- the embedded default tokenizer ---------------------------------------------------------------------
