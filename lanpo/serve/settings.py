"""What `lanpo serve` was started with: its options, and the defaults a request may override."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lanpo.inference.config import RetrievalSettings, SamplingSettings
from lanpo.serve.learn import LearnPolicy


@dataclass
class ServeSettings:
    """What `lanpo serve` was started with (its options), and the defaults a request may override."""

    model: str
    served_name: str
    backend: str
    mode: str
    retrieval: RetrievalSettings
    sampling: SamplingSettings
    max_tokens_limit: int = 4096
    max_question_tokens: int = 4096
    max_body_bytes: int = 1 << 20
    max_pending: int = 256
    run_name: str = "serve"
    learn: LearnPolicy = field(default_factory=LearnPolicy)  # off: no pool learns from its traffic
    engine_stats: bool = False  # vllm: the scheduler's stats each step, for /health's peak_running (costs ~2 %)

    def config(self) -> dict[str, Any]:
        """The serving run's config in the store."""
        return {
            "model": self.model,
            "served_name": self.served_name,
            "backend": self.backend,
            "mode": self.mode,
            "retrieval": asdict(self.retrieval),
            "sampling": asdict(self.sampling),
            "max_tokens_limit": self.max_tokens_limit,
            "learn": "on" if self.learn.pools is None else sorted(self.learn.pools) or "off",
        }
