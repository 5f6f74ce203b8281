"""`lanpo sft data`: SFT pairs for the three atomic skills, written by a teacher model and kept only when verified.

The paper starts RL from a model fine-tuned on 3K pairs a strong teacher wrote for the skills LANPO's prompts
ask for. Here the teacher is any HF model (or the vLLM backend), or an OpenAI-compatible chat endpoint; per
problem of a stored dataset it writes:

1. a zero-shot solution (the actor prompt): never a pair itself; a correct one is the material of skill 2;
2. summarisation: the summary prompt over its own *verified-correct* solution -> a lesson under the summary headers;
3. inspection / reflection: the intra prompt over its own first solution (right or wrong: reward-agnostic) -> a
   review and a new solution, kept when the new solution is correct and carries the intra headers;
4. response with feedback: the inter prompt with lessons the teacher wrote for *other* problems -> relevance,
   plan and solution, kept when the solution is correct and carries the inter headers.

Every prompt is built from the question and model-written text only, exactly as in training: the gold answer is
read after generation, to grade. Each kept pair carries its provenance: the teacher, the skill, the template
versions, the time, the problem, and the filter's verdicts.
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from lanpo import prompts
from lanpo.errors import InputError
from lanpo.rewards import is_correct
from lanpo.rollout import SamplingParams

Message = dict[str, str]
TEMPLATE_VERSION = "sft-data-v1"  # this module's recipe for building pairs
SKILLS = ("summary", "reflection", "feedback")


class Teacher(Protocol):
    name: str

    def chat(self, conversations: Sequence[list[Message]], params: SamplingParams) -> list[str]:
        """One reply per conversation."""
        ...


class BackendTeacher:
    """A local teacher: a model behind one of lanpo's generation backends (HF generate, vLLM)."""

    def __init__(self, name: str, backend: Any, tokenizer: Any) -> None:
        self.name, self.backend, self.tokenizer = name, backend, tokenizer

    def chat(self, conversations: Sequence[list[Message]], params: SamplingParams) -> list[str]:
        from lanpo.models import apply_chat

        texts = [apply_chat(self.tokenizer, c) for c in conversations]
        return [group[0].text for group in self.backend.generate(texts, 1, params)] if texts else []


def load_teacher(name: str, backend: str = "hf", dtype: str | None = None, device: str | None = None) -> Teacher:
    """A local teacher model by name or folder (`smollm2`, `tiny-random`, a HF folder or cached hub id)."""
    from lanpo.models import load_causal_lm, prepare_tokenizer
    from lanpo.rollout import make_backend

    if backend == "vllm":
        from transformers import AutoTokenizer

        from lanpo.models import resolve_model
        from lanpo.rollout.vllm import VLLMBackend

        path = resolve_model(name)
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
        return BackendTeacher(name, VLLMBackend(path, tokenizer), tokenizer)
    model, tokenizer = load_causal_lm(name, dtype=dtype, device=device)
    tokenizer = prepare_tokenizer(tokenizer)
    return BackendTeacher(name, make_backend("hf", model.eval(), tokenizer), tokenizer)


class EndpointTeacher:
    """An OpenAI-compatible chat endpoint (`POST {url}/chat/completions`), with plain urllib and a few threads."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 600.0, workers: int = 8):
        if not url.startswith(("http://", "https://")):
            raise InputError(f"--url {url!r} is not an http(s) URL", hint="e.g. --url http://localhost:8000/v1")
        self.url = url.rstrip("/") + "/chat/completions"
        self.name, self.api_key, self.timeout, self.workers = model, api_key, timeout, workers

    def _one(self, messages: list[Message], params: SamplingParams) -> str:
        body = {
            "model": self.name,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read().decode("utf-8"))
            return str(reply["choices"][0]["message"]["content"] or "")
        except urllib.error.HTTPError as exc:
            hint = "check --url, --teacher (the model name it serves) and the API key"
            raise InputError(f"the endpoint {self.url} answered {exc.code} {exc.reason}", hint=hint) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise InputError(f"cannot reach {self.url}: {exc}", hint="is the server running at --url?") from exc
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise InputError(f"{self.url} did not answer like an OpenAI chat completion: {exc!r}") from exc

    def chat(self, conversations: Sequence[list[Message]], params: SamplingParams) -> list[str]:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(lambda c: self._one(c, params), conversations))


@dataclass(frozen=True)
class SourceProblem:
    """A problem to write pairs for: `ref` names it (dataset:external_id); `answer` is read only to grade."""

    ref: str
    question: str
    answer: str


@dataclass
class PairReport:
    pairs: list[dict[str, Any]] = field(default_factory=list)
    generated: Counter[str] = field(default_factory=Counter)  # replies written, by skill
    kept: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)  # "<skill>/incorrect", "<skill>/headers"


def _pair(messages: list[Message], reply: str, skill: str, teacher: str, problem: str, verdicts: dict) -> dict:
    versions = {
        "summary": prompts.SUMMARY_VERSION,
        "reflection": prompts.INTRA_VERSION,
        "feedback": prompts.INTER_VERSION,
    }
    return {
        "messages": [*messages, {"role": "assistant", "content": reply}],
        "provenance": {
            "teacher": teacher,
            "skill": skill,
            "template_version": {"pairs": TEMPLATE_VERSION, "prompt": versions[skill]},
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "problem": problem,
            "verdicts": verdicts,
        },
    }


def _judge(report: PairReport, skill: str, reply: str, gold: str | None, headers: Sequence[str]) -> dict | None:
    """The filter: the skill's headers, and (when graded) a correct final answer; None when rejected."""
    report.generated[skill] += 1
    # a summary must be a lesson the pool would admit (its three parts, each with words of its own), not an echo
    headed = prompts.has_summary_format(reply) if skill == "summary" else prompts.has_headers(reply, headers)
    verdicts = {"headers": headed}
    if gold is not None:
        verdicts["correct"] = is_correct(reply, gold)
        if not verdicts["correct"]:
            report.rejected[f"{skill}/incorrect"] += 1
            return None
    if not verdicts["headers"]:
        report.rejected[f"{skill}/headers"] += 1
        return None
    return verdicts


