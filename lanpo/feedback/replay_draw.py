"""The replay draw: which of a step's problems get stored trajectories, and which of each problem's trajectories.

Pure given its inputs and seed (no store, no torch): the caller reads the candidates and the problems' latest
correctness with `lanpo.db.repo.trajectories` and records what is drawn with `record_replays`. One `random.Random`
seeded `mix_seed(seed, "replay", step)` draws the problems, then each chosen problem's trajectories in the step's
order.

Problems (`ReplayConfig.problems`):
- `any`: every problem of the step with a candidate is eligible; `share` of them (rounded half up, at least 1 when
  any is eligible) are drawn uniformly without replacement (RLEP draws for every prompt: share = 1).
- `bucket` (ExGRPO, arXiv 2510.02245; its sampler read in ElliottYan/LUFFY, `ExGRPO/exgrpo/verl/verl/mix_src/
  experience/weighted_bucket_sampler.py` and `experience_helpers.py::sample_experience_uids`): a problem sits in the
  bucket of its latest number of successes k (its latest correctness x `group_size`, the rollouts of a group);
  problems whose latest correctness is 1.0 are retired (never drawn; ExGRPO's `skip_uid_set`). A bucket weighs
  ExGRPO's `exp_bucket_manager = "normal"` mapping,

      def _normal_mapping(x, rollout):
          mu = rollout / 2
          sigma = 1
          ...
          return coeff * np.exp(exponent)          # exponent = -((x - mu) ** 2) / (2 * sigma**2)

  a Gaussian over k centred at half the group with a width of one success (`BUCKET_SIGMA`), so the middle is
  favoured; a problem is drawn by drawing a bucket in proportion to its weight, then a problem in it uniformly.
  Departure: ExGRPO draws every bucket's count at once (`np.random.multinomial`) and moves a count a bucket cannot
  fill to the others; lanpo draws one problem at a time, the bucket among those not yet emptied (the same
  preference, and exact probabilities a test can enumerate). A problem with candidates but no known latest
  correctness is not eligible under `bucket`.

Trajectories (`ReplayConfig.trajectories`), `per_group` of a chosen problem's candidates (fewer when fewer):
`random` uniformly without replacement; `recent` the newest by (step, attempt id); `lowest_entropy` the lowest
values of the caller's `entropy(candidates)` (the mean token entropy under the current policy, ExGRPO), ties by the
newest.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lanpo.db.repo.trajectories import Candidate
from lanpo.feedback.replay_config import ReplayConfig
from lanpo.seeds import mix_seed

BUCKET_SIGMA = 1.0  # ExGRPO's "normal" bucket weight: its width, in successes of a group
RETIRED = 1.0  # a problem whose latest correctness reaches this is retired under problems = bucket

Entropy = Callable[[list[Candidate]], list[float]]


@dataclass(frozen=True)
class ReplayDraw:
    """One problem's replayed trajectories at a step (what `lanpo.db.repo.trajectories.record_replays` writes)."""

    problem_id: int
    candidates: list[Candidate]


def bucket_weight(successes: int, group_size: int, sigma: float = BUCKET_SIGMA) -> float:
    """The weight of the bucket of `successes` of `group_size`: ExGRPO's Gaussian centred at group_size / 2
    (unnormalised: its coefficient cancels in the draw)."""
    return math.exp(-((successes - group_size / 2) ** 2) / (2.0 * sigma**2))


def bucket_of(correctness: float, group_size: int) -> int:
    """The number of successes a latest correctness stands for in a group of `group_size`."""
    return round(correctness * group_size)


def count_of(share: float, eligible: int) -> int:
    """How many of `eligible` problems get replays: share * eligible rounded half up, at least 1 when any."""
    return 0 if eligible == 0 else max(1, min(eligible, math.floor(share * eligible + 0.5)))


def choose_problems(
    rng: random.Random,
    problem_ids: Sequence[int],
    candidates: Mapping[int, Sequence[Candidate]],
    latest: Mapping[int, float],
    config: ReplayConfig,
    group_size: int,
    sigma: float = BUCKET_SIGMA,
) -> list[int]:
    """The step's problems that get replays, in the step's order (see the module docstring)."""
    step_order = list(dict.fromkeys(problem_ids))  # a problem drawn twice in a batch is replayed once
    eligible = [p for p in step_order if candidates.get(p)]
    if config.problems != "bucket":
        chosen = set(rng.sample(eligible, count_of(config.share, len(eligible))))
        return [p for p in eligible if p in chosen]
    if group_size < 2:
        raise ValueError(f"problems = bucket needs the group size (rollout.n >= 2), got {group_size}")
    eligible = [p for p in eligible if p in latest and latest[p] < RETIRED]
    buckets: dict[int, list[int]] = {}
    for p in eligible:
        buckets.setdefault(bucket_of(latest[p], group_size), []).append(p)
    chosen = set()
    for _ in range(count_of(config.share, len(eligible))):
        keys = sorted(k for k, left in buckets.items() if left)
        weights = [bucket_weight(k, group_size, sigma) for k in keys]
        [key] = rng.choices(keys, weights)  # one rng.random() against the cumulative weights
        chosen.add(buckets[key].pop(rng.randrange(len(buckets[key]))))
    return [p for p in eligible if p in chosen]


def choose_trajectories(
    rng: random.Random, cands: Sequence[Candidate], config: ReplayConfig, entropy: Entropy | None = None
) -> list[Candidate]:
    """`per_group` of one problem's candidates (fewer when fewer), by `config.trajectories`."""
    k = min(config.per_group, len(cands))
    newest = sorted(cands, key=lambda c: (c.step, c.attempt_id), reverse=True)
    if config.trajectories == "random":
        return rng.sample(list(cands), k)
    if config.trajectories == "recent":
        return newest[:k]
    if entropy is None:
        raise ValueError("replay.trajectories = lowest_entropy needs the caller's entropy function")
    values = entropy(newest)
    if len(values) != len(newest):
        raise ValueError(f"entropy gave {len(values)} values for {len(newest)} candidates")
    order = sorted(range(len(newest)), key=lambda i: (values[i], i))  # ties: the newer first
    return [newest[i] for i in order[:k]]


def draw(
    problem_ids: Sequence[int],
    candidates: Mapping[int, Sequence[Candidate]],
    latest: Mapping[int, float],
    config: ReplayConfig,
    seed: int,
    step: int,
    entropy: Entropy | None = None,
    group_size: int = 0,
    sigma: float = BUCKET_SIGMA,
) -> list[ReplayDraw]:
    """The step's replays: the problems chosen, then each one's trajectories, in the step's order. `candidates`
    from `lanpo.db.repo.trajectories.candidates`, `latest` from `latest_correctness` (read by `problems = bucket`),
    `entropy` only for `trajectories = lowest_entropy` (called once per chosen problem), `group_size` (the rollouts
    of a group, `rollout.n`) only for `problems = bucket`. Same inputs and seed, same draws."""
    rng = random.Random(mix_seed(seed, "replay", step))
    chosen = choose_problems(rng, problem_ids, candidates, latest, config, group_size, sigma)
    return [ReplayDraw(p, choose_trajectories(rng, candidates[p], config, entropy)) for p in chosen]
