"""What a step works on, reproducibly: the problems of each step, and which prompts ask for feedback.

Everything here is a pure function of (seed, step): a resumed run sees the same batches and modes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lanpo.feedback_modes import SETTING_MODES
from lanpo.seeds import mix_seed


def batch_problem_ids(all_ids: Sequence[int], batch_size: int, seed: int, step: int) -> list[int]:
    """The problems of `step` (1-based): epochs of seeded permutations, so a resumed run sees the same batches."""
    n = len(all_ids)
    out = []
    for i in range((step - 1) * batch_size, step * batch_size):
        epoch, pos = divmod(i, n)
        order = np.random.default_rng(mix_seed(seed, "epoch", epoch)).permutation(n)
        out.append(int(all_ids[order[pos]]))
    return out


def choose_modes(problem_ids: Sequence[int], mode: str, p_t: float, seed: int, step: int) -> list[str]:
    """Per problem: a feedback mode with probability p_t (intra / inter, or either for `both`), else zero_shot."""
    rng = np.random.default_rng(mix_seed(seed, "modes", step))
    out = []
    for _ in problem_ids:
        use_feedback = rng.random() < p_t
        pick_inter = rng.random() < 0.5
        asks = SETTING_MODES[mode]  # (), one context mode, or both (intra, inter)
        out.append((asks[-1] if pick_inter else asks[0]) if asks and use_feedback else "zero_shot")
    return out
