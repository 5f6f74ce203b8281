"""The store's client layer: what any trainer needs from a lanpo store, below every trainer and knowing none.

lanpo's trainer (`lanpo.train`), the TRL adapter (`lanpo.integrations.trl`) and a trainer lanpo does not know
(docs/api.md) all call it:

- `draw`: the samplers bound to the context modes of the pure mode table (`lanpo.feedback_modes`);
- `schedule`: the seeded choices of a step (its problems, which prompts ask for feedback);
- `contexts`: prompts with contexts drawn for a batch of problems and fitted, truncated never dropped;
- `summarize`: which successful rollouts become lessons, and their admission rules;
- `record`: a step's groups and lessons (capacity policies enforced), and its metrics;
- `store`: a run's reference, and what a run reads before any model loads (problems, relevance);
- `config`: the tables these read (`[data]`, `[feedback]`, `[summarizer]`, `[reward]`; `[store]` is
  `lanpo.config.StoreConfig`);
- `lifecycle`: a run's life, one copy for every trainer: open or resume (one transaction, serialised against a
  concurrent opener), group writes under the step's lesson cap, step commits, named checkpoints, rollback;
- `client`: `StoreClient`, the calls a trainer makes, in order.

`StoreClient`, `Run`, `StoreRunConfig`, `load_store_config` and `open_store`, exported here, are the public API
(docs/api.md).
"""

from lanpo.db.connection import open_store
from lanpo.feedback.client import StoreClient
from lanpo.feedback.config import (
    DataConfig,
    FeedbackConfig,
    InterConfig,
    RewardConfig,
    StoreRunConfig,
    SummarizerConfig,
    load_store_config,
)
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.lifecycle import Run
from lanpo.feedback.store import RunRef

__all__ = [
    "DataConfig",
    "FeedbackConfig",
    "InterConfig",
    "RewardConfig",
    "Run",
    "RunRef",
    "StepPrompts",
    "StoreClient",
    "StoreRunConfig",
    "SummarizerConfig",
    "load_store_config",
    "open_store",
]
