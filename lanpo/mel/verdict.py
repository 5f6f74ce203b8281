"""Replay validation: keep a lesson only when re-attempting the problem with it in the prompt succeeds.

Rules (`mel.validation`):
- `beats_group`: the replays' success rate is strictly above the success rate of the group the pair came from
  (the lesson must help, not merely not hurt: a lesson that leaves the policy where it was is rejected);
- `any_success`: at least one replay succeeds (the weaker reading of "the replays succeed").
"""

from __future__ import annotations

from collections.abc import Sequence


def success_rate(correct: Sequence[bool]) -> float:
    """Share of correct attempts (0.0 for none)."""
    return sum(bool(c) for c in correct) / len(correct) if correct else 0.0


def keeps(rule: str, replay_correct: Sequence[bool], group_rate: float) -> bool:
    """Whether `rule` keeps a lesson whose replays were graded `replay_correct`, from a group at `group_rate`."""
    if rule == "beats_group":
        return success_rate(replay_correct) > group_rate
    if rule == "any_success":
        return any(replay_correct)
    raise ValueError(f"unknown validation rule {rule!r}; expected beats_group or any_success")
