"""`[replay]` at the paper's shape: several ranks and several minibatches a step.

- The step's draw is split over ranks as its groups are: each replayed row on the rank of the group it joins, once.
- Two gloo ranks (rank 0 holding more replayed rows than rank 1) update the LoRA weights as one process does on all
  the rows, over two minibatches with micro-batches of 3: max |difference| <= 1e-5 in float32.
- A replayed row trains in its group's minibatch: the update equals a loop over the minibatches built by that rule,
  each taken whole.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

from lanpo.rl.replay_loss import separate_term_weights
from lanpo.train.consumer.update import micro_batch_loss, update_policy, warmup_schedule
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import LoraPolicy
from lanpo.train.replay import global_order, rank_share
from tests.train import multirank_workers as w
from tests.train import replay_ranks as rr

ATOL = 1e-5  # float32, AdamW at lr 1e-2: other sums of the same terms, in other micro-batches and ranks


def test_the_steps_replayed_rows_are_split_over_ranks_with_their_groups_once_each() -> None:
    groups = list(range(12))
    shares = [Dist(rank=r, world=4).share(groups) for r in range(4)]
    assert global_order(shares) == groups and global_order(None) is None
    rows = [(g, f"row-{i}") for i, g in enumerate([0, 0, 3, 5, 6, 11, 11, 11])]
    split = [rank_share(rows, Dist(rank=r, world=4)) for r in range(4)]
    # each row on the rank of its group, at that group's place among the rank's groups
    assert sorted(c for part in split for _, c in part) == sorted(c for _, c in rows)
    for r, part in enumerate(split):
        mine = [(g, c) for g, c in rows if g % 4 == r]
        assert [c for _, c in part] == [c for _, c in mine]
        assert [shares[r][local] for local, _ in part] == [g for g, _ in mine]
    assert rank_share(rows, Dist()) == rows


def test_replay_at_two_ranks_and_two_minibatches_equals_one_process(tmp_path: Path) -> None:
    """RePO's separate terms (each kind's token-mean over both ranks) and ExGRPO's shaped term under a seq-mean (the
    minibatch's sequences counted over ranks that hold different numbers): the single process's update."""
    out = tmp_path / "replay.pt"
    mp.start_processes(
        rr.worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, start_method="spawn", join=True
    )  # fmt: skip
    multi = torch.load(out, weights_only=False)
    start = {n: p.detach() for n, p in w.policy()[0].named_parameters() if p.requires_grad}
    for job in rr.JOBS:
        single, single_steps = rr.update(0, 1, *job)
        weights, steps = multi[job]
        assert weights.keys() == single.keys()
        diff = max(float((weights[n] - single[n]).abs().max()) for n in single)
        assert diff <= ATOL, (job, diff)
        assert max(float((single[n] - start[n]).abs().max()) for n in single) > 1e-3, "the update moved nothing"
        assert steps == single_steps == 2  # 32 fresh sequences / minibatch 16: replayed rows add no step


def test_a_replayed_row_trains_in_its_groups_minibatch() -> None:
    """The update's two minibatches against a loop over them built by hand: minibatch j holds groups 8j..8j+7's
    fresh rows and the replayed rows joined to those groups, each minibatch one forward, the old log-probs taken
    before the first step."""
    cfg = replace(w.GRPO, micro_batch_size=64)
    model, _ = w.policy()
    policy = LoraPolicy(model, Dist())
    batch, advantages, rows = rr.replay_batch(0, 1, "separate")
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.learning_rate)
    update_policy(policy, optimizer, warmup_schedule(optimizer, 10, 0.0), batch, advantages, w.GRPO, 0, replay=rows)
    updated = [p.detach().clone() for p in policy.trainable_parameters()]

    model, _ = w.policy()
    policy = LoraPolicy(model, Dist())
    params = policy.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate)
    scheduler = warmup_schedule(optimizer, 10, 0.0)
    settings = LogprobSettings.from_grpo(cfg, temperature=1.0)
    ref = policy.reference_logprobs(batch, settings)
    old = chunked_logprobs(model, batch, settings)
    fresh = int((~rows.replayed).sum())
    for j in range(2):
        groups = set(range(8 * j, 8 * j + 8))
        mb = torch.tensor([b for b in range(batch.size) if int(rows.group[b]) in groups])
        assert int(rows.replayed[mb].sum()) == sum(g in groups for g in rr.REPLAYED_GROUPS)
        assert int((mb < fresh).sum()) == 16  # the fresh minibatch of one process without replay
        sub = rows.select(mb)
        weight = separate_term_weights(sub.replayed, batch.completion_mask[mb], cfg.loss_agg)  # type: ignore[arg-type]
        optimizer.zero_grad()
        loss, _, _ = micro_batch_loss(
            model, batch.select(mb), advantages[mb], old[mb], ref[mb], None, cfg, settings, sub, weight
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
    diff = max(float((a - b.detach()).abs().max()) for a, b in zip(updated, params, strict=True))
    assert diff <= ATOL, diff
