"""`lanpo serve`'s vLLM engine (AsyncLLM): concurrent requests batched by the engine, streams that join to the final
text, the judge's maths as on the offline engine, and a cancelled request aborted in the engine.

The engine is loop-bound (vLLM's output handler is a task of the loop it started in), so the module keeps one event
loop and runs every coroutine on it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lanpo.rollout import SamplingParams
from lanpo.rollout.config import VLLMConfig
from tests.vllm_engine.helpers import chat, needs_vllm
from tests.vllm_engine.test_judge import PAIRS

pytestmark = [pytest.mark.vllm, needs_vllm]

# fp32, as the transformers reference of the judge comparison, so that it is one of maths, not of bf16 rounding
SERVE = VLLMConfig(max_model_len=1024, dtype="float32", memory_fraction=0.05)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(smollm2_dir: Path, loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    from lanpo.serve.vllm_engine import AsyncVLLMEngine

    engine = loop.run_until_complete(AsyncVLLMEngine.start(smollm2_dir, SERVE, model_id="smollm2"))
    yield engine
    loop.run_until_complete(engine.close())


def test_stable_text_holds_back_what_a_later_token_may_change() -> None:
    from lanpo.serve.vllm_engine import stable_text

    assert stable_text("The answer is 4", ()) == "The answer is 4"
    assert stable_text("The answer is ", ()) == "The answer is"  # clean-up may merge the space with the next token
    assert stable_text("caf\ufffd", ()) == "caf"  # half a UTF-8 character
    assert stable_text("so x = 4\n\nAns", ("\n\nAnswer",)) == "so x = 4"  # may be the start of the stop string
    assert stable_text("so x = 4. Done", ("Done",)) == "so x = 4. "  # a stop string found: final up to it
    assert stable_text("x = 4 A", ("AB",)) == "x = 4 "  # a space before a held-back tail is not trailing


def test_concurrent_requests_run_in_one_batch(engine: Any, loop: asyncio.AbstractEventLoop) -> None:
    prompts = chat(engine.tokenizer, ("What is 12 + 30?", "Name a prime number above 50.") * 4)
    params = [SamplingParams(max_new_tokens=48, min_new_tokens=48, temperature=1.0, seed=i) for i in range(8)]

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(engine.generate(p, s, 2) for p, s in zip(prompts, params, strict=True)))

    started = time.perf_counter()
    groups = loop.run_until_complete(all_at_once())
    took = time.perf_counter() - started
    print(f"8 concurrent requests x 2 samples x 48 tokens: {took:.1f} s, peak running {engine.peak_running()}")
    assert engine.peak_running() >= 2, "the engine never ran two requests in one step"
    assert engine.unfinished() == 0
    for prompt, group in zip(prompts, groups, strict=True):
        assert len(group) == 2 and len({c.token_ids for c in group}) == 2  # each sample its own stream
        for c in group:
            assert c.prompt_token_ids == tuple(engine.tokenizer.encode(prompt, add_special_tokens=False))
            assert len(c.token_ids) == 48 and c.finish_reason == "length"
            assert c.logprobs is None  # serving asks vLLM for no log-probs: it keeps none
            assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert c.served_adapter_sha256 is None


def test_greedy_gives_copies_and_stops_at_eos(engine: Any, loop: asyncio.AbstractEventLoop) -> None:
    prompt = chat(engine.tokenizer)[0]
    group = loop.run_until_complete(engine.generate(prompt, SamplingParams(max_new_tokens=200, temperature=0.0), 3))
    assert len(group) == 3 and len(set(group)) == 1
    assert group[0].finish_reason == "stop" and group[0].token_ids[-1] == engine.tokenizer.eos_token_id


def _stream(engine: Any, loop: asyncio.AbstractEventLoop, prompt: str, params: SamplingParams) -> tuple[list, Any]:
    async def collect() -> tuple[list[str], Any]:
        deltas, final = [], None
        async for delta, completion in engine.stream(prompt, params):
            assert final is None, "an item after the final one"
            deltas.append(delta)
            final = completion
        return deltas, final

    return loop.run_until_complete(collect())


def test_a_stream_joins_to_the_final_text_which_generate_returns(engine: Any, loop: asyncio.AbstractEventLoop) -> None:
    prompt = chat(engine.tokenizer, ("Explain in two sentences why the sky is blue.",))[0]
    params = SamplingParams(max_new_tokens=64, temperature=0.0)
    deltas, final = _stream(engine, loop, prompt, params)
    assert len(deltas) > 5, "the text came in one piece, not as it was generated"
    assert "".join(deltas) == final.text
    assert final == loop.run_until_complete(engine.generate(prompt, params, 1))[0]

    # a stop string in the middle of that text: the stream stops before it, never showing a piece of it
    whole = final.text
    stop = " " + whole.split(" ")[len(whole.split(" ")) // 2]
    cut = whole.index(stop)
    stopped = SamplingParams(max_new_tokens=64, temperature=0.0, stop=(stop,))
    deltas, final = _stream(engine, loop, prompt, stopped)
    assert "".join(deltas) == final.text == whole[:cut] and final.finish_reason == "stop"
    assert final == loop.run_until_complete(engine.generate(prompt, stopped, 1))[0]


def test_the_judge_scores_as_the_hf_judge(engine: Any, loop: asyncio.AbstractEventLoop, hf_smollm2: Any) -> None:
    """Against transformers' forward pass on the same weights (fp32 both sides): another engine, another code path,
    the reference `test_judge.py` holds the offline engine's judge to (a second vLLM engine here cost ~18 s)."""
    from lanpo.retrieval.judge import HFJudge
    from lanpo.retrieval.vllm_judge import AsyncVLLMJudge

    judge = AsyncVLLMJudge(engine, model_id="smollm2")
    started = time.perf_counter()
    served = loop.run_until_complete(judge.score(PAIRS))
    print(f"judge, {len(PAIRS)} pairs at once: {time.perf_counter() - started:.2f} s")
    model, tokenizer = hf_smollm2
    reference = HFJudge(model, tokenizer, model_id="smollm2")
    assert reference.identity == judge.identity
    diffs = [abs(a - b) for a, b in zip(reference.score(PAIRS), served, strict=True)]
    print("judge |served - hf|:", max(diffs))
    assert max(diffs) < 1e-2, diffs  # fp32 on both sides (test_judge.py's 0.1 allows for bf16)
    assert loop.run_until_complete(judge.score([])) == []