def _keep(report: PairReport, target: dict[str, int], pair: dict[str, Any]) -> None:
    skill = pair["provenance"]["skill"]
    if report.kept[skill] < target[skill]:
        report.pairs.append(pair)
        report.kept[skill] += 1


def generate_pairs(
    teacher: Teacher,
    problems: Sequence[SourceProblem],
    n: int,
    params: SamplingParams,
    seed: int = 0,
    batch_size: int = 16,
    lessons_per_prompt: int = 2,
) -> PairReport:
    """Up to `n` verified pairs, split evenly over the three skills, in one pass over `problems` (shuffled)."""
    if n < 1:
        raise InputError(f"--n must be >= 1, got {n}")
    rng = random.Random(seed)
    order = list(problems)
    rng.shuffle(order)
    target = {skill: n // 3 + (1 if i < n % 3 else 0) for i, skill in enumerate(SKILLS)}
    report = PairReport()
    lessons: list[tuple[str, str]] = []  # (problem ref, lesson) of problems seen so far
    for start in range(0, len(order), batch_size):
        if all(report.kept[s] >= target[s] for s in SKILLS):
            break
        chunk = order[start : start + batch_size]
        # 1. first solutions (zero-shot), graded after the fact
        firsts = teacher.chat([prompts.actor_messages(p.question) for p in chunk], params)
        # 2. summaries of the verified-correct ones
        solved = [(p, r) for p, r in zip(chunk, firsts, strict=True) if is_correct(r, p.answer)]
        asks = [prompts.summary_messages(p.question, r) for p, r in solved]
        for (p, _), messages, reply in zip(solved, asks, teacher.chat(asks, params), strict=True):
            verdicts = _judge(report, "summary", reply, None, prompts.SUMMARY_HEADERS)
            if verdicts is not None:
                lessons.append((p.ref, reply))
                verdicts["source_correct"] = True  # the solution it summarises was verified
                _keep(report, target, _pair(messages, reply, "summary", teacher.name, p.ref, verdicts))
        # 3. reflection over the teacher's own first attempt (reward-agnostic: right or wrong alike)
        asks = [prompts.intra_messages(p.question, [prompts.Attempt(r)]) for p, r in zip(chunk, firsts, strict=True)]
        for p, messages, reply in zip(chunk, asks, teacher.chat(asks, params), strict=True):
            verdicts = _judge(report, "reflection", reply, p.answer, prompts.INTRA_HEADERS)
            if verdicts is not None:
                _keep(report, target, _pair(messages, reply, "reflection", teacher.name, p.ref, verdicts))
        # 4. response with lessons from other problems
        fed, asks = [], []
        for p in chunk:
            others = [text for ref, text in lessons if ref != p.ref]
            if others:
                picked = rng.sample(others, min(lessons_per_prompt, len(others)))
                fed.append(p)
                asks.append(prompts.inter_messages(p.question, [prompts.Lesson(t) for t in picked]))
        for p, messages, reply in zip(fed, asks, teacher.chat(asks, params), strict=True):
            verdicts = _judge(report, "feedback", reply, p.answer, prompts.INTER_HEADERS)
            if verdicts is not None:
                _keep(report, target, _pair(messages, reply, "feedback", teacher.name, p.ref, verdicts))
    return report
