"""The arms `lanpo experiment` knows by name: recipe overrides (dotted keys) on the recipe every arm shares.

Pure data (no store, no torch): GRPO, LANPO's three feedback settings, MEL, the paper's Fig. 2 failure modes and the
replay arms. None is a default of anything but `grpo` and `lanpo-both` of an experiment's `arms`.
"""

from __future__ import annotations

# Each arm names its method, so that a recipe written for one method (e.g. a MEL recipe) serves every arm.
_GRPO = {"method": "grpo", "feedback.mode": "none", "feedback.p_t": 0.0}

DEFAULT_ARMS = {
    "grpo": dict(_GRPO),
    # The null arm: GRPO with its reference and update forwards in float32 (grpo.autocast "auto" is bf16 where bf16
    # matmuls pay). The same method with other rounding: its runs part from GRPO's within a step or two, so its
    # difference to GRPO is how far two runs of one method land apart, the yardstick for any other arm's.
    "grpo-fp32": {**_GRPO, "grpo.autocast": "off"},
    "lanpo-intra": {"method": "lanpo", "feedback.mode": "intra"},
    "lanpo-inter": {"method": "lanpo", "feedback.mode": "inter"},
    "lanpo-both": {"method": "lanpo", "feedback.mode": "both"},
    # LANPO-both with lessons on probation (issue 64): inter lessons ranked by value, those known to hurt never
    # drawn, and retired once their lift's interval lies below 0 (the demo's settings; docs/concepts.md).
    "lanpo-both-value": {
        "method": "lanpo",
        "feedback.mode": "both",
        "feedback.inter.rank": "value",
        "store.retire_below": 0.0,
    },
    # The same with the value rule's prior centred on the pool's graded lessons' mean lift (empirical Bayes,
    # migration 0025): where the lessons tried so far hurt, an untried one is not presumed to help.
    "lanpo-both-value-pool": {
        "method": "lanpo",
        "feedback.mode": "both",
        "feedback.inter.rank": "value",
        "feedback.inter.prior": "pool",
        "store.retire_below": 0.0,
    },
    # The same with the intra gate (lanpo.feedback.intra_gate): the run's own earlier attempts served only while its
    # intra groups are not known to do worse than its zero-shot ones (the value rule on the mode's lift).
    "lanpo-both-value-gate": {
        "method": "lanpo",
        "feedback.mode": "both",
        "feedback.inter.rank": "value",
        "feedback.intra.gate": "value",
        "store.retire_below": 0.0,
    },
    # The same with the intra gate by Thompson sampling: each prompt that asks for intra served it with the
    # posterior chance that intra helps (half of them while untried), so a run pays less to learn that it hurts.
    "lanpo-both-value-thompson": {
        "method": "lanpo",
        "feedback.mode": "both",
        "feedback.inter.rank": "value",
        "feedback.intra.gate": "thompson",
        "store.retire_below": 0.0,
    },
    "mel": {"method": "mel", "feedback.mode": "none", "feedback.p_t": 0.0},
    # The paper's Fig. 2 failure modes, to be compared, never a default. 2b: "We provided the correct answer to the
    # same training problem during rollouts, akin to rejection fine-tuning (RFT)".
    "leaked-intra": {"method": "lanpo", "feedback.mode": "leaked-intra"},
    # 2c: "reuse correct trajectories discovered during training as in-context demonstrations for other problems,
    # either by random sampling or by selecting similar problems": raw rollouts, no lessons.
    "naive-inter-random": {
        "method": "lanpo",
        "feedback.mode": "inter",
        "feedback.inter.draw": "random",
        "feedback.inter.shows": "response",
        "summarizer.enabled": False,  # the random draw reads attempts, never a lesson
    },
    "naive-inter-similar": {"method": "lanpo", "feedback.mode": "inter", "feedback.inter.shows": "response"},
    # Replay of stored trajectories beside GRPO's fresh rollouts (`[replay]`, lanpo.train.replay; docs/papers.md).
    # RLEP (arXiv 2507.07451): 2 verified successes drawn at random join each group, trained as on-policy.
    "rlep": {**_GRPO, "replay.enabled": True, "replay.correction": "none", "replay.per_group": 2},
    # ExGRPO (arXiv 2510.02245): half the problems with a stored success, by correctness bucket (fully solved ones
    # retired), each with its lowest-entropy success, under w / (w + 0.1) against the behaviour log-probs.
    "exgrpo": {
        **_GRPO,
        "replay.enabled": True,
        "replay.correction": "shaped",
        "replay.per_group": 1,
        "replay.share": 0.5,
        "replay.problems": "bucket",
        "replay.trajectories": "lowest_entropy",
    },
    # RePO (arXiv 2506.09340): the newest stored attempts, right or wrong, with their own advantages and their own
    # clipped term against the behaviour log-probs.
    "repo": {
        **_GRPO,
        "replay.enabled": True,
        "replay.correction": "separate",
        "replay.per_group": 2,
        "replay.successes_only": False,
        "replay.trajectories": "recent",
    },
}
