"""Seeds that a resumed run draws again: one stable integer from the parts that name a draw.

Every seeded draw in lanpo (a step's problems, its modes, contexts, rollouts, the update's shuffles, summaries,
validation, replay) names itself by parts such as `(seed, "contexts", step)` and seeds its generator with
`mix_seed` of them, so the same parts give the same draw in any process and any run.
"""

from __future__ import annotations

import hashlib


def mix_seed(*parts: int | str) -> int:
    """A stable 63-bit seed from parts (Python's hash() is salted per process; this is not)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
