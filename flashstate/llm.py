"""Offline API: LLM(model, **engine_args).generate(prompts, SamplingParams) and .chat(conversations)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashstate.config import EngineConfig
from flashstate.engine.llm_engine import LLMEngine
from flashstate.engine.output.request_output import RequestOutput
from flashstate.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(config)
        llm.tokenizer = llm.engine.tokenizer
        return llm

    def close(self) -> None:
        """Finish the host tier's write-backs and stop tensor-parallel workers (also on leaving a
        `with LLM(...)` block)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion; outputs in prompt order. Every request is
        validated before any is queued, so a bad one leaves nothing behind."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = []
        try:
            for prompt, p in zip(prompts, params, strict=True):
                ids.append(self.engine.add_request(prompt, p))
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            try:
                outputs = self.engine.step()
            except Exception as e:  # noqa: BLE001 — one request's failure ends that request (finish "error")
                outputs = self.engine.recover(e)
            for out in outputs:
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or several, rendered with the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.encode(
                self.tokenizer.apply_chat_template(
                    c, tools=tools, add_generation_prompt=add_generation_prompt
                ),
                add_special_tokens=False,
            )
            for c in conversations
        ]
        return self.generate(prompts, sampling_params)
