"""Tokenizer: an HF tokenizer directory behind the few calls the engine makes, plus the embedded default.

`Tokenizer.from_dir(path)` reads `tokenizer.json` (the `tokenizers` library runs it) and
`tokenizer_config.json` (chat template, special tokens); a `chat_template.jinja` next to them wins over
the config's template, as newer HF exports write it there. Chat templates are rendered by jinja2 in a
sandbox with the helpers HF templates expect (`raise_exception`, `tojson`, `strftime_now`).

`build_default_tokenizer()` makes the embedded model's tokenizer from nothing: byte-level BPE, merges
learned in code from `_CORPUS` (a string constant, so every machine builds the same `tokenizer.json`):

    ids [0, 256)                      one token per byte (GPT-2's byte → printable character map)
    ids [256, DEFAULT_VOCAB_SIZE - 3) merged tokens, in merge order
    ids DEFAULT_VOCAB_SIZE - 3 .. - 1 <|endoftext|>, <|im_start|>, <|im_end|>
"""

from __future__ import annotations

import heapq
import json
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers

DEFAULT_VOCAB_SIZE = 2048
DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = range(DEFAULT_VOCAB_SIZE - 3, DEFAULT_VOCAB_SIZE)


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
                backend.add_special_tokens([_added(token["content"])])
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

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text → ids. Pass `add_special_tokens=False` for a rendered chat prompt: the template already
        holds every special token the model expects."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

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
        inside the full render, rounded down to a token boundary of the full prompt's tokenization, so
        every position is a prefix of the prompt's tokens. Fallback: when that render is not a prefix of the
        full render (templates that rewrite earlier turns, e.g. drop reasoning from all but the last
        assistant message) or the template refuses the shorter list, message k gets no position.
        """
        full = self.apply_chat_template(messages, tools, add_generation_prompt, **kwargs)
        encoding = self._untrimmed.encode(full, add_special_tokens=False)
        ends = [end for _, end in encoding.offsets]  # character offsets, non-decreasing
        positions: list[int] = []
        for k in range(1, len(messages) + 1):
            try:
                prefix = self.apply_chat_template(messages[:k], tools, False, **kwargs)
            except ChatTemplateError:
                continue
            if full.startswith(prefix):
                positions.append(bisect_right(ends, len(prefix)))
        positions.append(len(encoding.ids))
        return sorted({p for p in positions if p > 0})

    @cached_property
    def _untrimmed(self) -> tokenizers.Tokenizer:
        """The backend without its post-processor: the same ids when no special tokens are added, and offsets
        straight from the pre-tokenizer (a ByteLevel post-processor's `trim_offsets` shrinks whitespace
        tokens' spans)."""
        plain = tokenizers.Tokenizer.from_str(self.backend.to_str())
        plain.post_processor = None
        return plain


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def _token_text(value: str | Mapping | None) -> str | None:
    if isinstance(value, Mapping):  # old configs: {"content": "<s>", "__type": "AddedToken", ...}
        return value.get("content")
    return value


def _added(text: str) -> AddedToken:
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
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse (line {e.lineno}): {e.message}") from e


# --- the embedded default tokenizer ---------------------------------------------------------------------

DEFAULT_CHAT_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content -%}{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set system_first = messages and messages[0].role == 'system' -%}
{%- if tools -%}
<|im_start|>system
{% if system_first %}{{ text(messages[0].content) }}

{% endif %}
You can call the tools below. Each line is one tool's JSON schema:
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
To call tools, write one JSON object per call, each between <tool_call> and </tool_call>:
<tool_call>
{"name": "tool name", "arguments": {"argument": "value"}}
</tool_call><|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if not (loop.first and system_first and tools) -%}
<|im_start|>{{ message.role }}
{{ text(message.content) }}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if loop.first and message.content %}{{ '\\n' }}{% endif -%}
<tool_call>
{"name": {{ fn.name | tojson }}, "arguments": \
{{ fn.arguments if fn.arguments is string else (fn.arguments | tojson) }}}
</tool_call>
{%- if not loop.last %}{{ '\\n' }}{% endif -%}
{%- endfor -%}
<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""


