"""Tool-call parsers, by vLLM's `--tool-call-parser` names: they turn a model's generated text into
OpenAI `tool_calls` and the content around them, whole (`extract`) or streamed (`feed`/`finish`).
`base` has the contract; each format is a module.

    hermes         Qwen2.5, Qwen3, Qwen3-Next: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
    qwen3_coder    Qwen3-Coder, Qwen3.5/3.6, Nemotron 3 Nano: `<tool_call><function=…><parameter=…>…`
    qwen3_xml      the same (vLLM's other parser for that format)
    nemotron_v3    the same, under the name of Nemotron 3's reasoning parser
    kimi_k2        Kimi K2, Kimi-Linear: `<|tool_calls_section_begin|><|tool_call_begin|>functions.…`
    nemotron_json  Nemotron Nano 2: `<TOOLCALL>[{"name": …, "arguments": {…}}]</TOOLCALL>`
"""

from __future__ import annotations

from flashstate.server.tool_parsers.base import (
    ContentDelta,
    Delta,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    Tools,
    collect,
    delta_message,
    new_call_id,
)
from flashstate.server.tool_parsers.hermes import HermesToolParser
from flashstate.server.tool_parsers.kimi_k2 import KimiK2ToolParser
from flashstate.server.tool_parsers.nemotron_json import NemotronJsonToolParser
from flashstate.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
    "nemotron_v3": Qwen3CoderToolParser,
    "kimi_k2": KimiK2ToolParser,
    "nemotron_json": NemotronJsonToolParser,
}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered as `name` (ValueError naming the choices when there is none)."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(TOOL_PARSERS)}") from None


__all__ = [
    "TOOL_PARSERS",
    "ContentDelta",
    "Delta",
    "HermesToolParser",
    "KimiK2ToolParser",
    "NemotronJsonToolParser",
    "Qwen3CoderToolParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "Tools",
    "collect",
    "delta_message",
    "get_tool_parser",
    "new_call_id",
]
