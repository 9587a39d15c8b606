"""The OpenAI-compatible app and `serve(config)`.

    GET  /health               200 while the engine loop runs; 503 once it died or while it is stalled
    GET  /version              {"version": ...}
    GET  /metrics              Prometheus text format (server/metrics.py)
    POST /reset_prefix_cache   evict the prefix cache (vLLM's); the pools after it, integrity-checked; only
                               with --enable-dev-endpoints (or FLASHSTATE_/VLLM_SERVER_DEV_MODE=1), as vLLM
    POST /tokenize             vLLM's, server/serving_tokens.py: a prompt or chat messages -> token ids
    POST /detokenize           token ids -> text
    GET  /v1/models            the one served model
    GET  /v1/models/{id}       its card; 404 for any other id
    POST /v1/completions       server/serving_completion.py
    POST /v1/chat/completions  server/serving_chat.py
    POST /v1/messages          Anthropic Messages, server/anthropic/ (and /v1/messages/count_tokens)
    POST /v1/responses         OpenAI Responses, stateless, server/responses/
With an API key set, /v1/* need `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's header;
401 otherwise); the rest stay open, as in vLLM. Request bodies are read here: over `max_request_body_bytes`
→ 413; not JSON, not UTF-8, wrong types → 400, all as OpenAI-style error JSON (Anthropic's shape under
/v1/messages: server/errors.py).
CORS headers as vLLM sends them (--allowed-origins, --allowed-methods, ...: any by default).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import socket
import sys
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from flashstate import __version__, envs
from flashstate.config import EngineConfig
from flashstate.engine.async_engine import AsyncEngine
from flashstate.engine.llm_engine import LLMEngine
from flashstate.gc_pauses import GEN0_THRESHOLD, for_serving
from flashstate.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from flashstate.server.anthropic.serving import AnthropicServingMessages
from flashstate.server.errors import APIError, from_validation_error, install_handlers
from flashstate.server.metrics import ServerMetrics
from flashstate.server.protocol import ChatCompletionRequest, CompletionRequest, now
from flashstate.server.responses.protocol import ResponsesRequest
from flashstate.server.responses.serving import OpenAIServingResponses
from flashstate.server.serving_chat import OpenAIServingChat
from flashstate.server.serving_completion import OpenAIServingCompletion
from flashstate.server.serving_engine import ClientGone
from flashstate.server.serving_tokens import DetokenizeRequest, TokenizeRequest, TokenServing
from flashstate.tokenizer import load_chat_template

logger = logging.getLogger("flashstate.server")
M = TypeVar("M", bound=BaseModel)
DEFAULT_MODEL_NAME = "flashstate-tiny"


def served_model_name(config: EngineConfig) -> str:
    return config.served_model_name or config.model or DEFAULT_MODEL_NAME


async def read_body(raw: Request, model: type[M], limit: int) -> M:
    length = raw.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for part in raw.stream():
        body += part
        if len(body) > limit:
            raise _too_large(limit)
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as e:
        raise from_validation_error(e) from e


def body_schema(model: type[BaseModel], path: str) -> dict:
    """OpenAPI `requestBody` for a POST route that reads its body by hand (`read_body`): the model's JSON
    schema, its `$defs` kept inside it and referenced by JSON pointers from the document's root."""
    route = path.replace("~", "~0").replace("/", "~1")
    here = f"#/paths/{route}/post/requestBody/content/application~1json/schema"
    schema = model.model_json_schema(ref_template=here + "/$defs/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _too_large(limit: int) -> APIError:
    return APIError(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        f"request body over the {limit}-byte limit",
        code="body_too_large",
    )


def build_app(engine: AsyncEngine, config: EngineConfig) -> FastAPI:
    name = served_model_name(config)
    metrics = ServerMetrics(engine, name)
    completions = OpenAIServingCompletion(engine, config, name, metrics)
    chat = OpenAIServingChat(engine, config, name, metrics)
    messages = AnthropicServingMessages(chat)
    responses = OpenAIServingResponses(chat)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()  # at application shutdown, before uvicorn re-raises a caught SIGTERM

    app = FastAPI(title="flashstate", version=__version__, lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics
    install_handlers(app)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(config.allowed_origins),
        allow_credentials=config.allow_credentials,
        allow_methods=list(config.allowed_methods),
        allow_headers=list(config.allowed_headers),
    )
    tokens = TokenServing(chat, engine.engine.max_model_len, engine.engine.spec.vocab_size)

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, __: ClientGone) -> Response:
        return Response(status_code=499)  # nobody is listening

    keys = [k.encode() for k in config.api_key or ()]
    tenants = [hashlib.sha256(k).hexdigest()[:16] for k in keys]

    def authorize(raw: Request) -> None:
        """Check the bearer key (or Anthropic's `x-api-key` header, when there is no bearer key); its
        tenant (a digest of the key) goes to `raw.state.tenant`."""
        if not keys:
            return
        scheme, _, token = raw.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            scheme, token = "bearer", raw.headers.get("x-api-key", "")
        # Header values arrive as latin-1 text: compared as bytes, any byte in them is only a wrong key.
        given = token.strip().encode("latin-1", "replace")
        matches = [hmac.compare_digest(given, key) for key in keys]  # every key compared: no early exit
        if not given or not any(matches):
            raise APIError(
                HTTPStatus.UNAUTHORIZED,
                "Missing or incorrect API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                code="invalid_api_key",
            )
        raw.state.tenant = tenants[matches.index(True)]

    @app.get("/health")
    async def health() -> Response:
        if not (completions.healthy and chat.healthy) or engine.dead:
            raise APIError(HTTPStatus.SERVICE_UNAVAILABLE, "the engine loop has died", code="engine_dead")
        if engine.stalled(config.engine_stall_seconds):
            raise APIError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"the engine loop has finished no step for over {config.engine_stall_seconds:g} s",
                code="engine_stalled",
            )
        return Response(status_code=200)

    async def reset_prefix_cache(raw: Request) -> dict:
        """vLLM's: evict every cached prefix no running request holds. Needs the API key when one is set
        (it costs every tenant its hits). Reports the pools after it, checked for integrity."""
        authorize(raw)

        def reset(llm: LLMEngine) -> dict:
            evicted = llm.reset_prefix_cache()
            llm.check_integrity()
            cache = llm.cache
            return {
                "evicted_checkpoints": evicted,
                "free_blocks": cache.block_pool.num_free,
                "num_blocks": cache.block_pool.num_blocks,
                "free_state_slots": cache.state_pool.num_free,
                "num_state_slots": cache.state_pool.num_slots,
                "running": len(llm.scheduler.running) + len(llm.scheduler.restoring),
                "waiting": len(llm.scheduler.waiting),
            }

        return await engine.call(reset)

    if config.enable_dev_endpoints or envs.FLASHSTATE_SERVER_DEV_MODE or envs.VLLM_SERVER_DEV_MODE:
        app.post("/reset_prefix_cache")(reset_prefix_cache)

    @app.post("/tokenize", openapi_extra=body_schema(TokenizeRequest, "/tokenize"))
    async def tokenize(raw: Request) -> dict:
        return await tokens.tokenize(await read_body(raw, TokenizeRequest, config.max_request_body_bytes))

    @app.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest, "/detokenize"))
    async def detokenize(raw: Request) -> dict:
        return await tokens.detokenize(await read_body(raw, DetokenizeRequest, config.max_request_body_bytes))

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def card() -> dict:
        return {
            "id": name,
            "object": "model",
            "created": now(),
            "owned_by": "flashstate",
            "root": config.model or DEFAULT_MODEL_NAME,
            "parent": None,
            "max_model_len": engine.engine.max_model_len,
        }

    @app.get("/v1/models")
    async def models(raw: Request) -> dict:
        authorize(raw)
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, raw: Request) -> dict:
        authorize(raw)
        if model_id != name:
            raise APIError(
                HTTPStatus.NOT_FOUND,
                f"The model `{model_id}` does not exist (this server serves `{name}`).",
                code="model_not_found",
                param="model",
            )
        return card()

    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest, "/v1/completions"))
    async def create_completion(raw: Request) -> Response:
        authorize(raw)
        return await completions.create(
            await read_body(raw, CompletionRequest, config.max_request_body_bytes), raw
        )

    @app.post(
        "/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest, "/v1/chat/completions")
    )
    async def create_chat_completion(raw: Request) -> Response:
        authorize(raw)
        return await chat.create(
            await read_body(raw, ChatCompletionRequest, config.max_request_body_bytes), raw
        )

    @app.post("/v1/messages", openapi_extra=body_schema(MessagesRequest, "/v1/messages"))
    async def create_message(raw: Request) -> Response:
        authorize(raw)
        return await messages.create(
            await read_body(raw, MessagesRequest, config.max_request_body_bytes), raw
        )

    @app.post(
        "/v1/messages/count_tokens",
        openapi_extra=body_schema(CountTokensRequest, "/v1/messages/count_tokens"),
    )
    async def count_message_tokens(raw: Request) -> dict:
        authorize(raw)
        return await messages.count_tokens(
            await read_body(raw, CountTokensRequest, config.max_request_body_bytes)
        )

    @app.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest, "/v1/responses"))
    async def create_response(raw: Request) -> Response:
        authorize(raw)
        return await responses.create(
            await read_body(raw, ResponsesRequest, config.max_request_body_bytes), raw
        )

    return app


