"""The model RL starts from: the base with its start adapter merged in (`model.init_adapter`, or the run's own SFT
warm start), recorded next to the run (`START_RECORD`) so that a resumed trainer and a rollout worker rebuild the
same start, checked by hash."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from lanpo.errors import InputError
from lanpo.feedback.lifecycle import Opened
from lanpo.models import adapter_sha256, merge_adapter
from lanpo.train.config import TrainConfig
from lanpo.train.plumbing.dist import Dist
from lanpo.train.plumbing.step_line import duration
from lanpo.train.policy import with_fresh_adapter

log = logging.getLogger(__name__)

START_RECORD = "start.json"  # in the run's folder: the model and start adapter RL began from


def load_start(
    cfg: TrainConfig,
    db: Engine,
    start: Opened,
    base: Any,
    tokenizer: Any,
    root: Path,
    dist: Dist,
    notify: Callable[[str], None] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The model RL starts from: `base` with the start adapter merged in (the paper starts RL from its SFT model).

    A new run takes `model.init_adapter`, or trains its own SFT warm start (every rank, data-parallel) when
    `sft.enabled`; a resumed run merges the adapter its `start.json` names, checked by hash. Returns the model
    and the start record (also written next to every checkpoint's adapter, so inference rebuilds the same base).
    """
    record_path = root / START_RECORD
    if start.last_step is not None:
        return recorded_start(base, root)
    folder, sha = cfg.model.init_adapter, None
    if folder is None and cfg.sft.enabled:
        from lanpo.train.sft.warm_start import run_sft

        if notify is not None:
            notify(f"SFT warm start: {_sft_plan(cfg)}")
        sft_model = with_fresh_adapter(base, cfg.lora, cfg.seed)
        ddp = dist.wrap(sft_model) if dist.enabled else None
        warm = run_sft(cfg, cfg.sft.data, db=db, progress=False, policy=(sft_model, tokenizer), dist=dist, ddp=ddp)
        log.info("SFT warm start: %d pairs, loss %.3f -> %.3f", warm.pairs, warm.losses[0], warm.losses[-1])
        if notify is not None:
            notify(
                f"SFT warm start done in {duration(warm.seconds)}: {warm.pairs} pairs, {len(warm.losses)} steps, "
                f"loss {warm.losses[0]:.3f} -> {warm.losses[-1]:.3f}; RL starts from its merged adapter"
            )
        sha = adapter_sha256(sft_model)
        base = sft_model.merge_and_unload()
        folder = str(warm.adapter_dir)
        dist.barrier()  # rank 0 has written the adapter
    elif folder is not None:
        base, sha = merge_adapter(base, folder)
    record = {"model": cfg.model.name, "adapter": None if folder is None else str(Path(folder).resolve())}
    if sha is not None:
        record["adapter_sha256"] = sha
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=1) + "\n")
    return base, record


def _sft_plan(cfg: TrainConfig) -> str:
    """What the warm start is about to do, in one line (before it does it)."""
    sft = cfg.sft
    pairs = f"the chat pairs of {sft.data}" if sft.data else "chat pairs built from the training problems"
    length = f"at most {sft.max_steps} steps" if sft.max_steps else f"{sft.epochs} epoch(s)"
    return (
        f"a LoRA adapter trained on {pairs} (the answer format, and reflection, exploration and summary), {length} "
        f"of {sft.batch_size} pairs"
    )


def recorded_start(base: Any, root: Path) -> tuple[Any, dict[str, Any]]:
    """The start a run in `root` recorded (`START_RECORD`): `base` with its start adapter merged, checked by hash
    (what a resumed trainer and a rollout worker build)."""
    record_path = root / START_RECORD
    recorded = json.loads(record_path.read_text()) if record_path.is_file() else {"adapter": None}
    if not recorded.get("adapter"):
        return base, recorded
    merged, sha = merge_adapter(base, recorded["adapter"])
    if sha != recorded.get("adapter_sha256"):
        raise InputError(
            f"the start adapter {recorded['adapter']} changed since this run started from it",
            hint="restore it, or start a new run_name",
        )
    return merged, recorded
