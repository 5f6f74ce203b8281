"""What the answerer returns: turns, samples and solutions, each with the record `lanpo infer` writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lanpo.db.repo.problems import Question


@dataclass(frozen=True)
class Turn:
    """One generated turn: the exact prompt text, the response and its grade (None when there is no gold)."""

    prompt: str
    response: str
    prompt_version: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    answer: str | None
    correct: bool | None
    reward: float | None
    format_ok: bool
    served_adapter_sha256: str | None = None  # the adapter that answered (None: the base model)

    def to_record(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class UsedExperience:
    """An experience version put into a retrieval prompt, with its stage-1 score and LLM relevance."""

    experience_version_id: int
    source_problem_id: int
    summary: str
    stage1_score: float
    relevance: float | None

    def to_record(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Sample:
    """One of the k samples; self-correct samples have two turns, the last one answers."""

    turns: list[Turn]

    @property
    def final(self) -> Turn:
        return self.turns[-1]

    def to_record(self) -> dict[str, Any]:
        final = self.final
        return {
            "answer": final.answer,
            "correct": final.correct,
            "reward": final.reward,
            "turns": [t.to_record() for t in self.turns],
        }


@dataclass
class Solution:
    """A question's k samples in one mode, the experiences used (retrieval) and why it fell back, if it did."""

    question: Question
    mode: str
    samples: list[Sample]
    experiences: list[UsedExperience] = field(default_factory=list)
    fallback: str | None = None

    @property
    def mean_correct(self) -> float | None:
        """Fraction of samples whose final answer is correct (None without a gold answer): mean@k for one problem."""
        graded = [s.final.correct for s in self.samples if s.final.correct is not None]
        return sum(graded) / len(graded) if graded else None

    def to_record(self) -> dict[str, Any]:
        q = self.question
        return {
            "id": q.external_id,
            "problem_id": q.problem_id,
            "question": q.question,
            "gold": q.answer,
            "mode": self.mode,
            "mean_correct": self.mean_correct,
            "answers": [s.final.answer for s in self.samples],
            "fallback": self.fallback,
            "experiences": [e.to_record() for e in self.experiences],
            "samples": [s.to_record() for s in self.samples],
        }
