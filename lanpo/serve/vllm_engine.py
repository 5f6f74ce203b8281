"""vLLM's AsyncLLM (continuous batching) as the engine of `lanpo serve`: the vllm backend's sampling, under asyncio.

- One engine for the life of the server, started inside the running event loop (`await AsyncVLLMEngine.start(...)`
  in the app's lifespan: vLLM's output handler is a task of that loop) with the settings of a `VLLMConfig` and
  lanpo's log-prob mode, as `VLLMBackend` starts its own (`lanpo.rollout.vllm_requests` is their shared code). Its
  engine core always runs in a process of its own (AsyncLLM has no in-process mode), spawned on CPU: the server's
  entry point must be import-safe (the `lanpo` console script is). `VLLMConfig.reproducible` is not honoured here:
  requests of different clients share the engine's batches and prefix cache, so a seeded request promises the
  distribution, not the draw.
- Every request is one engine request with a unique id, its prompt the token ids of lanpo's tokenizer (no special
  tokens added), lanpo's EOS and the request's stop strings ending it, as in `VLLMBackend.generate`: greedy gives
  one completion copied n times; completions carry the engine's log-probs and the served adapter's hash. A request
  whose awaiting task is cancelled (a client that went away) or whose stream is closed early is aborted in the
  engine, so it stops taking batch slots.
- `stream` yields text deltas that never run ahead of the final text: the decoded text so far, less what a later
  token could still change (an incomplete UTF-8 character, trailing whitespace that tokenizer clean-up may merge)
  and less a tail that may be the start of a stop string. Its last item carries the rest and the Completion.
- The adapter, if any, is fixed at start: its files are copied into a private snapshot and hashed as
  `VLLMBackend.set_adapter` does, and every request names it.
- On CPU the engine's KV blocks are `SERVE_CPU_BLOCK_SIZE` tokens unless `vllm.block_size` is set (`serving_config`):
  vLLM's prefix cache reuses whole blocks only, and at its CPU default of 128 a prefix that requests share (lanpo's
  system prompt; the judge's system prompt + question, the same for every candidate of a question) is never reused.
- `peak_running()`: the largest number of requests the engine's scheduler reported running in one step since start
  (a stat logger of our own given to AsyncLLM, fed with the scheduler's stats every step; `engine_stats`, which
  `lanpo serve` turns on with `--engine-stats` only). Above 1, requests were batched together while others ran:
  continuous batching seen from the engine itself.
- Requests ask vLLM for no token log-probs: a served answer is stored as text and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from lanpo.errors import InputError, LanpoError
from lanpo.models import prepare_tokenizer, resolve_model
from lanpo.rollout import Completion, SamplingParams, cut_at_stop
from lanpo.rollout.config import VLLMConfig
from lanpo.rollout.vllm import START_HINT, import_vllm
from lanpo.rollout.vllm_process import environment, process_state_kept
from lanpo.rollout.vllm_requests import (
    adapter_snapshot,
    engine_kwargs,
    next_token_row,
    next_token_sampling,
    refuse_in_spawned_import,
    sampling_params,
    served_lora_id,
    to_completion,
)
from lanpo.rollout.vllm_worker import OWNER_ENV, engine_owner

log = logging.getLogger(__name__)

# bench/serve.py, 64-token replies, 2-core EPYC (docs/log.md, 2026-12-06): at 32 rather than 128 plain `vllm serve`
# went from 66.3 to 78.0 completion tokens/s, lanpo's retrieval with the judge from 19.3 to 25.4
SERVE_CPU_BLOCK_SIZE = 32
HELD_BACK = "\ufffd"  # what the tokenizer decodes an incomplete UTF-8 character to


def serving_config(config: VLLMConfig, device: str) -> VLLMConfig:
    """`config` as `lanpo serve` starts its engine on `device`: on CPU, `block_size` unset becomes
    `SERVE_CPU_BLOCK_SIZE`."""
    if device == "cpu" and config.block_size is None:
        return dataclasses.replace(config, block_size=SERVE_CPU_BLOCK_SIZE)
    return config


class RunningStats:
    """A vLLM stat logger (the per-engine interface of `vllm.v1.metrics.loggers.StatLoggerBase`) that keeps the
    number of requests the scheduler runs now and the largest number it ever ran in one step."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.steps = 0

    def factory(self, vllm_config: Any, engine_index: int = 0) -> RunningStats:
        return self  # AsyncLLM builds its loggers from factories: this one hands over the instance we read

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if scheduler_stats is not None:
            self.steps += 1
            self.running = int(scheduler_stats.num_running_reqs)
            self.peak = max(self.peak, self.running)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def stable_text(text: str, stop: tuple[str, ...]) -> str:
    """The part of `text` (the completion decoded so far) that no later token can change: cut at a stop string
    found, else less an incomplete character or trailing whitespace, and less a tail that begins a stop string."""
    text, hit = cut_at_stop(text, stop)
    if hit:
        return text
    end = len(text)
    while end and (text[end - 1] == HELD_BACK or text[end - 1].isspace()):
        end -= 1
    held = 0
    for s in stop:
        held = max([held, *(k for k in range(1, min(len(s), end + 1)) if text[:end].endswith(s[:k]))])
    return text[: end - held]


