"""MEL, meta-experience learning: lessons from contrastive pairs of one GRPO group, validated by replay and trained
into the weights with an NLL term next to the GRPO objective.

Pure pieces live here (which pairs, where a pair bifurcates, the verdict rule, the templates, the config); the
trainer's phase that runs them on a step is `lanpo.train.mel.experiences`, and the store's side `lanpo.db.repo.meta`.
"""