def test_a_cancelled_request_is_aborted_in_the_engine(engine: Any, loop: asyncio.AbstractEventLoop) -> None:
    prompt = chat(engine.tokenizer)[0]
    long = SamplingParams(max_new_tokens=800, min_new_tokens=800, temperature=1.0, seed=0)

    async def cancel_while_running() -> float:
        task = asyncio.create_task(engine.generate(prompt, long, 1))
        deadline = time.monotonic() + 120
        while engine.unfinished() == 0 or engine.running() == 0:  # wait until the scheduler runs it
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        cancelled = time.monotonic()
        while engine.unfinished():
            assert time.monotonic() < cancelled + 10, "the cancelled request still runs in the engine"
            await asyncio.sleep(0.05)
        return time.monotonic() - cancelled

    print(f"aborted {loop.run_until_complete(cancel_while_running()):.2f} s after the cancel")

    async def leave_a_stream() -> None:  # a client that stops reading: the stream is closed, as Starlette's is
        async with contextlib.aclosing(engine.stream(prompt, long)) as stream:
            async for delta, _ in stream:
                if delta:
                    break
        assert engine.unfinished() == 0

    loop.run_until_complete(leave_a_stream())
    # the engine serves on: a short request finishes long before the cancelled one would have
    short = loop.run_until_complete(engine.generate(prompt, SamplingParams(max_new_tokens=4, temperature=0.0), 1))
    assert len(short[0].token_ids) <= 4 and engine.unfinished() == 0
