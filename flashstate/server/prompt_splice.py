"""Prompt splicing: an assistant message this server generated is tokenized as the ids it generated.

An agent re-sends each answer as text (`content`, the `arguments` of its `tool_calls`) and the chat
template renders it into the next prompt. Encoding that text afresh rarely gives the sampled ids back
(BPE merges across what were separate sampled tokens), so the next prompt leaves the cached token path
inside the previous answer, before the previous turn's frontier. Token-in/token-out agents (SGLang's,
vLLM's) send the ids; this does the same for agents that send text:

    finish   GeneratedIds.remember_output: the reply's texts (its whole text, its content, each call's
             arguments) found in decode(generated ids) at token boundaries → those ids, kept in a
             bounded map (LRU by bytes, keyed by a digest of scope + text)
    render   splice_prompt: the request's assistant contents and call arguments found in the map are
             replaced by markers, the template renders, and the text between markers is encoded as
             usual while each marker becomes its generated ids

Special tokens the model generated inside a reply (a random-weight model samples them; `ignore_eos`
runs past an end token) are not in its text when the request skipped them, as it does by default: such a
text is found in the decode that skips them too, and its span keeps them, since the ids the model ran
are what the next turn's cached path holds.

Invariant: a spliced prompt decodes to exactly the plain rendering once the special tokens hidden in
remembered spans are left out (`decode(ids) == text`, checked, as is that the marked rendering with the
texts put back is the plain rendering); on any mismatch the plain tokenization is used. Only the
tokenization of spans the model produced changes, never the prompt text.

Scope: the cache salt a request's prefix-cache lookups use (tenant and `cache_salt`), so one tenant's
prompts never tokenize differently because of another's outputs.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flashstate.tokenizer import JsonObject, Tokenizer, message_positions

ENTRY_OVERHEAD = 96  # bytes counted per entry besides its ids (key, array header, map slot)
MAX_OCCURRENCES = 4  # occurrences of a text in the output tried for token alignment


class GeneratedIds:
    """(scope, text) → the ids the model generated for exactly that text; LRU, at most `capacity` bytes
    (4 per id + ENTRY_OVERHEAD per entry). Thread-safe: prompts render in worker threads."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.bytes = 0
        self._entries: OrderedDict[bytes, array] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(scope: str | None, text: str) -> bytes:
        head = b"\x00" if scope is None else b"\x01" + scope.encode() + b"\x00"
        return hashlib.blake2b(head + text.encode(), digest_size=16).digest()

    def put(self, scope: str | None, text: str, ids: Sequence[int]) -> None:
        size = 4 * len(ids) + ENTRY_OVERHEAD
        if not ids or size > self.capacity:
            return
        key = self._key(scope, text)
        with self._lock:
            if (old := self._entries.pop(key, None)) is not None:
                self.bytes -= 4 * len(old) + ENTRY_OVERHEAD
            self._entries[key] = array("i", ids)
            self.bytes += size
            while self.bytes > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self.bytes -= 4 * len(evicted) + ENTRY_OVERHEAD

    def get(self, scope: str | None, text: str) -> list[int] | None:
        key = self._key(scope, text)
        with self._lock:
            ids = self._entries.get(key)
            if ids is None:
                return None
            self._entries.move_to_end(key)
            return ids.tolist()

    def remember_output(
        self, tokenizer: Tokenizer, scope: str | None, ids: Sequence[int], texts: Iterable[str]
    ) -> int:
        """Remember each of `texts` (the reply's text, content, call arguments) that is the decode of a
        run of `ids` (the generated tokens): with special tokens as their text, or else without the
        special tokens (the reply's text skipped them); the run keeps them either way. Returns how many."""
        if self.capacity <= 0 or not ids:
            return 0
        ids = list(ids)
        decodes: dict[bool, str] = {}  # skip_special_tokens -> decode(ids), the second only when needed
        done = 0
        for text in dict.fromkeys(t for t in texts if t):
            for skip in (False, True):
                if skip not in decodes:
                    decodes[skip] = tokenizer.decode(ids, skip_special_tokens=skip)
                span = _token_span(tokenizer, ids, decodes[skip], text, skip)
                if span is not None:
                    self.put(scope, text, ids[span[0] : span[1]])
                    done += 1
                    break
        return done


