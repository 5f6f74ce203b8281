"""`lanpo serve`'s HTTP app: OpenAI-compatible routes over lanpo's answering, on FastAPI + uvicorn.

Routes (each also under `/pools/{pool}`, which picks the pool retrieval reads; without it, the default pool):

- `GET /v1/models`, `POST /v1/chat/completions` (SSE when `stream`), `POST /v1/feedback`;
- `GET /health` (no key needed: liveness, the model, whether the server drains).

A request's messages (a system prompt, a conversation, text parts) and the OpenAI fields lanpo refuses are read by
`lanpo.serve.messages`. Errors are OpenAI's JSON bodies with their status (`lanpo.serve.http`). A request refused
writes nothing: the pool's serving run is opened by its first stored answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lanpo.errors import InputError
from lanpo.inference.config import RetrievalSettings, normalise_mode
from lanpo.rollout import SamplingParams
from lanpo.serve.answer import Answering, Ask, Timings
from lanpo.serve.api import ChatRequest, FeedbackRequest, error_body
from lanpo.serve.feedback import store_feedback
from lanpo.serve.http import ApiError, BodyLimit, error_response, install_error_handlers, read_json, shown, sse
from lanpo.serve.keys import Caller, KeyRing
from lanpo.serve.learn import Learned, Learner
from lanpo.serve.messages import conversation, refuse_unsupported
from lanpo.serve.refit import Refitter
from lanpo.serve.scopes import request_scope
from lanpo.serve.settings import ServeSettings
from lanpo.serve.store import Recorder, Runs, Served

log = logging.getLogger("lanpo.serve")
access = logging.getLogger("lanpo.serve.access")


class Server:
    """The app's state: settings, engine, the store's role connection, runs, the writer and the keys."""

    def __init__(
        self,
        settings: ServeSettings,
        keys: KeyRing,
        owner_db: Any,
        role_db: Any,
        start_engine: Callable[[], Awaitable[Any]],
        default_pool: str | None,
    ) -> None:
        self.settings, self.keys, self.owner_db, self.db = settings, keys, owner_db, role_db
        self._start_engine = start_engine
        self.default_pool = default_pool
        self.engine: Any = None
        self.answering: Answering | None = None
        self.learner: Learner | None = None
        self.recorder: Recorder | None = None
        self.refitter: Refitter | None = None
        self.runs: Runs | None = None
        self.executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="lanpo-serve-store")
        self.pending = 0
        self.draining = False
        self.started_at = time.time()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.engine = await self._start_engine()
        judge = self.engine.judge(loop)  # a request may ask for the policy's judgement whatever the default
        if self.settings.retrieval.judge not in ("policy", "none"):
            from lanpo.retrieval.judge import load_judge

            judge = await asyncio.to_thread(load_judge, self.settings.retrieval.judge)
        self.answering = Answering(self.engine, self.db, self.owner_db, self.executor, judge)
        if self.settings.learn.enabled:
            self.learner = Learner(self.engine, self.owner_db, self.settings.learn, self.settings.served_name)
        self.recorder = Recorder(self.db)
        self.refitter = Refitter(self.db, self.executor)
        s = self.settings
        self.runs = Runs(self.db, s.run_name, s.model, s.config(), self.engine.adapter_sha256, self.default_pool)
        log.info(
            "serving %s (%s backend) as %r", self.settings.model, self.settings.backend, self.settings.served_name
        )

    async def stop(self) -> None:
        """Drain: refuse new requests, wait for those in flight, store what is queued, finish the runs."""
        self.draining = True
        for _ in range(600):
            if self.pending == 0:
                break
            await asyncio.sleep(0.05)
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.close)
        if self.runs is not None:
            await asyncio.to_thread(self.runs.close)
        if self.engine is not None:
            await self.engine.aclose()
        self.executor.shutdown(wait=True)
        log.info("stopped: %d answer(s) stored", 0 if self.recorder is None else self.recorder.stored)

    # ------------------------------------------------------------------ requests

    def caller(self, request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        caller = self.keys.caller(token)
        if caller is None:
            raise ApiError(401, "no API key, or a wrong one", "invalid_api_key")
        return caller

    def pool(self, caller: Caller, name: str | None) -> tuple[int | None, str | None]:
        """(pool id, name) a request reads: the path's pool, else the default; 404 for one it may not read."""
        from lanpo.db.connection import transaction
        from lanpo.db.repo.pools import resolve_pool

        chosen = name if name is not None else self.default_pool
        if chosen is None:
            return None, None
        unknown = ApiError(404, f"no pool {shown(chosen)} (or this key may not read it)", "pool_not_found")
        if not caller.may_read(chosen):
            raise unknown
        try:
            with transaction(self.db) as session:
                return int(resolve_pool(session, chosen).id), chosen
        except InputError:
            raise unknown from None

    def ask(self, body: ChatRequest, pool: tuple[int | None, str | None], scope: str | None = None) -> Ask:
        s = self.settings
        if body.model != s.served_name:
            raise ApiError(
                404,
                f"the model {shown(body.model)} is not served here; this server serves {s.served_name!r}",
                "model_not_found",
                "model",
            )
        refuse_unsupported(body)
        asked = conversation(body)
        tokens = sum(len(self.engine.tokenizer.encode(t, add_special_tokens=False)) for t in asked.texts())
        if tokens > s.max_question_tokens:
            raise ApiError(
                413,
                f"the messages are {tokens} tokens; this server takes at most {s.max_question_tokens}",
                "context_length_exceeded",
                "messages",
            )
        limit = body.limit if body.limit is not None else s.sampling.max_new_tokens
        if limit > s.max_tokens_limit:
            raise ApiError(
                400,
                f"max_tokens is {limit}; this server generates at most {s.max_tokens_limit}",
                "max_tokens_too_large",
                "max_tokens",
            )
        if body.min_tokens > limit:
            raise ApiError(
                400, f"min_tokens is {body.min_tokens}, above max_tokens ({limit})", "invalid_min_tokens", "min_tokens"
            )
        if body.min_tokens and body.stops:
            raise ApiError(
                400, "min_tokens and stop strings together are not supported; send one of them", "unsupported", "stop"
            )
        opts = body.lanpo
        mode = normalise_mode(opts.mode) if opts is not None and opts.mode else s.mode
        if body.stream and body.n != 1:
            raise ApiError(400, "a streamed request answers once: n must be 1", "unsupported", "n")
        r = s.retrieval
        if opts is not None:
            changes = {k: v for k, v in opts.model_dump(exclude={"mode", "scope"}).items() if v is not None}
            top_k = max(changes.get("top_k", r.top_k), changes.get("m", r.m))  # m from top_k, as the CLI raises it
            r = RetrievalSettings(**{**asdict(r), **changes, "top_k": top_k, "pool": pool[1]})
        temperature = s.sampling.temperature if body.temperature is None else body.temperature
        params = SamplingParams(
            max_new_tokens=limit,
            temperature=temperature,
            top_p=s.sampling.top_p if body.top_p is None else body.top_p,
            seed=body.seed,
            stop=body.stops,
            min_new_tokens=body.min_tokens,
        )
        return Ask(asked, mode, body.n, params, r, pool[0], pool[1], scope)

    async def chat(self, request: Request, pool_name: str | None) -> Any:
        caller = self.caller(request)
        body = ChatRequest.model_validate(await read_json(request))
        named = None if body.lanpo is None else body.lanpo.scope
        scope = request_scope(caller, request.path_params.get("scope"), named)
        pool = await asyncio.get_running_loop().run_in_executor(self.executor, self.pool, caller, pool_name)
        ask = self.ask(body, pool, scope)
        assert self.answering is not None
        timings = Timings()
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            prepared = await self.answering.prepare(ask, timings)
        except InputError as exc:
            raise ApiError(400, exc.message, "invalid_question", "messages") from None
        lanpo = {
            "mode": ask.mode,
            "pool": pool[1],
            "scope": scope,
            "fallback": prepared.fallback if ask.mode == "retrieval" else None,
            "lessons": [
                {
                    "version_id": e.experience_version_id,
                    "source_problem_id": e.source_problem_id,
                    "relevance": e.relevance,
                }
                for e in prepared.experiences
            ],
        }
        served = Served(request_id, ask.mode, lanpo["fallback"], _sampling(ask), {}, caller.name, body.stream, scope)
        if body.stream:
            return StreamingResponse(
                self._stream(ask, prepared, timings, served, lanpo, body),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-lanpo-request-id": request_id},
            )
        try:
            solution = await self.answering.answer(ask, prepared, timings)
        except InputError as exc:  # the engine refused the prompt (with its lessons): longer than its context
            raise ApiError(413, exc.message, "context_length_exceeded", "messages") from None
        served.timings = timings.of()
        lanpo.update(await self._record(ask, solution, served))
        ids = lanpo["answer_ids"]
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": s.final.response},
                "finish_reason": s.final.finish_reason,
                "logprobs": None,
            }
            for i, s in enumerate(solution.samples)
        ]
        self._log(request_id, caller, ask, served, 200, solution)
        return JSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.settings.served_name,
                "choices": choices,
                "usage": _usage(solution),
                "lanpo": lanpo,
            },
            headers={"x-lanpo-answer-ids": ",".join(map(str, ids))},
        )

    async def _stream(
        self, ask: Ask, prepared: Any, timings: Timings, served: Served, lanpo: dict, body: ChatRequest
    ) -> AsyncIterator[str]:
        assert self.answering is not None
        self.pending += 1  # the gate let the request through when its response began; its body runs until here
        try:
            async for event in self._events(ask, prepared, timings, served, lanpo, body):
                yield event
        finally:
            self.pending -= 1

    async def _events(
        self, ask: Ask, prepared: Any, timings: Timings, served: Served, lanpo: dict, body: ChatRequest
    ) -> AsyncIterator[str]:
        assert self.answering is not None
        head = {
            "id": served.request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.settings.served_name,
        }
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}
        yield sse({**head, "choices": [first], "lanpo": lanpo})
        try:
            solution = None
            async for delta, done in self.answering.stream(ask, prepared, timings):
                if done is not None:
                    solution = done
                elif delta:
                    yield sse(
                        {
                            **head,
                            "choices": [
                                {"index": 0, "delta": {"content": delta}, "finish_reason": None, "logprobs": None}
                            ],
                        }
                    )
            assert solution is not None
            served.timings = timings.of()
            stored = await self._record(ask, solution, served)
        except (ApiError, InputError) as exc:
            error = exc if isinstance(exc, ApiError) else ApiError(413, exc.message, "context_length_exceeded")
            self._log(served.request_id, None, ask, served, error.status, None)
            yield sse(error_body(error.message, error.type, error.code))
            return
        final = {"index": 0, "delta": {}, "finish_reason": solution.samples[0].final.finish_reason, "logprobs": None}
        chunk: dict[str, Any] = {**head, "choices": [final], "lanpo": {**lanpo, **stored}}
        if body.stream_options and body.stream_options.get("include_usage"):
            chunk["usage"] = _usage(solution)
        self._log(served.request_id, None, ask, served, 200, solution)
        yield sse(chunk)
        yield "data: [DONE]\n\n"

    async def _record(self, ask: Ask, solution: Any, served: Served) -> dict[str, Any]:
        """Store the answer (opening the pool's serving run on its first answer); its run and answer ids."""
        assert self.recorder is not None and self.runs is not None
        try:
            run = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.runs.of, ask.pool_id, ask.pool_name
            )
            ids = await self.recorder.record(run, solution, served)
            return {"run_id": run.run_id, "answer_ids": ids}
        except Exception as exc:
            raise ApiError(
                503, f"the answer could not be stored ({type(exc).__name__}), so it is not sent", "store_unavailable"
            ) from None

    async def feedback(self, request: Request, pool_name: str | None) -> Any:
        """The feedback on a served answer; under `/pools/{pool}` (`/scopes/{scope}`), only on an answer from that
        pool (scope): 404 otherwise, and for a pool the key may not read, as chat and models answer. Good feedback
        in a pool that learns writes a lesson first (`lanpo.serve.learn`), reported as `lesson`."""
        caller = self.caller(request)
        body = FeedbackRequest.model_validate(await read_json(request))
        loop = asyncio.get_running_loop()
        if pool_name is not None:
            await loop.run_in_executor(self.executor, self.pool, caller, pool_name)
        scope = request.path_params.get("scope")
        row_id, correct, row = await loop.run_in_executor(
            self.executor, store_feedback, self.db, caller, body, pool_name, scope
        )
        if correct is not None and row.pool_id is not None:  # committed: the pool's fit counts it before we answer
            assert self.refitter is not None
            await self.refitter.counted(row_id, row.pool_id)
        learned = Learned("off")
        if self.learner is not None:
            learned = await loop.run_in_executor(
                self.executor, self.learner.learn, row, row_id, correct, body.reward, body.gold_answer, loop
            )
        return JSONResponse(
            {
                "object": "lanpo.feedback",
                "id": row_id,
                "answer_id": body.answer_id,
                "correct": correct,
                "reward": body.reward,
                "lesson": learned.body(),
            }
        )

    async def models(self, request: Request, pool_name: str | None) -> Any:
        caller = self.caller(request)
        if pool_name is not None:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.pool, caller, pool_name)
        return {
            "object": "list",
            "data": [
                {
                    "id": self.settings.served_name,
                    "object": "model",
                    "created": int(self.started_at),
                    "owned_by": "lanpo",
                }
            ],
        }

    def health(self) -> Any:
        status = "draining" if self.draining else "ok" if self.engine is not None else "starting"
        body = {
            "status": status,
            "model": self.settings.served_name,
            "backend": self.settings.backend,
            "in_flight": self.pending,
        }
        if self.engine is not None:
            body["engine"] = self.engine.stats()
        if self.recorder is not None:  # answers stored, in how many group commits
            body["store"] = {"answers": self.recorder.stored, "commits": self.recorder.commits}
        if self.refitter is not None:  # the lesson fits verdicts waited on, and how many verdicts they counted
            body["store"] = {**body.get("store", {}), **self.refitter.stats()}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    def _log(
        self, request_id: str, caller: Caller | None, ask: Ask, served: Served, status: int, solution: Any
    ) -> None:
        record = {
            "event": "answer",
            "request_id": request_id,
            "status": status,
            "pool": ask.pool_name,
            "mode": ask.mode,
            "n": ask.n,
            "stream": served.streamed,
            "key": served.key_name,
            "fallback": served.fallback is not None,
            **served.timings,
        }
        if solution is not None:
            record.update(_usage(solution))
        access.info(json.dumps(record))


