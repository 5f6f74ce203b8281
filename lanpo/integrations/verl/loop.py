"""The `lanpo` agent loop: one verl sample with its group's feedback context drawn from lanpo's store.

verl instantiates an agent loop per sample (`verl.experimental.agent_loop.AgentLoopWorker._run_agent_loop`). This
one asks the process's group draw (`lanpo.integrations.verl.process.DRAWS`: the group's n samples share one draw,
as the paper gives one context per prompt) for the group's mode and contexts. A zero-shot group runs verl's own
single-turn loop unchanged (so with p_t = 0 the prompt and response ids are verl's); a contexted one generates from
lanpo's rendered prompt, fitted to verl's prompt length, with log-probs, through verl's server manager. The returned
`prompt_ids` are what verl trains on, so a contexted prompt is trained as LANPO's objective wants. With
`lanpo.reward = lanpo` the sample's reward is lanpo's (correctness plus the format bonus of its mode), else verl's
reward function scores it.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.utils.profiler import simple_timer

from lanpo.errors import InputError
from lanpo.integrations.verl.process import DRAWS, process_store, run_id_of
from lanpo.integrations.verl.store import GroupPrompt, VerlStore


def problem_id_of(row: dict[str, Any]) -> int:
    """The store's problem id a dataset row names (`extra_info.problem_id`: `lanpo data export --format verl`)."""
    extra = row.get("extra_info") or {}
    found = extra.get("problem_id") if isinstance(extra, dict) else None
    if found is None:
        raise InputError(
            "a verl dataset row names no lanpo problem (extra_info.problem_id)",
            hint="export the training set from the store: lanpo data export DATASET --format verl --out FILE",
        )
    return int(found)


@register("lanpo")
class LanpoAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn loop, with the group's feedback context from lanpo's store."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        store = process_store(self.config, run_id_of(self.config))
        step, uid = int(kwargs["global_steps"]), str(kwargs["uid"])
        pid = problem_id_of(kwargs)
        drawn = await DRAWS.get(step, uid, lambda: asyncio.to_thread(store.draw, step, pid, self.tokenizer))
        if drawn.text is None:
            output = await super().run(sampling_params, **kwargs)
        else:
            output = await self._generate(drawn.text, sampling_params)
        output.extra_fields["lanpo_problem_id"] = pid
        output.extra_fields["lanpo_mode"] = drawn.mode
        output.extra_fields["lanpo_contexts"] = _context_ids(drawn)
        if store.settings.reward == "lanpo":
            self._grade(store, drawn, output)
        return output

    async def _generate(self, text: str, sampling_params: dict[str, Any]) -> AgentLoopOutput:
        """One response to lanpo's rendered prompt (already a chat turn: tokenized as is), with its log-probs."""
        prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        metrics: dict[str, Any] = {}
        with simple_timer("generate_sequences", metrics):
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=dict(sampling_params)
            )
        metrics["num_preempted"] = out.num_preempted if out.num_preempted is not None else -1
        response = list(out.token_ids)[: self.response_length]
        logprobs = list(out.log_probs)[: len(response)] if out.log_probs else None
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response,
            response_mask=[1] * len(response),
            response_logprobs=logprobs,
            num_turns=2,
            metrics=metrics,
            extra_fields=dict(out.extra_fields),
        )
        output.extra_fields.update({"turn_scores": [], "tool_rewards": []})
        return output

    def _grade(self, store: VerlStore, drawn: GroupPrompt, output: AgentLoopOutput) -> None:
        text = self.tokenizer.decode(output.response_ids, skip_special_tokens=True)
        graded = store.grade(drawn, [text])[0]
        output.reward_score = graded.reward
        output.extra_fields["reward_extra_info"] = {"acc": float(graded.correct), "format": float(graded.format_ok)}


def _context_ids(drawn: GroupPrompt) -> list[str]:
    """The context rows in the prompt, in order: `intra:<attempt id>` or `inter:<experience version id>`."""
    refs = [item.ref(pos) for pos, item in enumerate(drawn.prompts.items[0])]
    return [
        f"intra:{r.context_attempt_id}" if r.context_attempt_id is not None else f"inter:{r.experience_version_id}"
        for r in refs
    ]