def _token_span(
    tokenizer: Tokenizer, ids: list[int], full: str, text: str, skip: bool
) -> tuple[int, int] | None:
    """[i, j) with decode(ids[i:j]) == text, where `text` starts and ends on token boundaries of `full`
    (= decode(ids)); None when no occurrence does. `skip`: the decodes skip special tokens."""
    start = full.find(text)
    for _ in range(MAX_OCCURRENCES):
        if start < 0:
            return None
        i = _tokens_before(tokenizer, ids, full, start, skip)
        j = _tokens_before(tokenizer, ids, full, start + len(text), skip)
        if (
            i is not None
            and j is not None
            and j > i
            and tokenizer.decode(ids[i:j], skip_special_tokens=skip) == text
        ):
            return i, j
        start = full.find(text, start + 1)
    return None


def _tokens_before(tokenizer: Tokenizer, ids: list[int], full: str, n: int, skip: bool) -> int | None:
    """The fewest k with decode(ids[:k]) == full[:n], found by bisection on the decoded length (which
    grows with k); None when `n` falls inside a token."""
    if n == 0:
        return 0
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=skip)) >= n:
            hi = mid
        else:
            lo = mid + 1
    return lo if tokenizer.decode(ids[:lo], skip_special_tokens=skip) == full[:n] else None


def splice_prompt(
    tokenizer: Tokenizer,
    memory: GeneratedIds,
    scope: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    kwargs: Mapping[str, Any],
    text: str,
    char_ends: Sequence[int],
) -> tuple[list[int], list[int]] | None:
    """The prompt's ids with every remembered assistant span as its generated ids, and the token positions
    where messages end (`char_ends`, from Tokenizer.chat_message_ends); None when no span is remembered or
    the spliced prompt would not be exactly `text` (the plain rendering): then tokenize plainly."""
    nonce = secrets.token_hex(4)
    spans: dict[str, tuple[str, list[int]]] = {}  # marker → (text, generated ids)

    def mark(value: str) -> str | None:
        ids = memory.get(scope, value)
        if ids is None:
            return None
        marker = f"\ue000splice{len(spans)}.{nonce}\ue001"
        spans[marker] = (value, ids)
        return marker

    marked_messages = []
    for message in messages:
        if message.get("role") != "assistant":
            marked_messages.append(message)
            continue
        m = dict(message)
        content = m.get("content")
        if isinstance(content, str) and content and (marker := mark(content)) is not None:
            m["content"] = marker
        if calls := m.get("tool_calls"):
            m["tool_calls"] = [_marked_call(call, mark) for call in calls]
        marked_messages.append(m)
    if not spans or any(marker in text for marker in spans):
        return None
    try:
        marked = tokenizer.apply_chat_template(marked_messages, tools, add_generation_prompt, **kwargs)
    except ValueError:  # ChatTemplateError: a template that tests the content it was given
        return None
    pieces = re.split("(" + "|".join(map(re.escape, spans)) + ")", marked)
    # pieces: text, marker, text, marker, ..., text (even indexes: template text to encode)
    if "".join(spans[p][0] if k % 2 else p for k, p in enumerate(pieces)) != text:
        return None  # the template treats the marker unlike the text (trims it, escapes it, ...)
    ids: list[int] = []
    shown: list[int] = []  # ids less the special tokens a remembered span's text does not show
    token_ends: list[int] = []
    offset = 0
    for k, piece in enumerate(pieces):
        if k % 2:
            span_text, span_ids = spans[piece]
            offset += len(span_text)
            ids += span_ids
            shown += _shown(tokenizer, span_ids, span_text)
            token_ends += [offset] * len(span_ids)  # no message ends inside a span
        elif piece:
            piece_ids, ends = tokenizer.encode_with_ends(piece)
            ids += piece_ids
            shown += piece_ids
            token_ends += [offset + e for e in ends]
            offset += len(piece)
    if tokenizer.decode(shown, skip_special_tokens=False) != text:
        return None  # e.g. a tokenizer that adds a prefix space to each piece it encodes
    return ids, message_positions(token_ends, char_ends)


def _shown(tokenizer: Tokenizer, ids: list[int], text: str) -> list[int]:
    """A remembered span's ids as its text shows them: all, or without the special tokens when the text
    was found in the decode that skips them (GeneratedIds.remember_output). Decodes only a span that
    holds a special token: every chat prompt re-renders its history's spans."""
    hidden = tokenizer.special_token_ids
    if hidden.isdisjoint(ids) or tokenizer.decode(ids, skip_special_tokens=False) == text:
        return ids
    return [i for i in ids if i not in hidden]


def _marked_call(call: Any, mark) -> Any:
    """A tool call whose `arguments` (a JsonObject, whose text the template writes) is a remembered
    text, with that text replaced by its marker; otherwise the call as it was."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    arguments = call["function"].get("arguments")
    if not isinstance(arguments, JsonObject) or (marker := mark(arguments.text)) is None:
        return call
    return {**call, "function": {**call["function"], "arguments": JsonObject(arguments, marker)}}
