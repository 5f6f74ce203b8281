"""Reports from the store: figures, report.md and the Table 1-shaped results of runs and experiments.

`read` (session in, dataclasses out) -> `series` (runs, lines, bands over seeds) -> `figures` (which metrics each
figure draws) -> `plot` (matplotlib, Agg, no display) and `table` -> `markdown` -> `output` (staged, moved whole).
`live` is the other direction: the trainer's optional TensorBoard / wandb logging while a run goes.
"""
