"""lanpo's agent loop manager and worker for verl's V1 trainer: the store opened before any worker starts, each
step begun before its rollouts, and each finished group written back in one transaction.

verl's `AgentLoopWorkerTQ._run_prompt` (verl/trainer/ppo/v1/agent_loop_tq.py) runs a prompt's n sessions and
publishes the group's status only after every session settles; each session's `_agent_loop_postprocess` scores it
and puts it into TransferQueue. The worker here writes the group back when its last session is scored, before the
status is published, so the trainer never trains on a group the store has not recorded. verl defines the worker
`@ray.remote`, so it subclasses the undecorated class, and `AgentLoopManagerTQ.__init__` sets its worker class, so
the manager is subclassed too (selected by `actor_rollout_ref.rollout.agent.agent_loop_manager_class`).
Validation prompts run verl's own single-turn loop and are not recorded.

verl's asynchronous modes (`trainer.v1.trainer_mode` colocate_async, separate_async) run with lanpo's sampler
(`lanpo.integrations.verl.sampler`), which records the step each group trains in or is dropped at: each group is
written under its verl uid (a group re-issued after a resume replaces the killed run's row) with the weights that
generated each response's first and last segments (`min_global_steps`, `max_global_steps` under partial rollout).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import uuid4

import ray
from omegaconf import OmegaConf, open_dict
from tensordict import NonTensorData, NonTensorStack
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from lanpo.errors import ConfigError, InputError, listing
from lanpo.feedback.summarize import choose_candidates
from lanpo.integrations.verl import loop as _loop  # registers the `lanpo` agent loop in every worker process
from lanpo.integrations.verl.process import DRAWS, process_store, run_id_of, set_driver_store
from lanpo.rollout import Completion, SamplingParams

log = logging.getLogger(__name__)
VALIDATION_LOOP = "single_turn_agent"  # verl's own loop: validation is verl's, zero-shot, and not recorded


class LanpoAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """verl's TransferQueue agent loop worker, writing each finished group back to the store."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.store = process_store(config, run_id_of(config))
        self.sessions: dict[str, dict[int, AgentLoopOutput]] = {}  # uid -> session id -> its scored output
        self.expected: dict[str, int] = {}  # uid -> n

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        uid = str(prompt["uid"])
        if trajectory["validate"]:
            prompt["agent_name"] = VALIDATION_LOOP
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        self.expected[uid] = int(prompt.get("__rollout_n__", self.config.actor_rollout_ref.rollout.n))
        self.sessions[uid] = {}
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        finally:
            self.sessions.pop(uid, None)
            self.expected.pop(uid, None)
            DRAWS.forget(int(prompt["global_steps"]), uid)

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        uid = str(kwargs["uid"])
        if validate or uid not in self.sessions:
            return
        outputs = output if isinstance(output, list) else [output]
        if not outputs:
            return
        group = self.sessions[uid]
        group[int(kwargs["session_id"])] = outputs[-1]
        if len(group) == self.expected[uid]:
            step = int(kwargs["global_steps"])
            drawn = DRAWS.forget(step, uid)
            if drawn is None:
                raise RuntimeError(f"group {uid} of step {step} finished without its draw")
            loop = asyncio.get_running_loop()
            await asyncio.to_thread(self._write_back, step, uid, drawn, [group[i] for i in sorted(group)], loop)

    def _write_back(
        self, step: int, uid: str, drawn: Any, outputs: list[AgentLoopOutput], loop: asyncio.AbstractEventLoop
    ) -> None:
        """The group in one transaction: prompt, contexts, completions, rewards, step, policy version, lessons."""
        tokenizer = self.tokenizer
        prompt_ids = list(outputs[0].prompt_ids)
        prompt_text = drawn.text if drawn.text is not None else tokenizer.decode(prompt_ids)
        length = self.config.actor_rollout_ref.rollout.response_length
        completions = [_completion(tokenizer, prompt_ids, list(o.response_ids), length) for o in outputs]
        rewards = [float("nan") if o.reward_score is None else float(o.reward_score) for o in outputs]
        graded = self.store.client.grade(drawn.prompts, [completions], rewards)
        summaries = {}
        left = self.store.lessons_left(step) if self.store.cfg.wants_lessons() else 0
        if left != 0:
            backend = ServerBackend(self.llm_client, tokenizer, loop)
            summaries = self.store.client.lessons(
                step, drawn.prompts, [completions], graded, backend, tokenizer, choose=_capped(left)
            )
        segments = [(o.extra_fields.get("min_global_steps"), o.extra_fields.get("max_global_steps")) for o in outputs]
        self.store.write_group(step, drawn, prompt_text, completions, graded, summaries, uid, segments)


def _capped(left: int) -> Any:
    """lanpo's choice of lessons (`choose_candidates`), within the `left` the step may still add (-1: no limit)."""

    def choose(candidates: list[Any], per_problem: int, total: int) -> list[Any]:
        return choose_candidates(candidates, per_problem, total if left < 0 else left)

    return choose


