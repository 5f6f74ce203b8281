"""Replay in lanpo's trainer (`[replay]`): stored trajectories of a step's problems joined to their groups.

    the step's problems -> stored trajectories (lanpo.db.repo.trajectories) -> the draw (lanpo.feedback.replay_draw)
    -> R replayed rows appended after the G*n fresh ones -> advantages and loss (lanpo.rl.replay_loss)
    -> 'replayed' groups

What a replayed row is: an attempt of an earlier step (of this run, or of `replay.source_runs`) whose group was
zero-shot, so its prompt is the question alone, the prompt it trains under now. Its tokens are the ones the engine
sampled (`attempt_tokens.token_ids`), never the response re-tokenised, and its behaviour log-probs are the ones
stored beside them:
- 'engine': the rollout engine's log-prob of each sampled token (vLLM, at the rollout temperature);
- 'trainer': with the hf backend, which samples from the trained model itself, the trainer's log-prob of each token
  under the policy that sampled it, taken in a no-grad pass before that step's update (`behaviour_rows`), at the
  rollout temperature and under the update's autocast.
How that is checked: here, a stored row whose tokens do not decode to its stored response is never replayed (counted
in `replay/mismatched`), and a source run sampled at another temperature is refused; in the tests
(tests/train/test_replay.py), the stored log-probs of a step's attempts equal a fresh forward of the policy that
sampled them, and differ from the policy after that step's update.

The replayed rows cost no generation; they cost their share of the update, which `cost/trained_tokens` counts
(lanpo.report.cost). They are written as groups of mode 'replayed', each attempt naming its source (`replay_of`),
in the step's one write (`lanpo.feedback.lifecycle.write_groups`, given the draws): never a fresh rollout in any view
or metric.

Under torchrun the draw is made once for the whole step: rank 0 reads the stored trajectories of every rank's problems
(in the step's global order), every rank draws from them with the same seed (the entropy's forwards, if any, on every
rank alike) and rank 0's draw is the one kept. A replayed row joins its problem's first group of the step, and lives on
the rank that holds that group (group g on rank g mod W, as the fresh prompts are split: `rank_share`), so each
replayed row is trained exactly once in the step, beside the fresh rows its advantages are normalised with. Ranks then
hold different numbers of replayed rows; the update weighs and lines them up over every rank
(`lanpo.train.consumer.update`), so that it equals one process's on the same rows. Rank 0 records the whole draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lanpo.db.connection import transaction
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import trajectories as replay_repo
from lanpo.db.repo.trajectories import Candidate
from lanpo.errors import ConfigError
from lanpo.feedback import replay_draw
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.record import GroupRecord, RolloutTokens
from lanpo.feedback.replay_config import ReplayConfig
from lanpo.feedback.store import RunRef
from lanpo.rl.advantages import group_advantages
from lanpo.rl.replay_loss import replay_advantages
from lanpo.rollout import Completion
from lanpo.train.config import TrainConfig
from lanpo.train.forward.batch import RolloutBatch, build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import Policy


@dataclass
class StepReplay:
    """This rank's R replayed rows, in the order they follow its G*n fresh rows in the batch; and the step's whole
    draw over every rank (`draws`: what rank 0 records and the metrics count)."""

    group: list[int]  # (R,) this rank's group each joins (its index among this rank's G groups)
    rows: list[Candidate]  # (R,) the stored attempts replayed
    prompt_ids: list[list[int]]  # (R,) their prompts, tokenised as the engines tokenise a prompt
    draws: list[replay_draw.ReplayDraw] = field(default_factory=list)  # per problem of the step, what it replays
    mismatched: int = 0  # stored rows left out: their tokens do not decode to their response

    @property
    def size(self) -> int:
        """This rank's replayed rows."""
        return len(self.rows)

    @property
    def total(self) -> int:
        """The step's replayed rows over every rank (the same on every rank)."""
        return sum(len(d.candidates) for d in self.draws)

    def rewards(self) -> torch.Tensor:
        """(R,) the stored rewards (RLEP, ExGRPO: verified successes; the reward is the one they were graded)."""
        return torch.tensor([float(r.reward) for r in self.rows], dtype=torch.float32)

    def behaviour(self, width: int, device: torch.device) -> torch.Tensor:
        """(R, width) the stored behaviour log-probs, right-padded with 0 (attempt_tokens' check gives every stored
        row one per token)."""
        out = torch.zeros((self.size, width), dtype=torch.float32)
        for b, row in enumerate(self.rows):
            out[b, : len(row.logprobs)] = torch.tensor(row.logprobs, dtype=torch.float32)
        return out.to(device)

    def metrics(self, step: int, fresh_tokens: int) -> dict[str, float]:
        """replay/*: how many rows and problems, their tokens, reward, accuracy and age in steps; and the update's
        cost in tokens, `cost/trained_tokens` (the fresh rollouts' completions and the replayed ones': a replayed
        row costs no generation, only its share of the update)."""
        tokens = sum(len(r.token_ids) for r in self.rows)
        cost = {"cost/trained_tokens": float(fresh_tokens + tokens), "cost/trained_tokens/replay": float(tokens)}
        if not self.rows:
            return {**dict.fromkeys(("replay/count", "replay/problems", "replay/tokens"), 0.0), **cost}
        n = float(self.size)
        return {
            **cost,
            "replay/count": n,
            "replay/problems": float(len(set(self.group))),
            "replay/tokens": float(tokens),
            "replay/reward": sum(float(r.reward) for r in self.rows) / n,
            "replay/accuracy": sum(float(bool(r.correct)) for r in self.rows) / n,
            "replay/age": sum(step - r.step for r in self.rows) / n,
            "replay/mismatched": float(self.mismatched),
        }