def _sampling(ask: Ask) -> dict[str, Any]:
    p = ask.params
    out = {
        "n": ask.n,
        "max_tokens": p.max_new_tokens,
        "min_tokens": p.min_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "seed": p.seed,
        "stop": list(p.stop),
    }
    if ask.mode == "retrieval":
        r = ask.retrieval
        out["retrieval"] = {"stage1": r.stage1, "top_k": r.top_k, "gamma": r.gamma, "m": r.m, "judge": r.judge}
    return out


def _usage(solution: Any) -> dict[str, int]:
    prompt = sum(t.prompt_tokens for s in solution.samples for t in s.turns)
    completion = sum(t.completion_tokens for s in solution.samples for t in s.turns)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def create_app(server: Server) -> BodyLimit:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(title="lanpo serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def gate(request: Request, call_next: Callable) -> Any:
        if request.url.path == "/health":
            return await call_next(request)
        if server.draining:
            return error_response(ApiError(503, "the server is shutting down", "draining"))
        if server.pending >= server.settings.max_pending:
            return error_response(ApiError(503, f"{server.pending} requests are waiting; try again", "overloaded"))
        server.pending += 1
        try:
            return await call_next(request)
        finally:
            server.pending -= 1

    install_error_handlers(app)
    app.add_api_route("/health", server.health, methods=["GET"])
    for prefix in ("", "/pools/{pool}", "/scopes/{scope}", "/pools/{pool}/scopes/{scope}"):
        app.add_api_route(f"{prefix}/v1/models", _route(server.models), methods=["GET"])
        app.add_api_route(f"{prefix}/v1/chat/completions", _route(server.chat), methods=["POST"])
        app.add_api_route(f"{prefix}/v1/feedback", _route(server.feedback), methods=["POST"])
    return BodyLimit(app, server.settings.max_body_bytes)


def _route(handler: Callable) -> Callable:
    async def route(request: Request) -> Any:
        return await handler(request, request.path_params.get("pool"))

    return route
