"""What each rank runs in tests/train/test_fsdp_engine.py (spawned processes import it by name): a full fine-tuning
policy FSDP2-sharded over gloo ranks, generating through an engine of its own, then streaming its weights into an
engine worker; and the single-process side it is compared with.

The engine stands in for vLLM with real parts: `HFBackend` over a copy of the weights that is not the trained model
(what an engine with weights of its own is), and vLLM's worker half, `LanpoWorker`, whose `model_runner` is the one
piece of vLLM replaced: it keeps the tensors `reload_weights` is given."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from lanpo.models import tiny_causal_lm
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend
from lanpo.rollout.vllm_worker import LanpoWorker
from lanpo.rollout.weights import checked_state, checkpoint_shapes, send_weights
from lanpo.train.plumbing import fsdp
from lanpo.train.plumbing.dist import Dist
from lanpo.train.plumbing.timing import Phases
from lanpo.train.policy import FullPolicy
from lanpo.train.producer.served_policy import ServedPolicy

PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
LIMIT = 2048  # bytes a bucket: the tiny model's 25k weights in bf16 travel in about two dozen
PHASES = ("generate", "summarize", "mel")  # the step's phases around generation (lanpo.train.plumbing.timing)


def start() -> tuple[Any, Any]:
    """The tiny model with every weight moved by seeded noise (not the init: the sync must carry something), fp32."""
    torch.set_num_threads(1)
    model, tokenizer = tiny_causal_lm(seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.float(), tokenizer


def prompts(rank: int) -> list[str]:
    """Uneven shares: rank 0 two prompts, rank 1 one (the ranks generate different numbers of tokens)."""
    return ["a b c d", "e f"] if rank == 0 else ["g h i"]


def tokens(groups: list[list[Any]]) -> list[list[list[int]]]:
    return [[list(c.token_ids) for c in group] for group in groups]


class Recorder(torch.nn.Module):
    """vLLM's model runner as far as `LanpoWorker` sees it: what `reload_weights` received, cloned."""

    def __init__(self) -> None:
        super().__init__()
        self.received: dict[str, torch.Tensor] = {}
        self.reloads = 0

    def reload_weights(self, weights_iterator: Any) -> None:
        self.reloads += 1
        self.received = {name: t.clone() for name, t in weights_iterator}

    def get_model(self) -> torch.nn.Module:
        return self


def engine_worker() -> tuple[LanpoWorker, Recorder]:
    worker, runner = LanpoWorker(), Recorder()
    worker.model_runner = runner  # type: ignore[attr-defined]
    return worker, runner


def sync(state: dict[str, Any], folder: Path, fail_at: int = 0) -> dict[str, Any]:
    """`state` streamed into a fresh engine worker in bf16 (`send_weights`, as `VLLMBackend._send` calls it);
    `fail_at`: the fail_at-th staged bucket is lost on the way."""
    expected = checkpoint_shapes(folder)
    worker, runner = engine_worker()
    staged: list[int] = []

    def rpc(method: str, **kwargs: Any) -> Any:
        if method == "lanpo_stage":
            staged.append(sum(len(item[3]) for item in kwargs["bucket"]))
            if len(staged) == fail_at:
                raise RuntimeError("the bucket was lost on the way")
        return getattr(worker, method)(**kwargs)

    checked = checked_state(state, expected, folder)
    out: dict[str, Any] = {"buckets": staged}
    try:
        out["sha"], _ = send_weights(checked, rpc, torch.bfloat16, LIMIT, expected, worker.lanpo_abort)
    except RuntimeError as exc:
        out["error"] = str(exc)
        out["still_staged"] = getattr(worker, "_lanpo_staged", None)
    out["received"], out["reloads"] = runner.received, runner.reloads
    return out