def build_default_tokenizer() -> tokenizers.Tokenizer:
    """The embedded byte-level BPE tokenizer: DEFAULT_VOCAB_SIZE ids, same on every machine."""
    byte_chars = _bytes_to_unicode()
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = Counter(word for word, _ in pre.pre_tokenize_str(_CORPUS))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    merges = _learn_merges(words, vocab, DEFAULT_VOCAB_SIZE - len(DEFAULT_SPECIAL_TOKENS))
    if len(vocab) != DEFAULT_VOCAB_SIZE - len(DEFAULT_SPECIAL_TOKENS):
        raise AssertionError(f"the built-in corpus yields only {len(vocab)} tokens")
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([_added(t) for t in DEFAULT_SPECIAL_TOKENS])
    return tok


def write_default_tokenizer(directory: str | Path) -> Path:
    """Write the default tokenizer as an HF tokenizer directory (loads with `Tokenizer.from_dir` and
    transformers' `AutoTokenizer`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_default_tokenizer().save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, t in zip(range(ENDOFTEXT_ID, DEFAULT_VOCAB_SIZE), DEFAULT_SPECIAL_TOKENS, strict=True)
        },
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "chat_template": DEFAULT_CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return directory


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: byte b → a printable character (printable Latin-1 bytes map to
    themselves, the rest to 256, 257, ... in byte order). Index = byte value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _learn_merges(words: Counter[str], vocab: dict[str, int], size: int) -> list[tuple[str, str]]:
    """Greedy BPE: repeatedly merge the most frequent adjacent pair (ties: the smaller pair of strings)
    until `vocab` holds `size` tokens or no pair is left. Grows `vocab` in place; returns the merges."""
    seqs = [list(w) for w in sorted(words)]
    counts = [words[w] for w in sorted(words)]
    pair_count: Counter[tuple[str, str]] = Counter()
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:], strict=False):
            pair_count[pair] += counts[i]
            where[pair].add(i)
    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(vocab) < size:
        neg, a, b = heapq.heappop(heap)
        if pair_count.get((a, b), 0) != -neg or neg == 0:
            continue  # stale heap entry
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop((a, b))):
            old = seqs[i]
            new, j = [], 0
            while j < len(old):
                if j + 1 < len(old) and old[j] == a and old[j + 1] == b:
                    new.append(a + b)
                    j += 2
                else:
                    new.append(old[j])
                    j += 1
            for pair in zip(old, old[1:], strict=False):
                pair_count[pair] -= counts[i]
                changed.add(pair)
            for pair in zip(new, new[1:], strict=False):
                pair_count[pair] += counts[i]
                where[pair].add(i)
                changed.add(pair)
            seqs[i] = new
        for pair in changed:
            if pair_count[pair] > 0:
                heapq.heappush(heap, (-pair_count[pair], *pair))
    return merges


# Learning text for the default tokenizer's merges: a little of what coding agents read and write.
# Changing it changes the default tokenizer (and the default model's directory hash).
_CORPUS = r'''\
You are a coding agent working in a repository. Read the files you need, make the smallest change that
fixes the problem, run the tests, and report what you changed and why. When a command fails, read the
error message before you try again. Do not guess the contents of a file: open it.

The user wants the cache to keep the state of every agent that is likely to come back. An agent sends
its whole conversation again on each turn, and each turn adds a few thousand tokens: the new user
message, the tool results, and the reply of the model. If the server still holds the state of the
previous turn, the prefill only has to process the new tokens; otherwise it has to recompute the
entire prompt, which takes seconds for a long context.

## Plan

1. Find where the request is scheduled and where the prefix cache is matched.
2. Write a failing test that shows the problem with a small model on the CPU.
3. Change the code, run the test again, then run the whole test suite.
4. Measure the hit rate and the time to first token before and after the change.

```python
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = 256
    temperature: float = 0.0
    stop: list[str] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def load_config(path: str | Path) -> dict:
    """Read a JSON config file and return it as a dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    def allocate(self, num_tokens: int) -> list[int]:
        needed = (num_tokens + self.block_size - 1) // self.block_size
        if needed > len(self.free_blocks):
            raise RuntimeError(f"out of blocks: need {needed}, have {len(self.free_blocks)}")
        blocks = [self.free_blocks.pop() for _ in range(needed)]
        for block in blocks:
            self.ref_counts[block] += 1
        return blocks

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, "reference count went negative"
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)


