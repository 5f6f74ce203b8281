"""The test-time answerer: zero-shot, retrieval-augmented and self-correction answers (paper 4.3).

- `zero_shot`: the actor prompt, k samples.
- `retrieval`: experiences retrieved from the current pool (stage 1 -> LLM rerank -> gamma -> top m, see
  `lanpo.retrieval.testtime`) go into the inter-sample prompt. Retrieval runs once per question; its k samples
  share the prompt. When the pool is empty, or nothing reaches gamma for a question, that question is answered
  with the zero-shot prompt; the solution's `fallback` says why and the answerer says so on stderr.
- `self_correct`: a two-turn conversation per sample (paper 4.3). Turn 1 is a zero-shot attempt; turn 2 continues
  the same chat: the first answer as the assistant's message, then a fixed, reward-agnostic reflection request as
  the user's message (`prompts.REFLECT`), and its answer is the sample's answer. Nothing of turn 1's grade reaches
  turn 2: the request is a constant, and only the first response's text is read.
- `self_correct_single`: the older single-turn variant: turn 2 is a fresh intra-sample reflection prompt (the one
  the policy was trained with) over the first attempt's text.

Prompts are built from the question and from model-written text (earlier responses, experience summaries) only:
the gold answer, rewards and relevance scores never reach a prompt (tested as a property). Answers are the last
`\\boxed{}` of the final turn; a question without a gold answer is answered but not graded.

This module loads the policy (hf or vllm backend), its relevance judge and the pool retrieval reads; the modes are
in `lanpo.inference.modes`, the result types in `lanpo.inference.results`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lanpo.db.repo.pools import PoolRow
from lanpo.db.repo.problems import Question
from lanpo.errors import ConfigError, InputError
from lanpo.inference.config import RetrievalSettings, SamplingSettings, normalise_mode
from lanpo.inference.io import question_id
from lanpo.inference.modes import EMPTY_POOL, NOTHING_RELEVANT, answer_batch
from lanpo.inference.results import Sample, Solution, Turn, UsedExperience
from lanpo.models import apply_chat
from lanpo.rollout import GenerationBackend, SamplingParams
from lanpo.rollout.config import VLLMConfig

# The result types and the modes live in `results` and `modes`; their names stay importable from here.
__all__ = ["EMPTY_POOL", "NOTHING_RELEVANT", "Answerer", "Sample", "Solution", "Turn", "UsedExperience"]

log = logging.getLogger(__name__)

Retriever = Callable[..., Sequence[Any]]  # the signature of `lanpo.retrieval.testtime.retrieve`


def _stderr(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)


class Answerer:
    """Answers questions with a policy (base model, optionally with a LoRA adapter) in one of three modes.

    `model` is a name or path (`smollm2`, a HF folder, a cached hub id) or an already loaded HF model, in
    which case `tokenizer` is required. `db` (the database) is needed for retrieval only. With the vllm
    backend one vLLM engine (settings: `vllm`) answers and judges relevance; `dtype`, when not auto, overrides
    `vllm.dtype`. `close()` ends the vLLM engine's processes.
    """

    def __init__(
        self,
        model: str | Any,
        adapter: str | Path | None = None,
        backend: str = "hf",
        *,
        tokenizer: Any = None,
        model_id: str | None = None,
        dtype: str | None = None,
        device: str | None = None,
        sampling: SamplingSettings | None = None,
        retrieval: RetrievalSettings | None = None,
        db: Any = None,
        batch_size: int = 8,
        notify: Callable[[str], None] = _stderr,
        retriever: Retriever | None = None,
        backend_options: dict[str, Any] | None = None,
        vllm: VLLMConfig | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.sampling = sampling or SamplingSettings()
        self.retrieval = retrieval or RetrievalSettings()
        self.db = db
        self.batch_size = batch_size
        self.notify = notify
        self._retriever = retriever
        self._rater: Any = None
        self._pool: PoolRow | None = None
        self.adapter = Path(adapter).expanduser() if adapter is not None else None
        if self.adapter is not None and not (self.adapter / "adapter_config.json").is_file():
            from lanpo.models import model_folder

            if (model_folder(self.adapter) / "config.json").is_file():
                raise InputError(
                    f"{self.adapter} holds a whole model (a full fine-tuning checkpoint), not a LoRA adapter",
                    hint=f"pass it as the model: --model {self.adapter}",
                )
            what = "does not exist" if not self.adapter.exists() else "holds no PEFT adapter (adapter_config.json)"
            raise InputError(f"adapter folder {self.adapter} {what}", hint="pass a folder written by the trainer")
        self.backend_name = backend
        self._check_before_loading(model, device, backend)
        options = dict(backend_options or {})
        if isinstance(model, str):
            self.model_id = model_id or model
        else:
            if tokenizer is None:
                raise ConfigError("an in-memory model needs its tokenizer (Answerer(model, tokenizer=...))")
            self.model_id = model_id or str(getattr(model.config, "name_or_path", "") or "in-memory")
        self.adapter_sha256: str | None = None
        self.start_sha256: str | None = None  # the start adapter merged into the base under the adapter, if any
        if backend == "hf":
            self._init_hf(model, tokenizer, dtype, device, options)
        elif backend == "vllm":
            if not isinstance(model, str):
                raise ConfigError("the vllm backend loads the model itself: pass its name or folder, not a model")
            self._init_vllm(model, dtype, vllm or VLLMConfig())
        else:
            raise ConfigError(f"unknown backend {backend!r}", hint="use hf or vllm")

    # ------------------------------------------------------------------ setup

    def _check_before_loading(self, model: str | Any, device: str | None, backend: str) -> None:
        """What a typo can break, refused before a model loads (minutes for a large one)."""
        from lanpo.models import check_device, check_model_ref

        if isinstance(model, str):
            check_model_ref(model)
        if self.retrieval.judge not in ("policy", "none"):
            check_model_ref(self.retrieval.judge, "retrieval judge")
        check_device(device)
        if backend == "vllm" and isinstance(model, str):  # an in-memory model is refused below, vLLM or not
            from lanpo.rollout.vllm import import_vllm

            import_vllm()

    def _init_hf(self, model: Any, tokenizer: Any, dtype: str | None, device: str | None, options: dict) -> None:
        from lanpo.models import adapter_sha256, load_adapter_stack, load_causal_lm, prepare_tokenizer
        from lanpo.rollout.hf import HFBackend

        if isinstance(model, str):
            model, tokenizer = load_causal_lm(model, dtype=dtype, device=device)
        tokenizer = prepare_tokenizer(tokenizer)
        if self.adapter is not None:
            model, self.start_sha256 = load_adapter_stack(model, self.adapter)  # its SFT start merged in first
            self.adapter_sha256 = adapter_sha256(model)
        model.eval()
        self.model, self.tokenizer = model, tokenizer
        options.setdefault("max_batch", max(8, self.batch_size * 4))
        self.backend: GenerationBackend = HFBackend(model, tokenizer, **options)

    def _init_vllm(self, model: str, dtype: str | None, config: VLLMConfig) -> None:
        from dataclasses import replace

        from lanpo.rollout.vllm import VLLMBackend

        if dtype not in (None, "auto"):
            config = replace(config, dtype=dtype)
        self.model = None
        backend = VLLMBackend(model, None, config, enable_lora=self.adapter is not None)
        self.tokenizer = backend.tokenizer
        if self.adapter is not None:
            self.adapter_sha256 = backend.set_adapter(self.adapter)
        self.backend = backend

    def close(self) -> None:
        """End the vLLM engine's processes; an HF model is left to the garbage collector."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    @property
    def judge_model_id(self) -> str:
        """The model id the policy is known by as a relevance judge (adapter hash included: other weights, other
        scores); its scorer is `"<judge_model_id>|<prompt version>"`."""
        start = f"+{self.start_sha256[:12]}" if self.start_sha256 else ""
        suffix = f"+{self.adapter_sha256[:12]}" if self.adapter_sha256 else ""
        return f"{self.model_id}{start}{suffix}"

    def rater(self) -> Any:
        """The loaded relevance judge for retrieval (built on first use); None when `retrieval.judge = "none"`."""
        judge = self.retrieval.judge
        if judge == "none":
            return None
        if self._rater is None:
            from lanpo.retrieval.judge import HFJudge, load_judge

            if judge == "policy" and self.backend_name == "vllm":  # the vLLM engine that answers also judges
                from lanpo.retrieval.vllm_judge import VLLMJudge

                self._rater = VLLMJudge(self.backend, model_id=self.judge_model_id)
            elif judge == "policy" and self.model is not None:
                self._rater = HFJudge(self.model, self.tokenizer, model_id=self.judge_model_id)
            else:
                self._rater = load_judge(self.model_id if judge == "policy" else judge)
        return self._rater

    # ------------------------------------------------------------------ solving

    def render(self, messages: list[dict[str, str]]) -> str:
        """Messages -> the prompt text, in the model's chat template."""
        return apply_chat(self.tokenizer, messages)

    def solve(
        self,
        questions: Sequence[Question | str],
        mode: str,
        k_samples: int = 1,
        *,
        on_batch: Callable[[list[Solution]], None] | None = None,
    ) -> list[Solution]:
        """Answer every question `k_samples` times in `mode`; `on_batch(solutions)` after each batch (to store it)."""
        mode = normalise_mode(mode)
        if k_samples < 1:
            raise ConfigError(f"k_samples must be >= 1, got {k_samples}")
        items = [q if isinstance(q, Question) else Question(question_id(q), q) for q in questions]
        pool_empty = False
        if mode == "retrieval":
            pool_empty = self.active_experiences() == 0
            if pool_empty:
                self.notify(f"retrieval: {EMPTY_POOL} ({len(items)} question(s))")
        solutions: list[Solution] = []
        for index, start in enumerate(range(0, len(items), self.batch_size)):
            chunk = items[start : start + self.batch_size]
            params = self._params(index)
            batch = answer_batch(self, mode, chunk, k_samples, params, pool_empty)
            solutions.extend(batch)
            if on_batch is not None:
                on_batch(batch)
        if mode == "retrieval" and not pool_empty:
            missed = sum(1 for s in solutions if s.fallback)
            if missed:
                self.notify(
                    f"retrieval: {missed} of {len(solutions)} question(s) had no experience at relevance "
                    f">= {self.retrieval.gamma} and were answered zero-shot"
                )
        return solutions

    def _params(self, batch_index: int) -> SamplingParams:
        s = self.sampling
        seed = None if s.seed is None else s.seed + batch_index  # a fresh stream per batch, still reproducible
        # no token log-probs: an answer is stored as text and counts (lanpo.inference.modes.grade_turn)
        return SamplingParams(
            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed, logprobs=False
        )

    # ------------------------------------------------------------------ retrieval

    def pool(self) -> PoolRow:
        """The experience pool retrieval reads (`retrieval.pool`, else the store's only pool), looked up once."""
        if self._pool is None:
            from lanpo.db.connection import transaction
            from lanpo.db.repo.pools import resolve_pool

            with transaction(self._require_db()) as session:
                self._pool = resolve_pool(session, self.retrieval.pool)
        return self._pool

    def active_experiences(self) -> int:
        """Active experiences in the pool retrieval reads (retrieval needs the database)."""
        from lanpo.db.connection import transaction
        from lanpo.db.repo.pools import active_size

        pool = self.pool()
        with transaction(self._require_db()) as session:
            return active_size(session, pool.id)

    def _require_db(self) -> Any:
        if self.db is None:
            raise ConfigError("retrieval mode reads the experience pool: the answerer needs a database (db=...)")
        return self.db

    def retrieve(self, chunk: Sequence[Question]) -> list[list[UsedExperience]]:
        """Experiences for each question (its own problem's experiences excluded when it is a stored problem)."""
        from lanpo.db.connection import transaction

        if self._retriever is None:
            from lanpo.retrieval.testtime import retrieve

            self._retriever = retrieve
        r = self.retrieval
        rater = self.rater()
        pool = self.pool()
        with transaction(self._require_db()) as session:
            return [experiences_for(session, self._retriever, q, pool.id, r, rater) for q in chunk]


def experiences_for(
    session: Any, retriever: Retriever, q: Question, pool_id: int, r: RetrievalSettings, rater: Any
) -> list[UsedExperience]:
    """The experiences retrieval puts in `q`'s prompt (its own problem's excluded when it is a stored problem)."""
    hits = retriever(
        session,
        q.question,
        pool_id=pool_id,
        stage1=r.stage1,
        top_k=r.top_k,
        gamma=r.gamma,
        m=r.m,
        rater=rater,
        problem_id=q.problem_id,
        ranking=r.ranking,
    )
    return [
        UsedExperience(
            int(h.experience_version_id),
            int(h.source_problem_id),
            h.summary,
            float(h.stage1_score),
            None if h.relevance is None else float(h.relevance),
        )
        for h in hits
        if q.problem_id is None or h.source_problem_id != q.problem_id
    ]
