"""LANPO's language feedback from a lanpo store inside TRL's `GRPOTrainer` (the extra `lanpo[trl]`; docs/trl.md).

A TRL user keeps their trainer, its loss, clipping and KL, and adds three hooks that `TRLStore` hands out:

    store = TRLStore(load_config("train/configs/demo-cpu.toml"))
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=store.dataset(),
                          reward_funcs=store.reward(my_reward), rollout_func=store.rollout_func,
                          callbacks=[store.callback])

- `rollout_func(prompts, trainer)`: TRL hands it this process's prompts, each repeated `num_generations` times
  in a row (one group per problem). Per group it draws the mode (`feedback.p_t`, from its own seeded generator,
  never torch's or Python's) and, for intra / inter, the contexts from the store through `lanpo.feedback` (the
  same SQL, leakage rules and truncate-never-drop fitting as lanpo's trainer). A zero-shot group keeps the user's
  own prompt, rendered as TRL renders it; then TRL's own generation (`GRPOTrainer._generate_single_turn`, the one
  private method used: `generate`, or its vLLM mode) makes one completion per entry. TRL trains on the prompt ids
  returned, so a contexted prompt is the trained prompt (LANPO's objective).
- `reward(*funcs, weights=...)`: one reward function that sums the user's (TRL logs it as `rewards/lanpo`),
  then writes the step's groups back exactly as lanpo's trainer records them (prompt, context rows, completions,
  rewards, policy version, summaries of the successful rollouts under the same admission rules and capacity
  policies) and the step's metrics, in ONE transaction that commits the step. Evaluation rollouts are served
  zero-shot and not written.
- `callback`: opens the run before step 1 (after every check: a refused start writes nothing), sets `p_t` for
  each step, ties each TRL checkpoint to the store's step, and on `resume_from_checkpoint` rolls the store back to
  the checkpoint's step, so a step TRL replays is recorded once.

The store's step is TRL's `global_step + 1` at generation time: the optimizer step the rollouts train. One process
only for now (`accelerate launch` with more is refused before training).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine

from lanpo import feedback_modes
from lanpo.errors import ConfigError, InputError
from lanpo.feedback.client import StoreClient
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.lifecycle import Run
from lanpo.feedback.schedule import choose_modes
from lanpo.feedback.summarize import Summary
from lanpo.integrations.trl_callback import StoreCallback
from lanpo.integrations.trl_checks import TRAINER, check_layout, whole_groups
from lanpo.models.hashing import state_sha256
from lanpo.rewards import Graded
from lanpo.rollout import Completion, GenerationBackend
from lanpo.seeds import mix_seed

log = logging.getLogger(__name__)

__all__ = ["ID_KEY", "TRAINER", "TRLStore"]

ID_KEY = "lanpo_problem_id"  # the key, in a prompt's messages, naming its problem in the store
USER_PROMPT = "trl-user"  # rollout_groups.prompt_version of a zero-shot group: the user's own prompt, TRL-rendered
# TRL's log names -> lanpo's, for `lanpo report`'s figures (KL, entropy and clip fraction; loss and optimiser)
TRL_METRICS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio/region_mean": "clip_frac",
    "frac_reward_zero_std": "groups/zero_spread",
}
RESUME_HINT = "resume it (trainer.train(resume_from_checkpoint=...)) or set run_name to a new name"
CALL = "lanpo_call"  # the extra field rollout_func passes to the reward function: which call's prompts these are


@dataclass
class _Call:
    """What one rollout_func call drew, kept until its reward call writes it back."""

    step: int
    prompts: StepPrompts  # per group: problem, mode, context items, the stored prompt text
    prompt_ids: list[list[int]]  # per entry (G*n), the trained prompt
    n: int
    p_t: float


def refuse_trainer_only(config: Any) -> None:
    """A lanpo recipe whose method or tables need lanpo's own update is refused before anything is written: MEL
    (a second loss on the meta-experiences) and [replay] (stored rows with earlier policies' log-probs)."""
    if getattr(config, "method", None) == "mel":
        raise ConfigError(
            "the recipe is MEL: its NLL term on the meta-experiences is a second loss, and GRPOTrainer computes "
            "one loss over the completions its rollout_func returns",
            hint="run MEL with lanpo train; on TRL use a LANPO or GRPO recipe (docs/trl.md)",
        )
    if getattr(getattr(config, "replay", None), "enabled", False):
        raise ConfigError(
            "the recipe enables [replay]: replayed rows are stored trajectories with earlier policies' behaviour "
            "log-probs, and GRPOTrainer trains only the completions its rollout_func returns for the step's prompts",
            hint="run replay with lanpo train (docs/configuration.md, [replay]); on TRL set replay.enabled = false",
        )


class TRLStore:
    """A lanpo run whose rollouts a TRL `GRPOTrainer` makes and trains on: the rollout function, the reward wrapper
    and the callback that connect it to the store.

    `config` is a lanpo training config (`lanpo.train.config.load_config`) or a `lanpo.feedback.StoreRunConfig`;
    this reads its run_name, seed, `[data]` (the problems, generated from reasoning-gym when `data.task` is set),
    `[feedback]`, `[summarizer]`, `[store]`, `[reward]` and `rollout.max_prompt_tokens`. TRL owns the rest (model,
    steps, batch, sampling, the loss). `p_t`: a constant, or a schedule step -> p_t (default: `feedback.p_t`).
    Without `engine`, the store of `LANPO_HOME` / `LANPO_DATABASE_URL` (a fresh one is migrated); either must be at
    the schema's head revision, else `lanpo db upgrade` says the error.
    """

    def __init__(
        self, config: Any, db: Engine | None = None, p_t: float | Callable[[int], float] | None = None
    ) -> None:
        refuse_trainer_only(config)
        self.client = StoreClient(config, db)  # the store, the problems and the relevance, checked
        self.config, self.cfg, self.db = config, self.client.cfg, self.client.db
        fixed = self.cfg.feedback.p_t if p_t is None else p_t
        self.p_t_of: Callable[[int], float] = fixed if callable(fixed) else (lambda _step: float(fixed))
        self.problem_ids, self.scorer = self.client.problem_ids, self.client.scorer
        problems = list(self.client.problems.values())
        self._known = {p.id for p in problems}
        self._by_question: dict[str, int | None] = {}
        for p in problems:  # a question asked twice in the dataset names no one problem
            self._by_question[p.question] = None if p.question in self._by_question else p.id
        self._problems = {p.id: p for p in problems}
        self.run: Run | None = None
        self.p_t = self.p_t_of(1)
        self.callback = StoreCallback(self)
        self._calls: dict[int, _Call] = {}
        self._call_ids = count()
        self._trainer: Any = None
        self._summarizer: tuple[GenerationBackend, Any] | None = None
        self._pending: tuple[dict[str, Any], int, str] | None = None  # what begin() checked, for _open()

    # ------------------------------------------------------------------ the dataset

    def dataset(self) -> Any:
        """The store's problems of `data.dataset` as a TRL dataset: `prompt` (lanpo's zero-shot chat prompt, each
        message naming its problem under `ID_KEY`), `answer` (the gold answer, for reward functions only: it never
        reaches a prompt) and `ID_KEY`."""
        from datasets import Dataset

        rows = []
        for pid in self.problem_ids:
            p = self._problems[pid]
            messages = feedback_modes.build_messages("zero_shot", p.question)
            rows.append({"prompt": [{**m, ID_KEY: pid} for m in messages], "answer": p.answer, ID_KEY: pid})
        return Dataset.from_list(rows)

    def tag(self, dataset: Any, id_column: str = "id") -> Any:
        """A user's conversational dataset with each prompt's messages naming its problem: `id_column` holds the
        external id the problem was imported under (`lanpo data import`) into `data.dataset`."""
        ids = {p.external_id: p.id for p in self._problems.values()}

        def named(row: dict[str, Any], index: int) -> dict[str, Any]:
            key = str(row[id_column])
            if key not in ids:
                raise InputError(
                    f"row {index} of the dataset has {id_column} = {key!r}, which dataset "
                    f"{self.cfg.data.dataset!r} of the store does not hold",
                    hint=f"import the problems first: lanpo data import FILE --dataset {self.cfg.data.dataset}",
                )
            if isinstance(row["prompt"], str):
                raise InputError(
                    "tag() names problems in conversational prompts (lists of messages)",
                    hint="give it a prompt column of messages, or string prompts equal to the stored questions",
                )
            return {"prompt": [{**m, ID_KEY: ids[key]} for m in row["prompt"]]}

        return dataset.map(named, with_indices=True)

    def problem_of(self, prompt: Any) -> int:
        """The store's id of the problem a prompt asks: named in its messages (`ID_KEY`), or a string prompt equal
        to exactly one stored question. InputError for any other: never served zero-shot in silence."""
        if isinstance(prompt, str):
            pid = self._by_question.get(prompt)
        else:
            named = [m.get(ID_KEY) for m in prompt if isinstance(m, dict) and m.get(ID_KEY) is not None]
            pid = int(named[-1]) if named else None
        if pid is None or pid not in self._known:
            shown = prompt if isinstance(prompt, str) else (prompt[-1].get("content") if prompt else "")
            raise InputError(
                f"a prompt names no problem of dataset {self.cfg.data.dataset!r} in the store: {str(shown)[:80]!r}",
                hint=f"build the dataset with TRLStore.dataset() or TRLStore.tag(ds, id_column=...); messages name "
                f"their problem under {ID_KEY!r}",
            )
        return pid

    # ------------------------------------------------------------------ the rollout function

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's `rollout_func`: this process's prompts (each repeated num_generations times in a row) ->
        prompt ids (a feedback group's carry its context), one completion each, and which call drew them."""
        self._trainer = trainer
        funcs = list(getattr(trainer, "reward_funcs", []))
        if len(funcs) != 1 or getattr(funcs[0], "lanpo_store", None) is not self:
            raise ConfigError(
                "GRPOTrainer's reward_funcs must be this store's reward wrapper alone: it writes the rewards TRL "
                "trains on, and another function beside it would make the stored rewards differ",
                hint="reward_funcs=store.reward(f1, f2, weights=[...]) wraps all of yours",
            )
        self._open()
        training = trainer.model.training
        n = trainer.num_generations if training else trainer.num_generations_eval
        user_ids = user_prompt_ids(trainer, prompts)  # the user's own prompts, as plain TRL renders them
        if not training:  # evaluation: the user's prompts, zero-shot, not written back
            completion_ids, logprobs = trainer._generate_single_turn(user_ids, None, {}, n)
            return {
                "prompt_ids": user_ids,
                "completion_ids": completion_ids,
                "logprobs": logprobs,
                CALL: [-1] * len(prompts),
            }
        groups = whole_groups(prompts, n)
        step = trainer.state.global_step + 1
        pids = [self.problem_of(prompts[g * n]) for g in range(groups)]
        fb = self.cfg.feedback
        rank_seed = mix_seed(self.cfg.seed, "trl-modes", trainer.accelerator.process_index)
        asked = choose_modes(pids, fb.mode, self.p_t, rank_seed, step)  # numpy's own seeded generator
        tokenizer = trainer.processing_class
        drawn = self.client.prompts(self.run, step, pids, tokenizer, policy_sha256=self._served(trainer), asked=asked)
        prompt_ids: list[list[int]] = []
        for g in range(groups):
            if drawn.modes[g] == "zero_shot":  # asked for none, or got none: the user's prompt, untouched
                ids = list(user_ids[g * n])
                drawn.texts[g] = tokenizer.decode(ids, skip_special_tokens=False)
            else:
                ids = tokenizer(drawn.texts[g], add_special_tokens=False)["input_ids"]
            prompt_ids.extend([list(ids)] * n)
        completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, n)
        call = next(self._call_ids)
        self._calls[call] = _Call(step, drawn, prompt_ids, n, self.p_t)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": logprobs,
            CALL: [call] * len(prompts),
        }

    # ------------------------------------------------------------------ the reward function

    def _served(self, trainer: Any) -> str:
        """The sha256 of the weights as they are now, which generate this step: the policy version of step - 1."""
        return policy_sha256(trainer.accelerator.unwrap_model(trainer.model))

    def reward(self, *funcs: Callable[..., Sequence[float | None]], weights: Sequence[float] | None = None) -> Any:
        """One TRL reward function: the weighted sum of `funcs` (TRL reward functions, called as TRL calls them),
        then the step written back to the store. Pass it alone as `reward_funcs`."""
        if not funcs:
            raise ConfigError("TRLStore.reward needs at least one reward function", hint="store.reward(my_reward)")
        w = [1.0] * len(funcs) if weights is None else [float(x) for x in weights]
        if len(w) != len(funcs):
            raise ConfigError(f"{len(funcs)} reward functions and {len(w)} weights", hint="give one weight each")

        def lanpo(
            prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **kwargs: Any
        ) -> list[float]:
            calls = kwargs.pop(CALL)
            totals = [0.0] * len(completions)
            for f, weight in zip(funcs, w, strict=True):
                got = f(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
                totals = [t + weight * (math.nan if v is None else float(v)) for t, v in zip(totals, got, strict=True)]
            self._write_back(calls, completion_ids, totals)
            return totals

        lanpo.lanpo_store = self  # type: ignore[attr-defined]  (rollout_func checks TRL was given this one)
        return lanpo

    def _write_back(self, calls: list[int], completion_ids: list[list[int]], totals: list[float]) -> None:
        """The call's groups, their summaries and the step's metrics, in one transaction that commits the step."""
        if not calls or calls[0] < 0:  # evaluation
            return
        assert self.run is not None and self._trainer is not None
        call = self._calls.pop(calls[0])
        drawn, n, tokenizer = call.prompts, call.n, self._trainer.processing_class
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        eos = set(self._trainer.eos_token_ids)
        rollouts = [
            Completion(text, tuple(ids), tuple(prompt), "stop" if ids and ids[-1] in eos else "length")
            for text, ids, prompt in zip(texts, completion_ids, call.prompt_ids, strict=True)
        ]
        groups = [rollouts[g * n : (g + 1) * n] for g in range(len(drawn.problem_ids))]
        graded = self.client.grade(drawn, groups, totals)  # the user's reward, lanpo's correctness and format
        summaries = self._summaries(call.step, drawn, groups, graded)
        zero_shot = {g: USER_PROMPT for g, mode in enumerate(drawn.modes) if mode == "zero_shot"}
        metrics = {"feedback/p_t": call.p_t}
        self.client.record(self.run, call.step, drawn, groups, graded, summaries, metrics, zero_shot)

    def _summaries(
        self, step: int, drawn: StepPrompts, groups: list[list[Completion]], graded: list[Graded]
    ) -> dict[int, Summary]:
        """Lessons of the successful rollouts, as lanpo's trainer writes them; generated with torch's RNG state
        saved and restored, and the model in eval mode, so TRL's own sampling and training go on unchanged."""
        if not self.cfg.wants_lessons():
            return {}
        backend, tokenizer = self._summary_writer()
        model = self._trainer.model
        was_training = model.training
        with torch.random.fork_rng(), torch.no_grad():
            model.eval()
            try:
                return self.client.lessons(step, drawn, groups, graded, backend, tokenizer)
            finally:
                model.train(was_training)

    def _summary_writer(self) -> tuple[GenerationBackend, Any]:
        """What writes the lessons: the model being trained (`summarizer.model = policy`, through transformers
        generate), or the model it names, loaded once."""
        if self._summarizer is None:
            from lanpo.models import load_causal_lm
            from lanpo.rollout import make_backend

            name, trainer = self.cfg.summarizer.model, self._trainer
            if name == "policy":
                model, tokenizer = trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class
            else:
                model_cfg = getattr(self.config, "model", None)  # a lanpo TrainConfig's [model]: its dtype and device
                dtype = getattr(model_cfg, "dtype", "auto")
                device = getattr(model_cfg, "device", "auto")
                model, tokenizer = load_causal_lm(name, dtype=dtype, device=None if device == "auto" else device)
            self._summarizer = (make_backend("hf", model, tokenizer), tokenizer)
        return self._summarizer

    # ------------------------------------------------------------------ the run's life, from the callback

    def begin(self, args: Any, state: Any, model: Any, dataset: Any) -> None:
        """Before step 1 (the callback's on_train_begin): refuse what cannot be served, writing nothing. The run
        opens at the first rollout call (`_open`), once the trainer's own hooks are checked too."""
        check_layout(args)
        if dataset is not None and hasattr(dataset, "__len__") and "prompt" in getattr(dataset, "column_names", []):
            for prompt in dataset["prompt"]:
                self.problem_of(prompt)  # raises on the first prompt the store cannot name
        model_name = _model_name(model)
        step = state.global_step  # TRL's checkpoint step on a resume, else 0
        self.client.check_open(model_name, trainer=TRAINER, resume=step > 0, after=step, resume_hint=RESUME_HINT)
        self.run = None
        self._pending = (_trl_args(args), step, model_name)

    def _open(self) -> Run:
        """The run opened through the store API in one transaction: created with its pool, or (a resume from TRL's
        step c) its rows after c rolled back and the run reopened; then held with a heartbeat."""
        if self.run is not None:
            return self.run
        if self._pending is None:
            raise ConfigError(
                "TRLStore.rollout_func ran before its callback checked the trainer",
                hint="pass callbacks=[store.callback] to GRPOTrainer",
            )
        trl_args, step, model_name = self._pending
        self.run = self.client.open(
            model_name, trl_args, trainer=TRAINER, resume=step > 0, after=step, resume_hint=RESUME_HINT
        )
        self.run.hold()
        return self.run

    def saved(self, step: int, folder: Path) -> None:
        """TRL saved its checkpoint of `step`: the store's step names it (rows of later steps roll back on resume)."""
        if self.run is not None:
            self.run.name_checkpoint(step, str(folder))

    def logged(self, step: int, logs: dict[str, Any]) -> None:
        """TRL's logs of its optimizer step `step` (the one that trained the store's step `step`), in run_metrics:
        under lanpo's names where `lanpo report` draws them (`TRL_METRICS`), every number also as trl/<name>."""
        if self.run is None or not any(isinstance(v, (int, float)) for v in logs.values()):
            return
        metrics = {f"trl/{k}": float(v) for k, v in logs.items() if isinstance(v, (int, float))}
        metrics.update(
            {ours: metrics[f"trl/{theirs}"] for theirs, ours in TRL_METRICS.items() if f"trl/{theirs}" in metrics}
        )
        self.run.record_metrics(step, metrics)

    def end(self, failed: bool = False) -> None:
        if self.run is not None:
            self.run.finish(failed)


def user_prompt_ids(trainer: Any, prompts: list[Any]) -> list[list[int]]:
    """The user's prompts as plain TRL 1.16 tokenises them (`GRPOTrainer._tokenize_prompts`, text prompts without
    environments): a conversation through the processing class's chat template with the trainer's own template,
    tools and template arguments; a string as it is."""
    tokenizer = trainer.processing_class
    if isinstance(prompts[0], str):
        return list(tokenizer(text=prompts)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        conversation=prompts,
        tools=trainer.tools or None,  # TRL's `or None`: a Llama template renders tool boilerplate for tools=[]
        chat_template=trainer.chat_template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **trainer.chat_template_kwargs,
    )
    return [list(ids) for ids in rendered["input_ids"]]


def _model_name(model: Any) -> str:
    """The model a TRL run trains (runs.model): its folder or hub id, else its class (a model built from a config)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model: the model under it
    return str(getattr(getattr(base, "config", None), "_name_or_path", None) or type(base).__name__)


def _trl_args(args: Any) -> dict[str, Any]:
    """The TRL settings a run's config keeps (what shaped its rollouts and update)."""
    keys = (
        "num_generations",
        "per_device_train_batch_size",
        "steps_per_generation",
        "gradient_accumulation_steps",
        "max_completion_length",
        "temperature",
        "top_p",
        "beta",
        "epsilon",
        "epsilon_high",
        "loss_type",
        "learning_rate",
        "max_steps",
        "seed",
        "use_vllm",
        "vllm_mode",
    )
    out = {}
    for key in keys:
        value = getattr(args, key, None)
        out[key] = value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
    return out


def policy_sha256(model: Any) -> str:
    """The hash of the weights that generate: a PEFT model's adapter, else every weight."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a lanpo dependency
        PeftModel = ()
    if isinstance(model, PeftModel):
        from lanpo.models.hashing import adapter_sha256

        return adapter_sha256(model)
    return state_sha256(model.state_dict())