def listen_socket(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now: OSError ("address already in use") before anything slow
    starts. Port 0 takes a free port (the log line names it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(config: EngineConfig) -> int:
    """Load the model, start the engine loop, serve until SIGINT/SIGTERM (0) or until the engine loop
    cannot go on (1: the supervisor restarts the server)."""
    sys.setswitchinterval(config.gil_switch_interval_ms / 1e3)
    logger.info("GIL switch interval %g ms", config.gil_switch_interval_ms)
    servers: list[uvicorn.Server] = []

    def on_dead(error: BaseException) -> None:
        logger.error("the engine loop cannot go on (%s): shutting the server down", error)
        for server in servers:
            server.should_exit = True  # uvicorn's main loop reads it every tick

    sock = listen_socket(config.host, config.port)  # a busy port fails here, before the model loads
    if config.chat_template is not None:
        load_chat_template(config.chat_template)  # a bad --chat-template fails before the model loads
    engine = AsyncEngine(config, on_dead=on_dead)
    frozen = for_serving()
    logger.info(
        "garbage collector: %d start-up objects frozen, generation 0 threshold %d", frozen, GEN0_THRESHOLD
    )
    app = build_app(engine, config)
    logger.info("serving %s on http://%s:%d", served_model_name(config), config.host, sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.uvicorn_log_level,
            timeout_graceful_shutdown=5,
        )
    )
    servers.append(server)
    if engine.dead:  # died before the server existed to hear of it
        server.should_exit = True
    try:
        server.run(sockets=[sock])
    finally:
        engine.shutdown()
    return 1 if engine.dead else 0
