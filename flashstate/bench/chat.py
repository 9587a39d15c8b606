"""Chat mode: an agent's context as the messages an agent framework sends to `/v1/chat/completions`.

The context is the same list of `Segment`s token mode sends (prompts.py: the same trace spans, kept and
cut the same way), with trace spans labelled by what they stand for and written as words (`word`, one
word per as many ids as the server's tokenizer spends on a word, so a span of n ids is about n tokens):

    turn 0      | system | tools | user |           the trace's `system_tokens` and `tool_tokens` (scaled)
                                                     open the first prompt: a system message and the tool
                                                     definitions (`tools`, four functions whose
                                                     descriptions hold the span), the rest a user message
    turn k > 0  ... | assistant | tool |             new input that the trace marks `tool_result`, after an
                ... | assistant | user |             assistant turn with tool calls: one `tool` message per
                                                     call (`tool_call_id`); otherwise a user message

The assistant turn sent back is what the server answered, read the way an OpenAI-API agent reads it:
`content` and `tool_calls` are re-sent, `reasoning_content` is not (the server re-renders the history
with its chat template, so every difference between that rendering and the generated tokens is a
divergence before the previous turn's frontier). A random-weight model writes neither `<think>` nor
tool-call tags, so where the trace says the recorded answer held them and the server's parsers found
none, the answer is shaped as the trace says:

- `thinking` in `output_types`: the first `thinking_share` of the generated text (cut at a space) stands
  for the reasoning and is not re-sent;
- `tool_use` in `output_types` (or `stop: tool_use`): one tool call is attached, `{"input": <3 words>}`
  to a function picked by the turn's hash, deterministic per (scope, turn) so every policy sees the same
  call. Its tokens were not generated: they are new tokens of the next prompt, like the tool result.

`tool_choice` is "auto" (what agents send) where the server has a tool-call parser, else "none".
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from flashstate.bench.client import Completion
from flashstate.bench.prompts import BlockTokens, Segment, scaled, word
from flashstate.bench.workloads import Request, Session

TOOL_NAMES = ("Bash", "Read", "Edit", "Grep")
CALL_WORDS = 3  # words in a synthesised call's argument
CALL_OVERHEAD = 25  # tokens of a rendered call besides its words (tags, JSON, the function's name)


def words(ids: list[int], per_word: float = 1.0) -> str:
    """A span's text: one word per `per_word` ids (the server's tokens per word, `calibrate`), taken at
    fixed positions so a prefix of the ids gives a prefix of the words."""
    r = max(1.0, per_word)
    return " ".join(word(i) for p, i in enumerate(ids) if int((p + 1) / r) > int(p / r))


CALIBRATION_WORDS = 2000


async def calibrate(http: httpx.AsyncClient, base_url: str, model: str | None) -> float | None:
    """The server's tokens per word of `words` text, from its `/tokenize` (None: it has none)."""
    text = " " + " ".join(word(i * 7919) for i in range(CALIBRATION_WORDS))
    body = {"prompt": text, "add_special_tokens": False} | ({"model": model} if model else {})
    try:
        resp = await http.post(f"{base_url}/tokenize", json=body, timeout=30.0)
        return resp.json()["count"] / CALIBRATION_WORDS if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


async def tool_choice(http: httpx.AsyncClient, base_url: str, model: str | None) -> str:
    """`auto` where the server reads tool calls out of the output (a one-token probe with one tool),
    else `none`: the tools still reach the template, the calls the trace records are attached here."""
    body = {
        "messages": [{"role": "user", "content": "probe"}],
        "tools": tool_definitions([1], 1.0)[:1],
        "tool_choice": "auto",
        "max_tokens": 1,
    } | ({"model": model} if model else {})
    try:
        resp = await http.post(f"{base_url}/v1/chat/completions", json=body, timeout=60.0)
    except httpx.HTTPError:
        return "auto"  # the replay's own requests will say what is wrong
    return "none" if resp.status_code == 400 else "auto"


def first_turn(new: Segment, session: Session, length_scale: float, tools: bool) -> list[Segment]:
    """The first prompt's span split into system, tool definitions and user (each non-empty or left out;
    the user message keeps at least one token)."""
    n = len(new.ids)
    system = scaled(session.meta["system_tokens"], length_scale) if "system_tokens" in session.meta else 0
    defs = scaled(session.meta["tool_tokens"], length_scale) if tools and "tool_tokens" in session.meta else 0
    system = min(system, n - 1)
    defs = min(defs, n - 1 - system)
    spans = [("system", 0, system), ("tools", system, system + defs), ("user", system + defs, n)]
    return [Segment(role, new.ids[a:b]) for role, a, b in spans if b > a]


