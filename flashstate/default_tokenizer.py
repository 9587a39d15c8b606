"""The embedded default tokenizer, built from nothing: byte-level BPE, merges learned in code from
`_CORPUS` (a string constant, so every machine builds the same `tokenizer.json`):

    ids [0, 256)                      one token per byte (GPT-2's byte → printable character map)
    ids [256, DEFAULT_VOCAB_SIZE - 3) merged tokens, in merge order
    ids DEFAULT_VOCAB_SIZE - 3 .. - 1 <|endoftext|>, <|im_start|>, <|im_end|>
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from flashstate.tokenizer import special_token

DEFAULT_VOCAB_SIZE = 2048
DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = range(DEFAULT_VOCAB_SIZE - 3, DEFAULT_VOCAB_SIZE)


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
    tok.add_special_tokens([special_token(t) for t in DEFAULT_SPECIAL_TOKENS])
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
# The text the merges are learned from: a constant file, so every machine builds the same tokenizer.
_CORPUS = (Path(__file__).parent / "assets" / "tokenizer_corpus.txt").read_text(encoding="utf-8")
