"""KL of a trained RL adapter to its start, read in fp32 and under bf16 autocast, on fresh samples of the run's
step-20 prompts: is the small KL of the bf16-autocast runs (README, "The default end to end, and bf16 autocast") a
bf16 measurement or a policy that moved less?

    cd $LANPO_HOME && python docs/learning/kl_check.py RUN SFT_ADAPTER RL_ADAPTER
    # e.g. grpo-vs-lanpo-grpo-s0 experiments/grpo-vs-lanpo/sft/adapter runs/grpo-vs-lanpo-grpo-s0/step-000020/adapter

The start is SmolLM2 with the SFT adapter merged (as the trainer builds it); the RL adapter goes on top; 8 samples
of each stored step-20 prompt (temperature 1, seed 0, 64 tokens, fp32); k3 KL per completion token, the trainer's
estimator, against the adapter switched off.
"""

from __future__ import annotations

import sys

import sqlalchemy as sa
import torch
from peft import PeftModel

from lanpo.db.connection import connect
from lanpo.models import load_causal_lm, merge_adapter
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs
from lanpo.train.policy import LoraPolicy

PROMPTS = (
    "SELECT g.prompt FROM rollout_groups g JOIN runs r ON r.id = g.run_id WHERE r.name = :run AND g.step = 20 "
    "ORDER BY g.id"
)


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    run, sft, rl = sys.argv[1:4]
    torch.set_num_threads(1)
    db = connect()
    with db.connect() as conn:
        prompts = [r[0] for r in conn.execute(sa.text(PROMPTS), {"run": run})]
    db.dispose()
    base, tokenizer = load_causal_lm("smollm2", dtype=torch.float32)
    base, _ = merge_adapter(base, sft)
    model = PeftModel.from_pretrained(base, rl)
    model.eval()
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=64, seed=0)
    groups = HFBackend(model, tokenizer).generate(prompts, 8, params)
    completions = [list(c.token_ids) for group in groups for c in group]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(8)]
    batch = build_batch(prompt_ids, completions, tokenizer.pad_token_id, torch.device("cpu"))
    policy, mask = LoraPolicy(model), batch.completion_mask.float()
    for name, dtype in (("fp32", None), ("bf16 autocast", torch.bfloat16)):
        with torch.no_grad():
            logprob_settings = LogprobSettings(micro_batch_size=16, autocast=dtype)
            logp = chunked_logprobs(model, batch, logprob_settings)
            ref = policy.reference_logprobs(batch, logprob_settings)
        d = ref - logp
        k3 = torch.exp(d) - d - 1
        print(f"{run} {name}: KL k3 {float((k3 * mask).sum() / mask.sum()):.4f}")


if __name__ == "__main__":
    main()