def count_gathers() -> dict[str, int]:
    """Count FSDP2's parameter all-gathers (`FSDPParamGroup.unshard` of a group not yet unsharded): every forward
    of a sharded unit and every explicit `unshard` goes through it."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    counter = {"all_gathers": 0}
    real = FSDPParamGroup.unshard

    def unshard(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.is_unsharded and self._all_gather_result is None:
            counter["all_gathers"] += 1
        return real(self, *args, **kwargs)

    FSDPParamGroup.unshard = unshard  # type: ignore[method-assign]
    return counter


def track_full_tensors() -> dict[str, int]:
    """The bytes of the full tensors `DTensor.full_tensor` gathered that are alive at once, at the most (the peak
    comes right after a gather), and the largest one: each storage is watched (`StorageWeakRef`), so a view that
    kept a gathered tensor alive would count too."""
    from torch.distributed.tensor import DTensor
    from torch.multiprocessing.reductions import StorageWeakRef

    live = {"peak": 0, "largest": 0, "gathers": 0}
    alive: list[tuple[Any, int]] = []
    real = DTensor.full_tensor

    def tracked(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        storage = out.untyped_storage()
        alive[:] = [(ref, size) for ref, size in alive if not ref.expired()]
        alive.append((StorageWeakRef(storage), storage.nbytes()))
        live["gathers"] += 1
        live["largest"] = max(live["largest"], storage.nbytes())
        live["peak"] = max(live["peak"], sum(size for _, size in alive))
        return out

    DTensor.full_tensor = tracked  # type: ignore[method-assign]
    return live


def run(rank: int, world: int, folder: Path) -> dict[str, Any]:
    """Every check's raw results on this rank (the test asserts on rank 0's, and on what both ranks agreed)."""
    model, tokenizer = start()
    engine_copy = copy.deepcopy(model).eval()  # the engine's own weights: W, but not the trained module
    policy = FullPolicy(model, tokenizer, Dist(rank=rank, world=world))
    assert fsdp.is_sharded(policy.model)
    gathers = count_gathers()
    out: dict[str, Any] = {}

    # 1. an engine of its own generates: nothing of the policy is gathered in any phase, nor in validation
    engine = ServedPolicy(HFBackend(engine_copy, tokenizer), policy.model, "hf")
    policy.engine_generates = not engine.generates_with(policy.model)  # as lanpo.train.state.setup sets it
    out["engine_generates"] = policy.engine_generates
    phase = Phases(policy, step=1)
    out["engine_tokens"] = {}
    for name in PHASES:
        with phase(name):
            out["engine_tokens"][name] = tokens(engine.generate(prompts(rank), 2, PARAMS))
    with policy.generating():  # validation's
        out["engine_tokens"]["validate"] = tokens(engine.generate(prompts(rank), 2, PARAMS))
    out["gathers_with_engine"] = gathers["all_gathers"]

    # ... and the hf backend, which generates with the policy's own model, still gathers it whole for the phase
    hf = ServedPolicy(HFBackend(policy.model, tokenizer), policy.model, "hf")
    policy.engine_generates = not hf.generates_with(policy.model)
    out["hf_engine_generates"] = policy.engine_generates
    with Phases(policy, step=1)("generate"):
        out["hf_tokens"] = tokens(hf.generate(prompts(rank), 2, PARAMS))
    out["gathers_with_hf"] = gathers["all_gathers"] - out["gathers_with_engine"]
    out["sharded_after"] = all(type(p).__name__ == "DTensor" for p in policy.model.parameters())

    # 2. the streamed sync: what the engine receives, the hash, and how much was ever gathered at once
    live = track_full_tensors()
    streamed = sync(policy.model.state_dict(), folder)
    out["streamed"] = streamed
    out["live"] = dict(live)
    whole = fsdp.full_state_everywhere(policy.model)  # the former path: the whole fp32 state at once
    # which gathers a tied head as a copy of its own, that checked_state refuses as another model's head
    out["whole_tied_copy"] = whole["lm_head.weight"].data_ptr() != whole["model.embed_tokens.weight"].data_ptr()
    assert torch.equal(whole.pop("lm_head.weight"), whole["model.embed_tokens.weight"])
    out["whole_bytes"] = sum(t.numel() * t.element_size() for t in whole.values())
    out["whole"] = sync(whole, folder)
    del whole
    # a bucket lost half-way: nothing reached the engine, nothing stays staged; the next sync goes through whole
    out["failed"] = sync(policy.model.state_dict(), folder, fail_at=3)
    out["after_failure"] = sync(policy.model.state_dict(), folder)
    return out


def worker(rank: int, world: int, store: str, folder: str, out: str) -> None:
    """A spawned rank: join the gloo group, `run`, rank 0 saves what it got to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1")
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = run(rank, world, Path(folder))
        results: list[Any] = [None] * world
        torch_dist.all_gather_object(results, {k: result[k] for k in ("engine_tokens", "hf_tokens", "streamed")})
        if rank == 0:
            torch.save({"rank0": result, "ranks": results}, out)
    finally:
        torch_dist.destroy_process_group()
