"""Test-time inference and evaluation (paper section 4.3, Table 1).

io        JSONL questions in, JSONL solutions out (errors name file and line)
config    `RetrievalSettings`, `SamplingSettings`, `EvalConfig` (TOML: train/configs/eval-*.toml)
answerer  `Answerer(model, adapter, backend).solve(questions, mode, k_samples)`: zero_shot | retrieval | self_correct
          | self_correct_single
modes     how each mode builds its prompts from what a `Prompter` (the answerer) gives it
store     questions as problems, an infer / eval run, every turn as an attempt
run       one inference run's life, for every caller: check without writing, open, record answers, finish
table     mean@k tables shaped like the paper's Table 1, and their recount from the stored attempts
evaluate  `run_eval(config, db)`: the `lanpo eval` pipeline (its runs through `run`)
"""
