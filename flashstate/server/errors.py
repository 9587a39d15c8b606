"""OpenAI-style errors: every failure the server answers is

    HTTP <status>  {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

with the `type` OpenAI uses for the status (invalid_request_error for 4xx, server_error for 5xx). Under
ANTHROPIC_PATHS (the Anthropic Messages API) the same failures take Anthropic's shape,
`{"type": "error", "error": {"type": <Anthropic's type for the status>, "message": str}}`."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,  # noqa: A002 — the OpenAI field's name
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        fallback = "api_error" if self.status >= 500 else "invalid_request_error"
        kind = _ANTHROPIC_TYPES.get(self.status, fallback)
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, anthropic: bool = False) -> JSONResponse:
        headers = dict(self.headers or {})
        if self.status == HTTPStatus.UNAUTHORIZED:
            headers["WWW-Authenticate"] = "Bearer"
        body = self.anthropic_body() if anthropic else self.body()
        return JSONResponse(body, status_code=self.status, headers=headers)


ANTHROPIC_PATHS = ("/v1/messages",)  # and below it: /v1/messages/count_tokens
_ANTHROPIC_TYPES = {
    HTTPStatus.BAD_REQUEST: "invalid_request_error",
    HTTPStatus.UNAUTHORIZED: "authentication_error",
    HTTPStatus.FORBIDDEN: "permission_error",
    HTTPStatus.NOT_FOUND: "not_found_error",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "request_too_large",
    HTTPStatus.TOO_MANY_REQUESTS: "rate_limit_error",
    HTTPStatus.SERVICE_UNAVAILABLE: "overloaded_error",
}


def is_anthropic(request: Request) -> bool:
    path = request.url.path
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(HTTPStatus.BAD_REQUEST, message, code=code, param=param)


def from_validation_error(e: ValidationError) -> APIError:
    """The first offending field: its path (`messages[0].content`) as `param`, pydantic's words as the
    message. A union's alternatives all fail at once; they share the field's path, which is what we name."""
    errors = e.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first['msg']}", code="invalid_json")
    if not first["loc"]:
        return bad_request(f"the body must be a JSON object: {first['msg']}", code="invalid_type")
    same_field = [err["loc"] for err in errors if err["loc"][:1] == first["loc"][:1]]
    prefix = list(first["loc"])
    for loc in same_field[1:]:
        n = 0
        while n < min(len(prefix), len(loc)) and prefix[n] == loc[n]:
            n += 1
        prefix = prefix[:n]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in prefix).lstrip(".")
    messages = list(dict.fromkeys(err["msg"] for err in errors if err["loc"][:1] == first["loc"][:1]))
    code = "missing_required_parameter" if first["type"] == "missing" else "invalid_type"
    return bad_request(f"{param}: {'; or '.join(messages[:3])}", param=param, code=code)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return e.response(is_anthropic(request))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        code = HTTPStatus(e.status_code).phrase.lower().replace(" ", "_")
        return APIError(e.status_code, str(e.detail), code=code).response(is_anthropic(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        return APIError(
            HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {e}", code="internal_error"
        ).response(is_anthropic(request))
