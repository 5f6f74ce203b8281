"""lanpo: LANPO (arXiv 2510.16552) with a Postgres + pgvector experience store.

Rollouts are kept and distilled into natural-language experiences; a GRPO trainer draws
intra-sample (own earlier attempts) and inter-sample (relevant lessons from other problems)
feedback contexts from the store, and a test-time answerer answers with or without them.
"""

__version__ = "0.2.0"