class AsyncVLLMEngine:
    """vLLM's AsyncLLM serving `model_id`; build it with `await AsyncVLLMEngine.start(...)` in a running loop."""

    def __init__(
        self,
        llm: Any,
        vllm: Any,
        tokenizer: Any,
        model_id: str,
        stats: RunningStats | None,
        lora: Any = None,
        adapter_sha256: str | None = None,
        snapshots: Path | None = None,
    ) -> None:
        self.llm = llm
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.adapter_sha256 = adapter_sha256
        self.max_model_len = int(llm.model_config.max_model_len)
        self.load_seconds = 0.0
        self._stats = stats
        self._lora = lora
        self._snapshots = snapshots

    @classmethod
    async def start(
        cls,
        model: str | Path,
        config: VLLMConfig | None = None,
        adapter: str | Path | None = None,
        *,
        model_id: str | None = None,
        engine_stats: bool = True,
    ) -> AsyncVLLMEngine:
        """Start the engine for `model` (a folder or a name `resolve_model` knows) serving `adapter` (a LoRA
        folder; None: the base model). Blocks the loop while vLLM loads (tens of seconds on CPU): call it before
        serving. `model_id` names it to clients (default: `model` as given). `engine_stats`: give AsyncLLM the stat
        logger `peak_running` reads; vLLM then gathers its scheduler's stats every step (`lanpo serve` leaves it
        off unless `--engine-stats`: 1.6 % of its tokens a second on a 2-core Xeon, docs/log.md 2026-12-07)."""
        refuse_in_spawned_import()
        vllm = import_vllm()
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        config = config or VLLMConfig()
        folder = resolve_model(model)
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(folder))
        snapshots = sha = lora = None
        if adapter is not None:
            snapshots = Path(tempfile.mkdtemp(prefix="lanpo-serve-lora-"))
            try:
                sha, staging = adapter_snapshot(Path(adapter).expanduser(), snapshots, config.max_lora_rank)
            except BaseException:
                shutil.rmtree(snapshots, ignore_errors=True)
                raise
            from vllm.lora.request import LoRARequest

            lora = LoRARequest(f"lanpo-{sha[:12]}", 1, str(staging.rename(snapshots / sha)))
        device = current_platform.device_type
        kwargs = engine_kwargs(serving_config(config, device), device, enable_lora=adapter is not None)
        stats = RunningStats() if engine_stats else None
        started = time.perf_counter()
        engine = None  # no local names the AsyncLLM: a frame of this call that outlives it (vLLM's imports keep
        # some) would keep it to interpreter exit, where its __del__ fails shutting it down a second time
        try:
            # the engine's processes inherit the owner and end when this one dies (lanpo.rollout.vllm_worker)
            with environment({OWNER_ENV: engine_owner()}), process_state_kept():
                args = AsyncEngineArgs(model=str(folder), tokenizer=str(folder), disable_log_stats=True, **kwargs)
                engine = cls(
                    AsyncLLM.from_engine_args(args, stat_loggers=None if stats is None else [stats.factory]),
                    vllm,
                    tokenizer,
                    model_id or str(model),
                    stats,
                    lora,
                    sha,
                    snapshots,
                )
            if lora is not None:
                await engine.llm.add_lora(lora)
        except Exception as exc:
            if engine is not None:
                await engine.close()
            elif snapshots is not None:
                shutil.rmtree(snapshots, ignore_errors=True)
            raise LanpoError(
                f"vLLM could not start its engine for {folder} on {device}: {type(exc).__name__}: {exc}", START_HINT
            ) from exc
        engine.load_seconds = time.perf_counter() - started
        log.info("vLLM AsyncLLM for %s on %s started in %.1f s (%s)", folder, device, engine.load_seconds, kwargs)
        return engine

    async def close(self) -> None:
        """Shut the engine down (its processes end, with any request still running) and delete the adapter copy."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            await asyncio.sleep(0)  # its output handler, cancelled, ends
            del llm
            gc.collect()  # not at interpreter exit, where its __del__ would shut it down again half torn down
        if self._snapshots is not None:
            shutil.rmtree(self._snapshots, ignore_errors=True)

    async def aclose(self) -> None:
        await self.close()

    def judge(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The served policy as relevance judge, on this engine, for retrieval's worker threads (blocking calls)."""
        from lanpo.retrieval.vllm_judge import AsyncVLLMJudge
        from lanpo.serve.engine import BlockingJudge, judge_id

        return BlockingJudge(AsyncVLLMJudge(self, judge_id(self.model_id, self.adapter_sha256)), loop)

    def stats(self) -> dict[str, Any]:
        return {
            "backend": "vllm",
            "batching": "continuous",
            "peak_running": self.peak_running(),
            "running": self.running(),
        }

    # ------------------------------------------------------------------ state

    def peak_running(self) -> int | None:
        """The most requests the engine's scheduler ran in one step since start (None: started without stats)."""
        return None if self._stats is None else self._stats.peak

    def running(self) -> int | None:
        """The requests the scheduler ran in its last step (None: started without stats)."""
        return None if self._stats is None else self._stats.running

    def unfinished(self) -> int:
        """Requests the engine holds now (running or waiting), as its front end counts them."""
        return 0 if self.llm is None else int(self.llm.get_num_unfinished_requests())

    # ------------------------------------------------------------------ requests

    async def generate(self, prompt: str, params: SamplingParams, n: int = 1) -> list[Completion]:
        """`n` completions of `prompt` (greedy at temperature 0: one, copied n times)."""
        if n < 1:
            raise InputError(f"n must be >= 1, got {n}")
        greedy = params.temperature <= 0
        copies = 1 if greedy else n
        ids = self._encode(prompt)
        final = await self._final(ids, self._sampling(params, copies, "FINAL_ONLY"))
        group = [self._completion(c, ids, params.stop) for c in final.outputs]
        return group * n if greedy else group

    async def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[tuple[str, Completion | None]]:
        """One completion of `prompt` as (text delta, None) items while it is generated, then (the rest, the
        Completion): the deltas joined are the Completion's text."""
        ids = self._encode(prompt)
        emitted = ""
        async with contextlib.aclosing(self._outputs(ids, self._sampling(params, 1, "CUMULATIVE"))) as outputs:
            async for out in outputs:
                output = out.outputs[0]
                if out.finished:
                    completion = self._completion(output, ids, params.stop)
                    if not completion.text.startswith(emitted):
                        raise LanpoError(
                            f"streamed {emitted!r}, which the final text {completion.text!r} does not begin with",
                            hint="this is a serving bug: report it with the prompt",
                        )
                    yield completion.text[len(emitted) :], completion
                    return
                text = stable_text(self.tokenizer.decode(output.token_ids, skip_special_tokens=True), params.stop)
                if len(text) > len(emitted) and text.startswith(emitted):
                    delta, emitted = text[len(emitted) :], text
                    yield delta, None

    async def next_token_logprobs(
        self, prompts: Sequence[Sequence[int]], token_ids: Sequence[int]
    ) -> list[list[float]]:
        """Log-probs of each of `token_ids` as the next token after each prompt (token ids): rows follow `prompts`,
        columns `token_ids`. Every prompt is its own engine request, all submitted at once."""
        wanted = [int(t) for t in token_ids]
        sampling = next_token_sampling(self._vllm, wanted, output_kind=self._kind("FINAL_ONLY"))
        for ids in prompts:
            self._check_length(len(ids))
        async with asyncio.TaskGroup() as group:  # one failure cancels (and so aborts) the rest
            tasks = [group.create_task(self._final([int(t) for t in ids], sampling)) for ids in prompts]
        return [next_token_row(task.result(), wanted) for task in tasks]

    # ------------------------------------------------------------------ plumbing

    def _encode(self, prompt: str) -> list[int]:
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        self._check_length(len(ids))
        return ids

    def _check_length(self, length: int) -> None:
        if length == 0:
            raise InputError("the prompt is empty")
        if length >= self.max_model_len:
            raise InputError(
                f"the prompt has {length} tokens; the engine holds at most {self.max_model_len} with the completion",
                hint="shorten the prompt, or start the server with a larger vllm.max_model_len",
            )

    def _kind(self, name: str) -> Any:
        from vllm.sampling_params import RequestOutputKind

        return RequestOutputKind[name]

    def _sampling(self, params: SamplingParams, copies: int, kind: str) -> Any:
        # no token log-probs: a served answer is stored as text and counts (lanpo.inference.modes.grade_turn), and
        # asking vLLM for them cost about 5 % of its tokens a second on a 2-core Xeon (docs/log.md, 2026-12-07)
        eos = self.tokenizer.eos_token_id
        kind_ = self._kind(kind)
        return sampling_params(
            self._vllm, dataclasses.replace(params, logprobs=False), eos, copies, params.seed, output_kind=kind_
        )

    def _completion(self, output: Any, prompt_ids: list[int], stop: tuple[str, ...]) -> Completion:
        return to_completion(output, prompt_ids, self.tokenizer, self.adapter_sha256, stop)

    async def _final(self, ids: list[int], sampling: Any) -> Any:
        final = None
        async with contextlib.aclosing(self._outputs(ids, sampling)) as outputs:
            async for out in outputs:
                final = out
        if final is None or not final.finished:
            raise LanpoError("vLLM ended a request without its final output", hint="see the engine's log above")
        return final

    async def _outputs(self, ids: list[int], sampling: Any) -> AsyncIterator[Any]:
        """The engine's outputs for one request; aborted in the engine unless it finished (cancelled, closed)."""
        if self.llm is None:
            raise LanpoError("the vLLM engine is closed", hint="start a new AsyncVLLMEngine")
        request_id = f"lanpo-{uuid.uuid4().hex}"
        finished = False
        outputs = self.llm.generate({"prompt_token_ids": ids}, sampling, request_id, lora_request=self._lora)
        try:
            async for out in outputs:
                served_lora_id(out, None if self._lora is None else self._lora.lora_int_id, self.adapter_sha256)
                finished = out.finished
                yield out
        finally:
            await outputs.aclose()  # vLLM aborts a request whose generator is closed before it finished
            if not finished and self.llm is not None:
                await self.llm.abort(request_id)
