"""`nemotron_json`: the calls of NVIDIA Nemotron Nano 2 (`nemotron_h` models such as
NVIDIA-Nemotron-Nano-9B-v2), whose chat template asks for a JSON list in one tag pair:

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": …}]</TOOLCALL>

The name is the one NVIDIA's model card gives its vLLM plugin for this format
(`nemotron_toolcall_parser_no_streaming.py`, `--tool-call-parser nemotron_json`). Nemotron 3 Nano's
template teaches the Qwen3-Coder XML form instead (`qwen3_coder`, alias `nemotron_v3`).

A block is read whole: its calls go out when `</TOOLCALL>` arrives and the list parses (each element
`{"name": str, "arguments": object or JSON text}`); otherwise the block is content.

Tokens to keep when detokenizing: `<TOOLCALL>`, `</TOOLCALL>`.
"""

from __future__ import annotations

import json

from flashstate.server.tool_parsers.base import ToolParser, Tools
from flashstate.server.tool_parsers.hermes import parse_call

OPEN, CLOSE = "<TOOLCALL>", "</TOOLCALL>"


class NemotronJsonToolParser(ToolParser):
    OPEN_TAGS = (OPEN,)
    name = "nemotron_json"
    special_tokens = (OPEN, CLOSE)

    def __init__(self, tools: Tools | None = None, *, stream_arguments: bool = False) -> None:
        super().__init__(tools, stream_arguments=stream_arguments)
        self._state = self._text_state
        self._scan_from = 0

    def _at_open(self, tag: str) -> None:
        self._scan_from = len(OPEN)
        self._state = self._block_state

    def _block_state(self, final: bool) -> bool:
        end = self._buf.find(CLOSE, self._scan_from)
        if end == -1:
            if not final:
                self._scan_from = max(len(OPEN), len(self._buf) - len(CLOSE) + 1)
                return False
            calls = None
        else:
            try:
                decoded = json.loads(self._buf[len(OPEN) : end])
            except ValueError:
                decoded = None
            items = decoded if isinstance(decoded, list) else [decoded]
            calls = [parse_call(item) for item in items]
            if not calls or any(c is None for c in calls):
                calls = None
        if calls is None:
            self._content(OPEN)
            self._buf = self._buf[len(OPEN) :]
        else:
            for name, arguments in calls:  # type: ignore[misc]
                self._begin_call(name)
                self._args(arguments)
                self._end_call()
            self._buf = self._buf[end + len(CLOSE) :]
        self._state = self._text_state
        return True
