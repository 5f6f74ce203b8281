"""The HTTP layer of `lanpo serve`: OpenAI's error bodies with the right status, the body limit, JSON parsing, SSE.

Every error is OpenAI's JSON body with its status: 400 (not JSON, or a request lanpo cannot answer as asked),
401 (no key or a wrong one), 404 (an unknown pool, model or answer; a pool the key may not read looks unknown),
413 (a body or a question over the limits), 422 (JSON that breaks the schema: a negative max_tokens, an unknown
mode), 503 (draining for shutdown, too many requests waiting, the store unreachable), 500 (a bug: its type only).
Each refusal is one JSON log line (path, status, code; never the body).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from lanpo.errors import LanpoError
from lanpo.serve.api import error_body

log = logging.getLogger("lanpo.serve")
access = logging.getLogger("lanpo.serve.access")


class ApiError(Exception):
    """An error answered with `status` and OpenAI's body."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        return "server_error" if self.status >= 500 else "invalid_request_error"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not JSON", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    return data


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is answered 413 before the app reads it (Content-Length, or the
    bytes counted as they arrive)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _send_error(send, ApiError(413, f"the body is over {self.limit} bytes", "body_too_large"))
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise ApiError(413, f"the body is over {self.limit} bytes", "body_too_large")
            return message

        await self.app(scope, counted, send)


async def _send_error(send: Callable, exc: ApiError) -> None:
    body = json.dumps(error_body(exc.message, exc.type, exc.code, exc.param)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install_error_handlers(app: FastAPI) -> None:
    """Every error a route or FastAPI raises, answered as OpenAI's body with its status."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _refused(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _refused(request, _validation(exc.errors()))

    @app.exception_handler(ValidationError)
    async def invalid_body(request: Request, exc: ValidationError) -> JSONResponse:
        return _refused(request, _validation(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return _refused(request, ApiError(exc.status_code, str(exc.detail), code))

    @app.exception_handler(LanpoError)
    async def lanpo_error(request: Request, exc: LanpoError) -> JSONResponse:
        return _refused(request, ApiError(400, exc.message, "invalid_request"))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return _refused(request, ApiError(500, f"internal error ({type(exc).__name__})", "internal_error"))


def _validation(errors: list[Any]) -> ApiError:
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    message = first.get("msg", "invalid request")
    return ApiError(422, f"{where}: {message}" if where else message, "invalid_value", where)


def _refused(request: Request, exc: ApiError) -> JSONResponse:
    """The error's response, and its JSON log line (the request's path, status and code; never its body)."""
    record = {"event": "refused", "path": request.url.path, "status": exc.status, "code": exc.code}
    access.info(json.dumps(record))
    return error_response(exc)


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.type, exc.code, exc.param), status_code=exc.status)
