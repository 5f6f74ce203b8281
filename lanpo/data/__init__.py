"""Problem data: JSONL import into the store, and offline generation from reasoning-gym."""
