"""Reasoning parsers, by vLLM's `--reasoning-parser` names: they split a model's generated text into
`reasoning_content` (the `<think>…</think>` part) and `content`, whole (`extract`) or streamed
(`feed`/`finish`, one parser per choice), with the same answer however the text is split into deltas
(held back: a tail that may still become a tag, and whitespace that may end the reasoning).

    qwen3        Qwen3, Qwen3-Next, Qwen3.5/3.6 thinking models
    deepseek_r1  DeepSeek-R1 style `<think>…</think>` (no end but `</think>`)
    nemotron_v3  Nemotron 3 Nano (vLLM's `nemotron_v3`, NVIDIA's plugin `nano_v3`): deepseek_r1's rules
    kimi_k2      Kimi K2 Thinking (Kimi-Linear-48B-A3B-Instruct does not think: vLLM's recipe for it
                 sets no reasoning parser)

Where the output starts, `starts_in_reasoning` (default True, as in vLLM):

- True: the output begins inside reasoning. The templates that think put `<think>` in the prompt (Qwen3.5,
  Qwen3 *-Thinking-2507 and Qwen3-Next Thinking; Nemotron 3 Nano) and the model writes only the
  end; templates that do not (Qwen3's first releases, Kimi K2 Thinking) let the model write `<think>`
  itself, which is then skipped. Output with no end is all reasoning: the output was cut short
  (vLLM's `qwen3` and `deepseek_r1` both read it so).
- False: the output begins as content, as when thinking is off and the template closed the block in the
  prompt (`enable_thinking=False`: Qwen3 `<think>\\n\\n</think>\\n\\n`, Nemotron 3 `<think></think>`;
  Kimi `thinking=False`). vLLM routes that output to content whole (`qwen3`, `kimi_k2`) or swaps an
  unended reasoning into content (`nano_v3`); here only a `<think>` at the very start opens reasoning.
  `starts_in_reasoning_for(prompt)` reads it off the rendered prompt.

Once reasoning ends the rest is content, tags and all. Reasoning ends at `</think>` (dropped), and for
`qwen3` also at a `<tool_call>` followed by `<function=` (Qwen3.5 may start a call without closing its
thinking; vLLM's rule), for `kimi_k2` at `<|tool_calls_section_begin|>`; those tags stay in the content
for the tool parser. Whitespace at both ends of the reasoning and at the start of the content after
`</think>` is dropped (the templates strip it when they write a reasoning turn back).

Special tokens: `special_tokens` lists the tags each parser needs in the detokenized text (`<think>` and
`</think>` are added tokens not marked special in the Qwen tokenizers; a tokenizer that marks them
special needs them kept when decoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from flashstate.server.tool_parsers.base import find_first

_WS = " \t\r\n"


@dataclass(frozen=True)
class ReasoningDelta:
    """What one `feed`/`finish` settled: reasoning text, then content text (either may be "")."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class ReasoningParser:
    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    # (marker, what must follow it after optional whitespace): ends reasoning; the marker is content
    implicit_ends: ClassVar[tuple[tuple[str, str], ...]] = ()
    special_tokens: ClassVar[tuple[str, ...]] = ("<think>", "</think>")  # the tags it needs in the text

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.special_tokens = (cls.start, cls.end, *(m for m, _ in cls.implicit_ends))

    def __init__(self, starts_in_reasoning: bool = True) -> None:
        self.starts_in_reasoning = starts_in_reasoning
        self._buf = ""
        self._mode = "start"  # start → reasoning → content
        self._reasoning_said = False
        self._reasoning_ws = ""
        self._strip_content = False
        self._finished = False
        self._r: list[str] = []
        self._c: list[str] = []

    @classmethod
    def starts_in_reasoning_for(cls, prompt: str) -> bool | None:
        """From the rendered prompt: True when it ends in an open thinking block, False when it ends
        just after one the template closed, None when it says neither (keep the default)."""
        tail = prompt.rstrip(_WS)
        if tail.endswith(cls.start):
            return True
        if tail.endswith(cls.end):
            return False
        return None

    # -- the public API

    def feed(self, text: str) -> ReasoningDelta:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> ReasoningDelta:
        if self._finished:
            return ReasoningDelta()
        self._run(final=True)
        self._finished = True
        return self._take()

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a finished output, each None when empty; this parser's own
        streaming state is untouched."""
        parser = type(self)(self.starts_in_reasoning)
        a, b = parser.feed(text), parser.finish()
        reasoning, content = a.reasoning + b.reasoning, a.content + b.content
        return reasoning or None, content or None

    # -- the machine

    def _run(self, final: bool) -> None:
        while True:
            if self._mode == "start":
                if not self._start(final):
                    return
            elif self._mode == "reasoning":
                if not self._reasoning(final):
                    return
            else:
                self._content(final)
                return

    def _start(self, final: bool) -> bool:
        """Before anything: a leading `<think>` opens reasoning (and is dropped)."""
        s = self._buf.lstrip(_WS)
        if s.startswith(self.start):
            self._buf, self._mode = s[len(self.start) :], "reasoning"
            return True
        if self.start.startswith(s) and not final:
            return False
        self._mode = "reasoning" if self.starts_in_reasoning else "content"
        return True

    def _reasoning(self, final: bool) -> bool:
        buf, tags, search = self._buf, (self.end, *(m for m, _ in self.implicit_ends)), 0
        while True:
            at, tag = find_first(buf, tags, search)
            if tag is None or tag == self.end:
                break
            follow = dict(self.implicit_ends)[tag]  # an implicit end counts only with its follower
            after = buf[at + len(tag) :].lstrip(_WS)
            if after.startswith(follow):
                break
            if follow.startswith(after) and not final:
                tag = None  # not known yet: hold from the marker on
                break
            search = at + 1
        if tag is None:
            hold = len(buf) if final else at
            self._say_reasoning(buf[:hold], final)
            self._buf = buf[hold:]
            return False
        self._say_reasoning(buf[:at], True)
        self._buf = buf[at + len(tag) :] if tag == self.end else buf[at:]
        self._mode, self._strip_content = "content", True
        return True

    def _say_reasoning(self, text: str, ended: bool) -> None:
        """Reasoning text without the whitespace at its ends: leading whitespace is dropped, trailing
        whitespace held until more reasoning follows it (dropped when the reasoning ends)."""
        if not self._reasoning_said:
            text = text.lstrip(_WS)
        text = self._reasoning_ws + text
        body = text.rstrip(_WS)
        if body:
            self._r.append(body)
            self._reasoning_said = True
        self._reasoning_ws = "" if ended else text[len(body) :]

    def _content(self, final: bool) -> None:
        if self._strip_content:
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return
            self._strip_content = False
        self._c.append(self._buf)
        self._buf = ""

    def _take(self) -> ReasoningDelta:
        out = ReasoningDelta("".join(self._r), "".join(self._c))
        self._r, self._c = [], []
        return out


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    implicit_ends = (("<tool_call>", "<function="),)


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"


class NemotronV3ReasoningParser(ReasoningParser):
    name = "nemotron_v3"


class KimiK2ReasoningParser(ReasoningParser):
    name = "kimi_k2"
    implicit_ends = (("<|tool_calls_section_begin|>", ""),)


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "nemotron_v3": NemotronV3ReasoningParser,
    "nano_v3": NemotronV3ReasoningParser,
    "kimi_k2": KimiK2ReasoningParser,
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class registered as `name` (ValueError naming the choices when there is none)."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning parser {name!r}; choose one of {sorted(REASONING_PARSERS)}"
        ) from None
