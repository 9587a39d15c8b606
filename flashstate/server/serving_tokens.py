"""vLLM's tokenizer endpoints, over the served model's tokenizer (and chat template):

    POST /tokenize     {prompt, add_special_tokens?} or {messages, add_generation_prompt?, tools?,
                       chat_template_kwargs?}  ->  {count, max_model_len, tokens, token_strs}
    POST /detokenize   {tokens}  ->  {prompt}

A chat body is rendered exactly as /v1/chat/completions renders it, so `count` is the prompt the model
would see (assistant messages this server generated are their generated ids, prompt_splice.py, as for
a chat request without `cache_salt`; none are under --api-key-cache-isolation).
`token_strs` is each token's text with `return_token_strs`, else null (as vLLM).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from flashstate.server.errors import bad_request
from flashstate.server.protocol import ChatCompletionRequest, ChatMessage, Tool, _Strict
from flashstate.server.serving_chat import OpenAIServingChat, render_chat


class TokenizeRequest(_Strict):
    """One of `prompt` (a completion's) or `messages` (a chat's)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None  # vLLM's default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


class TokenServing:
    def __init__(self, chat: OpenAIServingChat, max_model_len: int, vocab_size: int):
        self.chat = chat  # its tokenizer carries the served chat template
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    async def tokenize(self, req: TokenizeRequest) -> dict[str, Any]:
        self.chat.check_model(req.model)
        tokenizer = self.chat.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give either prompt or messages", param="prompt")
        if req.prompt is not None:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = await asyncio.to_thread(tokenizer.encode, req.prompt, special)
        else:
            if req.add_special_tokens:
                raise bad_request("add_special_tokens with messages is not supported", "add_special_tokens")
            chat = ChatCompletionRequest.model_construct(
                messages=req.messages,
                tools=req.tools,
                tool_choice=None,
                chat_template_kwargs=req.chat_template_kwargs,
                add_generation_prompt=req.add_generation_prompt,
                reasoning_effort=None,
            )
            ids, _ = await asyncio.to_thread(render_chat, tokenizer, chat, self.chat.unsalted_generated())
        strs = self.chat.token_texts(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, req: DetokenizeRequest) -> dict[str, Any]:
        self.chat.check_model(req.model)
        if bad := [t for t in req.tokens if not 0 <= t < self.vocab_size]:
            raise bad_request(f"tokens {bad[:4]} are outside the vocabulary [0, {self.vocab_size})", "tokens")
        text = await asyncio.to_thread(self.chat.tokenizer.decode, req.tokens, False)
        return {"prompt": text}
