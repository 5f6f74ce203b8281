"""The HTTP layer of `lanpo serve`: OpenAI's error bodies with the right status, the body limit, JSON parsing, SSE.

Every error is OpenAI's JSON body with its status: 400 (not JSON, or a request lanpo cannot answer as asked),
401 (no key or a wrong one), 404 (an unknown pool, model or answer; a pool the key may not read looks unknown),
413 (a body or a question over the limits), 415 (a body sent as something other than JSON), 422 (JSON that breaks
the schema: a negative max_tokens, an unknown mode), 503 (draining for shutdown, too many requests waiting, the
store unreachable), 500 (a bug: its type only). Each refusal is one JSON log line (path, status, code; never the
body).

What `read_json` takes is stricter than Python's `json.loads`, so that no body reaches a 500 or the store with what
Postgres cannot hold: UTF-8 (RFC 8259), nested at most `MAX_DEPTH` deep (counted on the bytes, without recursion,
before parsing: Python's parser and pydantic recurse), no NaN or Infinity and no number beyond a double, no key
twice in one object (parsers disagree on which one wins), no string holding NUL or a lone surrogate (`\ud83d`
without its pair: neither is storable text, nor tokenisable), and a content type that is JSON or none (a browser
sends `text/plain` or a form cross-site without asking first; FastAPI refuses those for the same reason).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
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


MAX_DEPTH = 64  # arrays and objects inside each other; an OpenAI request nests 5 deep
_STEPS = np.zeros(256, dtype=np.int32)  # a byte's step in nesting depth: +1 opens an array or object, -1 closes one
_STEPS[list(b"[{")], _STEPS[list(b"]}")] = 1, -1
_UNSTORABLE = re.compile("[\\x00\\ud800-\\udfff]")  # NUL, and a surrogate json.loads left unpaired


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in the UTF-8 JSON text `raw`, brackets inside strings not counted;
    vectorised (no recursion, no loop in Python), so a hostile megabyte costs milliseconds."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # after which quotes open and close strings in turn
    text = np.frombuffer(unescaped, dtype=np.uint8)
    steps = _STEPS[text]
    # a byte after an odd number of quotes is inside a string (after an unterminated one: to the end)
    steps[np.cumsum(text == ord('"'), dtype=np.int32) % 2 == 1] = 0
    return int(np.cumsum(steps).max(initial=0))


async def read_json(request: Request) -> Any:
    """The request's JSON object, or the ApiError that refuses it (the module docstring lists what is refused)."""
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"the body must be sent as application/json, not {shown(media)}", "unsupported_media_type")
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8", "invalid_json") from None
    if nesting_depth(raw) > MAX_DEPTH:
        raise ApiError(400, f"the request body nests arrays and objects over {MAX_DEPTH} deep", "invalid_json")
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_keys)
    except ValueError:
        raise ApiError(400, "the request body is not JSON", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    if "\\u" in text and any(_UNSTORABLE.search(s) for s in _strings(data)):  # only an escape makes either
        raise ApiError(
            400, "a string in the body holds NUL or a lone surrogate (\\ud800-\\udfff unpaired)", "invalid_text"
        )
    return data


def _no_constant(name: str) -> Any:
    raise ApiError(400, f"the request body is not JSON: {name} is not a JSON number", "invalid_json")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ApiError(400, f"the number {shown(literal)} is beyond a double", "invalid_json")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        twice = next(key for key, times in Counter(k for k, _ in pairs).items() if times > 1)
        raise ApiError(400, f"the key {shown(twice)} is given twice in one object", "invalid_json")
    return out


def _strings(data: Any) -> Iterator[str]:
    """Every string in parsed JSON, keys included (a stack: the depth is bounded, but nothing here recurses)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def shown(value: str, limit: int = 60) -> str:
    """`value` as an error message quotes it: repr (so no control character or surrogate), at most `limit` long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is answered 413 before the app reads it. By its Content-Length;
    a body sent without one (chunked) is read here, counted as it arrives, and replayed to the app: an error
    raised inside the app's `receive` would reach it as a 500."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = ApiError(413, f"the body is over {self.limit} bytes", "body_too_large")
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit():  # the server holds the body to its declared length
            if int(declared) > self.limit:
                await _send_error(scope, send, too_large)
                return
            await self.app(scope, receive, send)
            return
        messages: list[dict] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":  # the client went away: the app sees it as it would have
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await _send_error(scope, send, too_large)
                return
            if not message.get("more_body"):
                break
        pending = iter(messages)

        async def replayed() -> dict:
            message = next(pending, None)
            return message if message is not None else await receive()

        await self.app(scope, replayed, send)


async def _send_error(scope: dict, send: Callable, exc: ApiError) -> None:
    log_refusal(scope.get("path", ""), exc)
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
    """The error's response, and its JSON log line."""
    log_refusal(request.url.path, exc)
    return error_response(exc)


def log_refusal(path: str, exc: ApiError) -> None:
    """A refusal's one JSON log line: the request's path, status and code; never its body."""
    access.info(json.dumps({"event": "refused", "path": path, "status": exc.status, "code": exc.code}))


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.type, exc.code, exc.param), status_code=exc.status)
