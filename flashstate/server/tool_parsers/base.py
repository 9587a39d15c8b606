"""The common part of the tool-call parsers: the types they return and the streaming machinery.

A parser reads the detokenized text of one choice. Two ways to use it:

- finished output: `parser.extract(text)` → `(content, calls)`: `content` is the text outside the calls
  (None when empty or only whitespace), `calls` the `ToolCall`s in order. It never raises: text that
  does not turn out to be a call is content.
- streamed output: one parser per choice; `parser.feed(delta_text)` for each new piece of text, then
  `parser.finish()` once; each returns the events (`ContentDelta`, `ToolCallDelta`) that piece settled.
  The events of a call come as one `ToolCallDelta` with its index, id and name (arguments "") and then
  `ToolCallDelta`s with argument fragments only.

Both are the same state machine (`extract` feeds the whole text to a fresh parser and joins the events),
so a streamed reply equals the non-streamed one however the text is split into deltas: the machine
decides only on text it has, and holds back a tail that might still become a tag (`<tool_c…`) until the
next piece tells. A call's name goes out only when it is complete. At `finish()` whatever was held back
and never became a valid call is content.

When a call's events go out, `stream_arguments` says:

- False (the default): when the call is complete and valid (for each format, the point is in its
  module): the header event and then its arguments. A call that turns out malformed (bad JSON, the
  output stopping inside it) was never shown, and its text is content.
- True: the header as soon as the name is complete, then the arguments as they come (vLLM's way; a
  client sees a long argument grow). A call then stands whatever follows: output that stops inside it
  (max_tokens) gives the arguments as far as they came, and arguments that turn out not to be JSON
  come through as the model wrote them.

Whitespace between content and a call, between calls, and after the last call is not content, except
that content going on after calls keeps the whitespace it starts with when content came before them.

Special tokens: the parsers see text, and `decode(..., skip_special_tokens=True)` drops every token the
tokenizer marks special. Each parser lists in `special_tokens` the tags it needs; the server must decode
so that they survive (in the Qwen and Kimi tokenizers they are added tokens *not* marked special, so they
already do; a tokenizer that marks one special needs it kept explicitly).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

Tools = Sequence[Mapping[str, Any]]


def new_call_id() -> str:
    """`call_` and 24 random hex digits, the shape OpenAI and vLLM give tool-call ids."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call; `arguments` is JSON text (an object), as OpenAI's `function.arguments`."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)
    type: str = "function"

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ContentDelta:
    text: str

    def to_openai(self) -> dict[str, Any]:
        return {"content": self.text}


@dataclass(frozen=True)
class ToolCallDelta:
    """A call's first event carries `id` and `name` (arguments ""); the later ones an argument fragment."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {}
        if self.id is not None:
            out["id"], out["type"] = self.id, "function"
        if self.name is not None:
            function["name"] = self.name
        function["arguments"] = self.arguments
        out["function"] = function
        return out


Delta = ContentDelta | ToolCallDelta


def delta_message(events: Iterable[Delta]) -> dict[str, Any] | None:
    """The OpenAI chat-chunk `delta` for the events of one `feed`/`finish` (None when there are none):
    their content joined, and their tool-call pieces in order."""
    content, calls = [], []
    for e in events:
        if isinstance(e, ContentDelta):
            content.append(e.text)
        else:
            calls.append(e.to_openai())
    if not content and not calls:
        return None
    out: dict[str, Any] = {}
    if content:
        out["content"] = "".join(content)
    if calls:
        out["tool_calls"] = calls
    return out


def collect(events: Iterable[Delta]) -> tuple[str | None, list[ToolCall]]:
    """Join streamed events into what `extract` returns: (content or None, the calls in index order)."""
    text: list[str] = []
    heads: dict[int, ToolCallDelta] = {}
    args: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ContentDelta):
            text.append(e.text)
        elif e.name is not None:
            heads[e.index] = e
            args[e.index] = [e.arguments]
        else:
            args.setdefault(e.index, []).append(e.arguments)
    content = "".join(text)
    calls = [
        ToolCall(name=h.name or "", arguments="".join(args[i]), id=h.id or new_call_id())
        for i, h in sorted(heads.items())
    ]
    return (content if content.strip() else None), calls


def find_first(buf: str, tags: Sequence[str], start: int = 0) -> tuple[int, str | None]:
    """The first of `tags` in `buf[start:]` as (position, tag); when there is none, (safe, None) where
    `buf[:safe]` holds no tag's start: `buf[safe:]` is the tail that is a proper prefix of some tag."""
    best, found = -1, None
    for tag in tags:
        i = buf.find(tag, start)
        if i != -1 and (best == -1 or i < best):
            best, found = i, tag
    if found is not None:
        return best, found
    return partial_start(buf, tags, start), None


def partial_start(buf: str, tags: Sequence[str], start: int = 0) -> int:
    """Where a tail of `buf` that is a proper prefix of one of `tags` begins (len(buf) when none)."""
    n = len(buf)
    for i in range(max(start, n - max(len(t) for t in tags) + 1), n):
        tail = buf[i:]
        if any(t.startswith(tail) for t in tags):
            return i
    return n