def _completion(tokenizer: Any, prompt_ids: list[int], response_ids: list[int], max_tokens: int) -> Completion:
    ended = bool(response_ids) and response_ids[-1] == tokenizer.eos_token_id
    finish = "length" if len(response_ids) >= max_tokens and not ended else "stop"
    text = tokenizer.decode(response_ids, skip_special_tokens=True)
    return Completion(text, tuple(response_ids), tuple(prompt_ids), finish)


class ServerBackend:
    """lanpo's GenerationBackend over verl's server manager: the lessons a worker writes, sampled by the policy's
    servers. Called from the write-back thread while the worker's event loop serves the requests."""

    def __init__(self, client: Any, tokenizer: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.tokenizer, self.loop = client, tokenizer, loop

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        async def one(prompt: str) -> list[Completion]:
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            sampling = {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": -1,
                "max_tokens": params.max_new_tokens,
                "logprobs": False,
            }
            if params.stop:
                sampling["stop"] = list(params.stop)
            if params.seed is not None:
                sampling["seed"] = int(params.seed)
            outs = await asyncio.gather(
                *[self.client.generate(uuid4().hex, prompt_ids=ids, sampling_params=dict(sampling)) for _ in range(n)]
            )
            return [_completion(self.tokenizer, ids, list(o.token_ids), params.max_new_tokens) for o in outs]

        async def every() -> list[list[Completion]]:
            return list(await asyncio.gather(*[one(p) for p in prompts]))

        return asyncio.run_coroutine_threadsafe(every(), self.loop).result()


class LanpoAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent loop manager with lanpo's store: the run is opened (or resumed) and every check on
    the store, the recipe and the model runs here, before any worker starts; each step is begun before dispatch."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        require_v1(config)
        store = process_store(config)
        run = store.open_run(OmegaConf.to_container(config, resolve=True))  # kept as runs.config.verl
        with open_dict(config):
            config.lanpo.run_id = run.run_id
        super().__init__(config, *args, **kwargs)
        self.agent_loop_workers_class = ray.remote(LanpoAgentLoopWorker)
        self.store = store
        set_driver_store(store)  # where verl's trainer, in this process, records what each step trains and drops

    def generate_sequences(self, prompts: Any) -> None:
        if not _field(prompts, "validate", default=False)[0]:
            step = int(_field(prompts, "global_steps")[0])
            self._check_rows(prompts)
            self.store.begin_step(step)
            self.store.dispatch([str(uid) for uid in _field(prompts, "uid")])
        return super().generate_sequences(prompts)

    def _check_rows(self, prompts: Any) -> None:
        """Every row names a problem of the run's dataset, before any of them is dispatched."""
        known = self.store.client.problems
        for extra in _field(prompts, "extra_info", default=None):
            pid = _loop.problem_id_of({"extra_info": extra})
            if pid not in known:
                raise InputError(
                    f"a verl dataset row names problem {pid}, which is not in dataset {self.store.cfg.data.dataset!r}",
                    hint="export the training set of this recipe's dataset: lanpo data export --format verl",
                )


SAMPLER_PATH = "pkg://lanpo.integrations.verl.sampler"
SAMPLER_NAME = "LanpoReplayBuffer"
SAMPLER_FILE = "lanpo/integrations/verl/sampler.py"  # the same module given as a file path
ASYNC_MODES = ("colocate_async", "separate_async")


def require_v1(config: Any) -> None:
    """verl's V1 trainer, in sync mode (a step's groups all finish before the next step is dispatched) or in an
    asynchronous one with lanpo's replay buffer as its sampler (which records what each step trains and drops,
    and commits the step). The legacy trainer expects a manager that returns its batch."""
    trainer = config.trainer
    if not trainer.get("use_v1", True):
        raise ConfigError(
            "lanpo's agent loop manager runs under verl's V1 trainer, not the legacy trainer",
            hint="set trainer.use_v1=true (verl's default)",
        )
    v1 = trainer.get("v1", {})
    mode = v1.get("trainer_mode", "sync")
    if mode == "sync":
        return
    if mode not in ASYNC_MODES:
        raise ConfigError(f"unknown trainer.v1.trainer_mode={mode}", hint=f"one of {listing(('sync', *ASYNC_MODES))}")
    sampler = (v1.get("sampler", {}) or {}).get("custom_sampler", {}) or {}
    path = str(sampler.get("path") or "")
    if sampler.get("name") != SAMPLER_NAME or not (path == SAMPLER_PATH or path.endswith(SAMPLER_FILE)):
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode} trains and drops groups in verl's sampler, which must be lanpo's to "
            "record them",
            hint=f"set trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH} "
            f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
        )


def _field(batch: Any, key: str, default: Any = ...) -> list[Any]:
    """A TensorDict field as one value per row (a non-tensor field may be one value for all)."""
    if key not in batch:
        if default is ...:
            raise KeyError(key)
        return [default] * len(batch)
    value = batch.get(key)
    if isinstance(value, NonTensorStack):
        return list(value.tolist())
    if isinstance(value, NonTensorData):
        return [value.data] * max(len(batch), 1)
    return list(value)