def check_sources(cfg: TrainConfig, run: RunRef) -> list[int]:
    """The runs whose attempts this run replays (its own by default), refusing one sampled at another temperature
    (its stored log-probs would be of another distribution) or one that does not exist."""
    if not cfg.replay.source_runs:
        return [run.run_id]
    ids = []
    with transaction(run.db) as session:
        for name in cfg.replay.source_runs:
            found = runs_repo.find_run(session, name)
            if found is None:
                raise ConfigError(f"replay.source_runs names {name!r}, which is no run", hint="see `lanpo runs`")
            temperature = (found.config or {}).get("rollout", {}).get("temperature", 1.0)
            if cfg.replay.needs_logprobs and float(temperature) != cfg.rollout.temperature:
                raise ConfigError(
                    f"run {name!r} sampled at temperature {temperature}, this one at {cfg.rollout.temperature}: its "
                    "stored log-probs are of another distribution",
                    hint="replay a run sampled at this run's rollout.temperature, or use replay.correction = none",
                )
            ids.append(found.id)
    return ids


def draw_step_replays(
    cfg: TrainConfig,
    run: RunRef,
    sources: list[int],
    policy: Policy,
    tokenizer: Any,
    step: int,
    prompts: StepPrompts,
    dist: Dist | None = None,
) -> StepReplay | None:
    """This rank's share of the stored trajectories joined to the step's groups; None with replay off. With nothing
    to replay, a replay of no rows, with which the step is, bit for bit, a step without the feature (its metrics
    aside). `dist`: the draw is the step's, over every rank's problems (see the module docstring); `sources` are
    read on rank 0 only."""
    rc, dist = cfg.replay, dist or Dist()
    if not rc.enabled:
        return None
    step_problems = global_order(dist.gather(list(prompts.problem_ids)))  # (G * W,) on rank 0, None elsewhere
    read = None
    if step_problems is not None:
        firsts = list(dict.fromkeys(step_problems))
        with transaction(run.db) as session:
            stored = replay_repo.candidates(session, sources, firsts, step, rc.successes_only, run.run_id)
            bucket = rc.problems == "bucket"
            latest = replay_repo.latest_correctness(session, sources, firsts, step, run.run_id) if bucket else {}
        read = (step_problems, stored, latest)
    step_problems, stored, latest = dist.broadcast(read)
    groups = {pid: g for g, pid in reversed(list(enumerate(step_problems)))}  # problem -> its first group
    stored, mismatched = _decodable(stored, tokenizer)
    entropy = _entropy_of(cfg, policy, tokenizer) if rc.trajectories == "lowest_entropy" else None
    draws = replay_draw.draw(list(groups), stored, latest, rc, cfg.seed, step, entropy, cfg.rollout.n)
    draws = dist.broadcast(draws)  # every rank drew the same; rank 0's is the one kept, to the last bit of entropy
    rows = rank_share([(groups[d.problem_id], c) for d in draws for c in d.candidates], dist)
    return StepReplay(
        [g for g, _ in rows],
        [c for _, c in rows],
        [tokenizer.encode(c.prompt, add_special_tokens=False) for _, c in rows],
        draws,
        mismatched,
    )