def test_allocate_and_free():
    pool = BlockPool(num_blocks=8, block_size=16)
    blocks = pool.allocate(40)
    assert len(blocks) == 3
    pool.free(blocks)
    assert sorted(pool.free_blocks) == list(range(8))


if __name__ == "__main__":
    for name, value in sorted(os.environ.items()):
        print(f"{name}={value}")
```

```bash
$ git status --short
 M flashstate/cache/tree.py
?? tests/cache/test_tree.py
$ python -m pytest -q tests/cache
........................                                                 [100%]
24 passed in 1.82s
$ grep -rn "def match" flashstate/
flashstate/cache/tree.py:88:    def match(self, token_ids: list[int]) -> MatchResult:
$ ls -la build/
total 16
drwxr-xr-x  2 user user 4096 Nov  3 10:12 .
-rw-r--r--  1 user user 1261 Nov  3 10:12 report.json
```

Traceback (most recent call last):
  File "/home/user/project/server/main.py", line 42, in <module>
    app = create_app(config)
  File "/home/user/project/server/app.py", line 17, in create_app
    raise ValueError("missing required setting: model")
ValueError: missing required setting: model

{"name": "read_file", "arguments": {"path": "src/server/app.py", "start_line": 1, "end_line": 120}}
{"name": "run_command", "arguments": {"command": "npm test -- --watch=false", "timeout": 600}}
{"name": "edit_file", "arguments": {"path": "README.md", "old_text": "TODO", "new_text": "Done."}}
{"type": "function", "function": {"name": "search", "description": "Search the code for a pattern.",
 "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}

```typescript
export interface Message {
  role: "system" | "user" | "assistant" | "tool";
  content: string | null;
  toolCalls?: ToolCall[];
}

export async function fetchJson<T>(url: string, init?: RequestInit): Promise<T> {
  const response = await fetch(url, init);
  if (!response.ok) {
    throw new Error(`request to ${url} failed with status ${response.status}`);
  }
  return (await response.json()) as T;
}
```

```rust
pub fn longest_common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count()
}
```

```sql
SELECT user_id, COUNT(*) AS requests, AVG(latency_ms) AS mean_latency
FROM requests WHERE created_at >= NOW() - INTERVAL '1 day'
GROUP BY user_id ORDER BY requests DESC LIMIT 10;
```

```go
package store

import (
	"context"
	"errors"
	"sync"
	"time"
)

var ErrNotFound = errors.New("store: key not found")

type Entry struct {
	Value     []byte
	ExpiresAt time.Time
}

type Store struct {
	mu      sync.RWMutex
	entries map[string]Entry
}

func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	entry, ok := s.entries[key]
	if !ok || time.Now().After(entry.ExpiresAt) {
		return nil, ErrNotFound
	}
	return entry.Value, nil
}
```

```c
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int compare_ints(const void *lhs, const void *rhs) {
    int a = *(const int *)lhs, b = *(const int *)rhs;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    int *values = malloc(n * sizeof(int));
    if (values == NULL) {
        fprintf(stderr, "malloc failed\n");
        return EXIT_FAILURE;
    }
    for (size_t i = 0; i < n; ++i) values[i] = rand() % 1000;
    qsort(values, n, sizeof(int), compare_ints);
    free(values);
    return EXIT_SUCCESS;
}
```

```yaml
name: tests
on:
  push:
    branches: [main]
  pull_request:
jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python-version: ["3.11", "3.12"]
    steps:
      - uses: actions/checkout@v4
      - name: Install dependencies
        run: pip install -e ".[test]"
      - name: Run the test suite
        run: pytest -x --durations=10
```

```diff
--- a/src/scheduler.py
+++ b/src/scheduler.py
@@ -120,7 +120,9 @@ class Scheduler:
-        if len(self.waiting) == 0:
-            return None
+        while self.waiting and budget > 0:
+            seq = self.waiting.popleft()
+            budget -= seq.num_uncached_tokens
+            self.running.append(seq)
```

```html
<!doctype html>
<html lang="en">
  <head><meta charset="utf-8"><title>Dashboard</title></head>
  <body>
    <div class="container"><h1>Throughput</h1><canvas id="chart" width="800" height="400"></canvas></div>
    <script src="/static/app.js"></script>
  </body>
</html>
```

2025-03-14T09:26:53.589Z INFO  server listening on http://127.0.0.1:8000 (workers=4, pid=31337)
2025-03-14T09:27:01.002Z WARN  request 7f3a2c timed out after 30000 ms; retrying (attempt 2 of 5)
2025-03-14T09:27:04.118Z ERROR database connection refused: host=db.internal port=5432 user=admin
GET /v1/models 200 3ms | POST /v1/chat/completions 200 1842ms | POST /v1/completions 429 1ms

Memory is the scarce resource. Every checkpoint of a recurrent layer costs the same number of bytes no
matter how long the prefix is, while the key-value blocks of attention layers grow with the length.
A good eviction policy therefore weighs how many seconds of computation an entry saves against how
many bytes it occupies, and it protects entries that an agent will probably reuse very soon. Values
are estimated from a cost model measured on the actual hardware: a linear term for projections and
feed-forward layers, plus a quadratic term for attention over the prefix.

Questions people often ask: Why does the first request take longer? Because nothing is cached yet and
the kernels are compiled on first use. Why is the throughput lower with many concurrent users? Because
the batch is limited by memory, so requests wait in the queue. How can I reproduce the benchmark?
Install the package, download nothing, and run the script with the default arguments; results vary
slightly between machines, but the ratios between policies should be stable.

Refactoring checklist: rename unclear variables, extract long functions into helpers with docstrings,
remove dead code and unused imports, replace magic numbers with named constants, add type hints to
public functions, keep behaviour identical, and verify with unit tests plus integration tests.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! How vexingly
quick daft zebras jump; sphinx of black quartz, judge my vow. Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 64
100 128 256 512 1024 2048 4096 8192 65536 3.14159 2.71828 1e-5 0x7fffffff 1,000,000 50% $19.99.

Glossary: tokenizer, embedding, attention, convolution, recurrence, gradient, optimizer, scheduler,
throughput, latency, percentile, histogram, quantization, distributed, asynchronous, serialization,
authentication, authorization, middleware, dependency, migration, transaction, repository, branch,
commit, rebase, conflict, release, deployment, container, kubernetes, terraform, observability.

The test passed. I changed two things: the scheduler now asks the cache for the longest prefix whose
state exists, and the cache keeps a checkpoint at the end of every finished request. With 48 agents
the token hit rate went from 31% to 88%, and the median time to first token dropped from 2.4 seconds
to 0.3 seconds. The remaining misses are the first turn of each agent and a few evictions when memory
was full. I have not changed the public interface, and all 312 tests still pass.

Next steps: make the number of blocks configurable from the command line, add a metric for the
number of evicted checkpoints, and document the new option in the README. Should I also update the
benchmark script so that it reports the hit rate per agent, or is the total enough for now?

Thanks! That looks good. Please also check the error handling when the file does not exist, add a
comment that explains why the lock is needed, and open a pull request with a short description.
'''