class ToolParser:
    """A state machine over the text of one choice; see the module docstring for the contract.

    Subclasses set `name`, `special_tokens` and `self._state` (a method `(final: bool) -> bool` that
    consumes from `self._buf`: True when it moved on, False when it needs more text or, with `final`,
    has nothing left to do), and may override `_valid` (whether a held call's arguments make it a call)
    and `_truncated` (with `stream_arguments`, the text that closes arguments the output stopped
    inside). A call's text starts at the head of `self._buf` when `_begin_call` is called, and ends
    with what was consumed when `_end_call` is."""

    name: ClassVar[str] = ""
    special_tokens: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: Tools | None = None, *, stream_arguments: bool = False) -> None:
        self.tools: list[Mapping[str, Any]] = list(tools or [])
        self.stream_arguments = stream_arguments
        self._buf = ""
        self._seen = 0  # characters fed so far
        self._text: list[str] = []  # held mode: the open call's text so far (it is content if no call)
        self._out: list[Delta] = []
        self._pending_ws = ""  # whitespace after the last content, held until we know what follows
        self._after_call = False  # the last thing out was a call (only whitespace since)
        self._said = False  # some content went out
        self._next_index = 0
        self._open: int | None = None
        self._held: list[Delta] | None = None  # the open call's events, when they wait for its end
        self._call_start = 0
        self._saved: tuple[str, bool] = ("", False)
        self._finished = False
        self._state: Callable[[bool], bool] = self._text_state

    # -- the public API

    def feed(self, text: str) -> list[Delta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if text:
            self._buf += text
            self._seen += len(text)
            if self._held is not None:
                self._text.append(text)
            self._run(final=False)
        return self._take()

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._run(final=True)
        if self._open is not None:
            if self.stream_arguments:
                self._args(self._truncated())
                self._end_call()
            else:
                self._rollback()
        if self._pending_ws and not self._after_call:
            self._emit(ContentDelta(self._pending_ws))
        self._pending_ws = ""
        self._finished = True
        return self._take()

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The content and calls of a finished output; this parser's own streaming state is untouched."""
        parser = self.fresh()
        return collect(parser.feed(text) + parser.finish())

    def fresh(self) -> ToolParser:
        return type(self)(self.tools, stream_arguments=self.stream_arguments)

    # -- for subclasses

    OPEN_TAGS: tuple[str, ...] = ()  # the tags that may start a call

    def _text_state(self, final: bool) -> bool:
        """Content up to the first of OPEN_TAGS, a tail that may begin one held back until `final`; at a
        tag the buffer starts with it and `_at_open(tag)` picks the next state."""
        if not self.OPEN_TAGS:
            self._content(self._buf)
            self._buf = ""
            return False
        i, tag = find_first(self._buf, self.OPEN_TAGS)
        if tag is None:
            cut = len(self._buf) if final else i
            self._content(self._buf[:cut])
            self._buf = self._buf[cut:]
            return False
        self._content(self._buf[:i])
        self._buf = self._buf[i:]
        self._at_open(tag)
        return True

    def _at_open(self, tag: str) -> None:
        raise NotImplementedError

    def _truncated(self) -> str:
        return ""

    def _valid(self, arguments: str) -> bool:
        """Whether a held call whose text has ended is a call (else its text is content)."""
        return True

    def _consumed(self) -> int:
        return self._seen - len(self._buf)

    def _run(self, final: bool) -> None:
        while self._state(final):
            pass

    def _content(self, text: str) -> None:
        if not text:
            return
        if not text.strip():
            self._pending_ws += text
            return
        full = self._pending_ws + text
        if self._after_call:
            self._after_call = False
            if not self._said:  # calls came first: the content starts at its first non-blank
                full = full.lstrip()
        body = full.rstrip()
        self._emit(ContentDelta(body))
        self._said = True
        self._pending_ws = full[len(body) :]

    def _begin_call(self, name: str, call_id: str | None = None) -> None:
        """A call begins; its text starts at the head of `self._buf`."""
        self._saved = (self._pending_ws, self._after_call)
        self._pending_ws = ""
        self._open = self._next_index
        self._next_index += 1
        self._call_start = self._consumed()
        if not self.stream_arguments:
            self._held, self._text = [], [self._buf]
        self._emit(ToolCallDelta(self._open, "", call_id or new_call_id(), name))

    def _args(self, fragment: str) -> None:
        if fragment and self._open is not None:
            self._emit(ToolCallDelta(self._open, fragment))

    def _end_call(self) -> None:
        """The call's text has ended (everything consumed from `self._buf` so far belongs to it)."""
        held, self._held = self._held, None
        if held is not None:
            if not self._valid("".join(e.arguments for e in held if isinstance(e, ToolCallDelta))):
                self._held = held
                self._rollback()
                return
            for event in held:
                self._emit(event)
            self._text = []
        self._open = None
        self._after_call = True
        self._pending_ws = ""

    def _rollback(self) -> None:
        """Held mode: the open call is no call after all; the text it took is content."""
        text = "".join(self._text)[: self._consumed() - self._call_start]
        self._text = []
        self._held, self._open = None, None
        self._next_index -= 1
        self._pending_ws, self._after_call = self._saved
        self._content(text)

    def _emit(self, event: Delta) -> None:
        append_delta(self._out if self._held is None else self._held, event)

    def _take(self) -> list[Delta]:
        out, self._out = self._out, []
        return out


def append_delta(out: list[Delta], event: Delta) -> None:
    """Append `event`, merged into the last event when both are content, or argument text of one call."""
    last = out[-1] if out else None
    if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
        out[-1] = ContentDelta(last.text + event.text)
    elif (
        isinstance(event, ToolCallDelta)
        and isinstance(last, ToolCallDelta)
        and event.name is None
        and last.name is None
        and last.index == event.index
    ):
        out[-1] = ToolCallDelta(last.index, last.arguments + event.arguments)
    else:
        out.append(event)


def tool_schemas(tools: Tools | None) -> dict[str, Mapping[str, Any]]:
    """Function name → its `parameters` JSON schema, from OpenAI-shaped `tools` (`{"type": "function",
    "function": {...}}`) or bare function objects."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, Mapping) else {}
    return out