def next_input(context: list[Segment], new: Segment, req: Request) -> Segment:
    """A later turn's new span: tool results when the trace says so and the last turn called tools."""
    last = context[-1] if context else None
    if "tool_result" in req.input_types and last is not None and last.role == "assistant" and last.calls:
        return Segment("tool", new.ids, None, last.calls)
    return new


def tool_definitions(ids: list[int], per_word: float) -> list[dict[str, Any]]:
    """Four functions whose descriptions share the span (in order, so a cut span cuts the last ones)."""
    k = len(TOOL_NAMES)
    size = -(-len(ids) // k)
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": words(ids[i * size : (i + 1) * size], per_word),
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string"}},
                    "required": ["input"],
                },
            },
        }
        for i, name in enumerate(TOOL_NAMES)
    ]


def render(
    context: list[Segment], per_word: float = 1.0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The request's `messages` and `tools` for a context. Adjacent user (or system) spans are one
    message; a tool result whose calls were cut away (a rewrite) is a user message."""
    messages: list[dict[str, Any]] = []
    tools = None
    for s in context:
        if s.role == "tools":
            tools = tool_definitions(s.ids, per_word)
            continue
        if s.role == "assistant":
            if s.text is None and not s.calls:
                continue  # cut by a rewrite: its text is gone
            msg: dict[str, Any] = {"role": "assistant", "content": s.text or ""}
            if s.calls:
                msg["tool_calls"] = s.calls
            messages.append(msg)
            continue
        prev = messages[-1] if messages else None
        if s.role == "tool" and prev is not None and prev.get("tool_calls") and s.calls:
            calls = prev["tool_calls"]
            size = -(-len(s.ids) // len(calls))
            for i, call in enumerate(calls):
                part = s.ids[i * size : (i + 1) * size]
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": words(part, per_word)}
                )
            continue
        role = "user" if s.role == "tool" else s.role
        content = words(s.ids, per_word)
        if prev is not None and prev["role"] == role and role in ("user", "system"):
            prev["content"] += " " + content
        else:
            messages.append({"role": role, "content": content})
    return messages, tools


def synthetic_call(blocks: BlockTokens, scope: str, req: Request, turn: int) -> dict[str, Any]:
    """The tool call the recorded agent made here, as words: same (scope, turn, last block) → same call."""
    anchor = req.hash_ids[-1] if req.hash_ids else None
    ids = blocks.tail(scope, ("call", turn, anchor), 0)[:CALL_WORDS]
    return {
        "id": f"call_{turn}_{ids[0]}",
        "type": "function",
        "function": {
            "name": TOOL_NAMES[ids[-1] % len(TOOL_NAMES)],
            "arguments": json.dumps({"input": words(ids)}),
        },
    }


def _cut_thinking(text: str, share: float) -> str:
    """The text after its first `share` (cut at a space at or after that point)."""
    if share <= 0 or not text:
        return text
    at = text.find(" ", int(len(text) * share))
    return "" if at < 0 else text[at + 1 :]


def assistant_turn(
    c: Completion,
    req: Request,
    blocks: BlockTokens,
    scope: str,
    turn: int,
    thinking_share: float,
    tools: bool,
    per_word: float = 1.0,
) -> Segment:
    """The assistant message the agent re-sends (module docstring), with an estimate of its length in
    tokens: the generated count times the share of the text kept, plus the calls' (so the next turn's new
    input is that much shorter and the prompt keeps the trace's length)."""
    content = c.text
    if not c.reasoning and "thinking" in req.output_types:
        content = _cut_thinking(content, thinking_share)
    calls = [dict(call) for call in c.tool_calls] or None
    if tools and calls is None and ("tool_use" in req.output_types or req.stop == "tool_use"):
        calls = [synthetic_call(blocks, scope, req, turn)]
    kept = len(content) / len(c.text) if c.text else 0.0
    per_call = round(CALL_WORDS * max(1.0, per_word)) + CALL_OVERHEAD
    n = round(c.completion_tokens * kept) + per_call * len(calls or ())
    return Segment("assistant", [0] * max(1, n), content, calls)  # 0 ids would be cut as past the end