def global_order(shares: list[list[int]] | None) -> list[int] | None:
    """The step's groups in their global order from every rank's share (rank r holds groups r, r + W, ...:
    `Dist.share`); None stays None (a rank other than 0)."""
    if shares is None:
        return None
    world = len(shares)
    return [shares[g % world][g // world] for g in range(sum(len(s) for s in shares))]


def rank_share(rows: list[tuple[int, Candidate]], dist: Dist) -> list[tuple[int, Candidate]]:
    """This rank's replayed rows of the step's (global group, row) list, with the group's index among this rank's
    groups: the rows of group g go to rank g mod W, where its fresh rollouts are, as its (g div W)-th group."""
    return [(g // dist.world, c) for g, c in rows if g % dist.world == dist.rank]


def _decodable(stored: dict[int, list[Candidate]], tokenizer: Any) -> tuple[dict[int, list[Candidate]], int]:
    """The stored rows whose token ids decode to their stored response (the check that they are what was sampled);
    and how many were left out."""
    kept: dict[int, list[Candidate]] = {}
    left = 0
    for pid, rows in stored.items():
        good = [r for r in rows if tokenizer.decode(r.token_ids, skip_special_tokens=True) == r.response]
        left += len(rows) - len(good)
        if good:
            kept[pid] = good
    return kept, left


def _entropy_of(cfg: TrainConfig, policy: Policy, tokenizer: Any) -> Any:
    """ExGRPO's trajectory choice: the mean token entropy of each candidate under the current policy (no grad)."""
    from lanpo.train.forward.logprobs import completion_logprobs

    def entropy(rows: list[Candidate]) -> list[float]:
        device = next(policy.model.parameters()).device
        prompt_ids = [tokenizer.encode(r.prompt, add_special_tokens=False) for r in rows]
        batch = build_batch(prompt_ids, [r.token_ids for r in rows], tokenizer.pad_token_id, device)
        logprob_settings = LogprobSettings.from_grpo(cfg.grpo, temperature=cfg.rollout.temperature, device=device)
        with torch.no_grad():
            _, ent = completion_logprobs(policy.model, batch, True, logprob_settings)
        mask = batch.completion_mask.float()
        return ((ent * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).tolist()  # type: ignore[operator]

    return entropy


def step_advantages(rewards: torch.Tensor, n: int, replay: StepReplay | None, rc: ReplayConfig) -> torch.Tensor:
    """(G*n + R,) advantages: GRPO's alone without replayed rows; else by the correction's rule
    (lanpo.rl.replay_loss)."""
    if replay is None or not replay.size:
        return group_advantages(rewards, n)
    fresh = rewards.numel()
    index = torch.cat([torch.arange(fresh // n).repeat_interleave(n), torch.tensor(replay.group)])
    replayed = torch.cat([torch.zeros(fresh, dtype=torch.bool), torch.ones(replay.size, dtype=torch.bool)])
    return replay_advantages(torch.cat([rewards, replay.rewards()]), index, replayed, rc.correction)


def replay_batch(
    rollouts: list[Completion], replay: StepReplay, n: int, pad_token_id: int, device: torch.device
) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fresh rollouts (groups of `n`) then the replayed rows as one batch (B = G*n + R), which rows are replayed
    (B,), the replayed rows' stored behaviour log-probs (B, T; 0 on fresh rows) and the group each row belongs to
    (B,): a fresh row's own, a replayed row's the group it joins (the update's minibatches follow it)."""
    prompt_ids = [c.prompt_token_ids for c in rollouts] + replay.prompt_ids
    token_ids = [c.token_ids for c in rollouts] + [r.token_ids for r in replay.rows]
    batch = build_batch(prompt_ids, token_ids, pad_token_id, device)
    width = batch.completion_ids.shape[1]
    fresh = len(rollouts)
    replayed = torch.zeros(batch.size, dtype=torch.bool, device=device)
    replayed[fresh:] = True
    behaviour = torch.zeros((batch.size, width), dtype=torch.float32, device=device)
    behaviour[fresh:] = replay.behaviour(width, device)
    group = torch.cat([torch.arange(fresh) // n, torch.tensor(replay.group, dtype=torch.long)]).to(device)
    return batch, replayed, behaviour, group


def behaviour_rows(
    cfg: TrainConfig,
    policy: Policy,
    prompts: StepPrompts,
    rollouts: list[Completion],
    correct: list[bool],
    batch: RolloutBatch,
) -> dict[int, RolloutTokens]:
    """The fresh rollouts whose tokens and behaviour log-probs the store keeps (`replay.stores_tokens`): those of
    zero-shot groups (the replayable ones), correct ones only under `replay.successes_only`. Their log-probs are
    the engine's when it reports them, else the trainer's, taken here, before the update, under the policy that
    sampled them. Returns {flat rollout index: its tokens}."""
    rc, n = cfg.replay, cfg.rollout.n
    if not rc.stores_tokens:
        return {}
    keep = [
        i
        for i in range(len(rollouts))
        if prompts.modes[i // n] == "zero_shot" and rollouts[i].token_ids and (correct[i] or not rc.successes_only)
    ]
    if not keep:
        return {}
    if all(rollouts[i].logprobs is not None for i in keep):
        engine = {i: list(rollouts[i].logprobs or ()) for i in keep}
        return {i: RolloutTokens(list(rollouts[i].token_ids), engine[i], "engine") for i in keep}
    device = batch.input_ids.device
    logprob_settings = LogprobSettings.from_grpo(cfg.grpo, temperature=cfg.rollout.temperature, device=device)
    logp = chunked_logprobs(policy.model, batch.select(torch.tensor(keep, device=device)), logprob_settings)  # (K, T)
    return {
        i: RolloutTokens(list(rollouts[i].token_ids), logp[k, : len(rollouts[i].token_ids)].tolist(), "trainer")
        for k, i in enumerate(keep)
    }


def attach_tokens(records: list[GroupRecord], tokens: dict[int, RolloutTokens], n: int) -> None:
    """Hand each kept rollout's tokens to its record (written with it, `lanpo.feedback.record.write_step_rows`)."""
    for i, kept in tokens.items():
        records[i // n].rollouts[i % n].tokens = kept
