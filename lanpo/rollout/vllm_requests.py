"""What lanpo asks of a vLLM engine and how its answers come back, shared by the offline engine
(`lanpo.rollout.vllm.VLLMBackend`, `vllm.LLM`) and the serving one (`lanpo.serve.vllm_engine`, vLLM's `AsyncLLM`).

- `engine_kwargs`: the engine's settings from a `VLLMConfig`, with lanpo's log-prob mode and worker extension.
- `sampling_params`: a `lanpo.rollout.SamplingParams` as vLLM's, with lanpo's EOS as a stop token and the engine's
  log-prob of every sampled token; `next_token_sampling` / `next_token_row`: one greedy step that reports the
  log-probs of given token ids (the relevance judge).
- `to_completion`: one vLLM `CompletionOutput` as a `Completion`, its text decoded by lanpo's tokenizer.
- `adapter_snapshot`: an adapter's files copied into a private folder and hashed, its rank checked.

Imports no vLLM at module level: the vllm module is passed in by its caller.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lanpo.errors import ConfigError, InputError, LanpoError
from lanpo.models import ADAPTER_WEIGHTS, adapter_dir_sha256
from lanpo.rollout import Completion, SamplingParams, cut_at_stop
from lanpo.rollout.config import VLLMConfig

WORKER_EXTENSION = "lanpo.rollout.vllm_worker.LanpoWorker"  # the weight sync's methods, run in vLLM's worker

# What `Completion.logprobs` holds: log p under the distribution sampled from (temperature and top-p applied).
LOGPROBS_MODE = "processed_logprobs"

GUARD_HINT = (
    'build the vLLM engine under `if __name__ == "__main__":` (its engine core re-imports the main script), '
    "or set VLLM_ENABLE_V1_MULTIPROCESSING=0"
)


def refuse_in_spawned_import() -> None:
    """LanpoError when called while a spawned process re-imports its parent's main script (vLLM's engine core does)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise LanpoError("a vLLM engine was started while a spawned process re-imported a script", GUARD_HINT)


def engine_kwargs(config: VLLMConfig, device: str, enable_lora: bool) -> dict[str, Any]:
    """The engine's keyword arguments on `device` (`VLLMConfig.engine_kwargs`), with lanpo's log-prob mode and the
    worker extension (its weight-sync methods; its worker ends when the process that started the engine dies)."""
    return {
        **config.engine_kwargs(device, enable_lora=enable_lora),
        "logprobs_mode": LOGPROBS_MODE,
        "worker_extension_cls": WORKER_EXTENSION,
    }


def sampling_params(
    vllm: Any,
    params: SamplingParams,
    eos_token_id: int,
    copies: int,
    seed: int | None,
    **extra: Any,
) -> Any:
    """vLLM's SamplingParams for `copies` samples of one prompt: greedy at temperature <= 0 (top-p then off), lanpo's
    EOS and `params.stop` end generation, each sampled token's log-prob reported when `params.logprobs` (callers
    that keep none turn it off: answers, validation, summaries, `lanpo serve`); `extra` (e.g. `output_kind`) is
    passed on."""
    greedy = params.temperature <= 0
    return vllm.SamplingParams(
        n=copies,
        temperature=max(0.0, params.temperature),
        top_p=params.top_p if not greedy else 1.0,
        max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens,
        seed=seed,
        stop_token_ids=[eos_token_id],
        stop=list(params.stop) or None,
        logprobs=0 if params.logprobs else None,
        detokenize=bool(params.stop),  # stop strings are matched on the engine's detokenized text
        **extra,
    )


def next_token_sampling(vllm: Any, token_ids: Sequence[int], **extra: Any) -> Any:
    """One greedy step reporting the log-probs of `token_ids` at the first generated position."""
    return vllm.SamplingParams(
        max_tokens=1, temperature=0.0, logprob_token_ids=list(token_ids), detokenize=False, **extra
    )


def next_token_row(output: Any, token_ids: Sequence[int]) -> list[float]:
    """The log-prob of each of `token_ids` as the next token, from a `next_token_sampling` request's output."""
    first = output.outputs[0].logprobs[0]  # {token id: Logprob} at the first generated position
    return [float(first[t].logprob) for t in token_ids]


def served_lora_id(output: Any, want_id: int | None, want_sha256: str | None) -> int | None:
    """The id of the LoRA request that vLLM says served `output` (None: no adapter); refuses an answer from another
    request than the one sent (`want_id`, the adapter `want_sha256`)."""
    got = getattr(output, "lora_request", None)
    got_id = None if got is None else got.lora_int_id
    if got_id != want_id:
        raise LanpoError(
            f"vLLM answered a request with LoRA {got_id}, but LoRA {want_id} (adapter {want_sha256}) was requested",
            hint="this is a serving bug: do not trust these completions",
        )
    return got_id


def to_completion(
    output: Any, prompt_ids: Sequence[int], tokenizer: Any, served: str | None, stop: tuple[str, ...] = ()
) -> Completion:
    """A vLLM `CompletionOutput` as a Completion: its tokens, their log-probs, the text as the hf backend decodes
    it, cut where vLLM matched a stop string."""
    ids = tuple(output.token_ids)
    logprobs = None
    if output.logprobs is not None:
        logprobs = tuple(float(pos[t].logprob) for pos, t in zip(output.logprobs, ids, strict=True))
    text, hit = cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), stop)
    return Completion(
        text=text,
        token_ids=ids,
        prompt_token_ids=tuple(prompt_ids),
        finish_reason="stop" if output.finish_reason == "stop" or hit else "length",
        logprobs=logprobs,
        served_adapter_sha256=served,
    )


def adapter_snapshot(source: Path, root: Path, max_lora_rank: int) -> tuple[str, Path]:
    """Copy the adapter's files in `source` into a staging folder under `root` and hash the copy (the same hash as
    the live model's, `lanpo.models.adapter_dir_sha256`): (sha256, staging folder). Refuses a missing folder and a
    rank above `max_lora_rank`, leaving nothing behind."""
    if not source.is_dir():
        raise InputError(f"adapter folder {source} does not exist", hint="pass a folder written by the trainer")
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".staging-"))
    try:
        for name in ("adapter_config.json", *ADAPTER_WEIGHTS):
            if (source / name).is_file():
                shutil.copyfile(source / name, staging / name)
        sha = adapter_dir_sha256(staging)
        config = json.loads((staging / "adapter_config.json").read_text())
        rank = max([int(config.get("r", 0)), *map(int, (config.get("rank_pattern") or {}).values())])
        if rank > max_lora_rank:
            raise ConfigError(
                f"adapter {source} has LoRA rank {rank}, above vllm.max_lora_rank = {max_lora_rank}",
                hint="set vllm.max_lora_rank to the next of 8, 16, 32, 64, 128, ... at or above the rank",
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sha, staging
