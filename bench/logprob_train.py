"""Benchmark: what the log-prob head adds to the peak memory of one `lanpo train` step, as a user sees it.

Each arm is one `lanpo train` process: one step of one prompt x `--rows` rollouts (`--n`) of `--response-tokens`
tokens, micro-batch `--rows` (`grpo.micro_batch_size`), the hf backend, full fine-tuning in fp32, feedback and
summaries off, every other setting at its default. The model is a folder built here: Qwen2-shaped, random weights,
Qwen2.5's 152,064-token vocabulary, hidden 64, 2 layers, an untied head, and a character-level tokenizer of exactly
152,064 single-character tokens (ASCII, CJK, Hangul, then private-use characters), so a random model writes to its
length limit (one EOS among 152,064 tokens) and the hidden size leaves the logits the largest thing that grows with
the tokens. A first step, not measured, imports the problems and starts the store. The measure: the process's peak
resident memory (ru_maxrss, from wait4), less the same arm's at 16-token responses, in units of the micro-batch's
full fp32 logits (rows x response tokens x 152,064 x 4 bytes: one copy).

Arms (each `--set` on top of the defaults):

  default     every setting at its default (grpo.logprob_chunk_mb = 256, the fused head)
  unfused     grpo.logprob_fused = false (the same budget through the head's own forward under checkpointing)
  before      grpo.logprob_chunk_tokens = 4096, logprob_fused = false: the default before issue 50 (at 4 x 1,024
              positions, exactly at its threshold, the full logits; about 10 GB at the default shape)
  off         grpo.logprob_chunk_mb = 0: the full logits at every shape

    python bench/logprob_train.py                                  # default and unfused at 4 x 1,024
    python bench/logprob_train.py --arms default unfused before    # and the default before issue 50 (~11 GB)
    python bench/logprob_train.py --rows 1 --n 2 --response-tokens 8192 --arms default  # the paper recipe's row
    python bench/logprob_train.py --rows 2 --response-tokens 32 --arms default     # smoke

Target (issue 50): the default adds at most one full-logits copy at 4 x 1,024 (the fused head: at most a quarter).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 152_064  # Qwen2.5 (config.json "vocab_size")
BASELINE_TOKENS = 16
ARMS = {
    "default": [],
    "unfused": ["grpo.logprob_fused=false"],
    "before": ["grpo.logprob_chunk_tokens=4096", "grpo.logprob_fused=false"],
    "off": ["grpo.logprob_chunk_mb=0"],
}
# single characters, each a token: ASCII, CJK ideographs, Hangul syllables, then the planes 15 and 16 private use
RANGES = ((0x20, 0x7E), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_model(folder: Path, hidden: int) -> None:
    """A Qwen2-shaped model folder with random weights and a 152,064-token character tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    chars = ["\n", "\t"] + [chr(c) for first, last in RANGES for c in range(first, last + 1)]
    vocab = {tok: i for i, tok in enumerate((SPECIALS + chars)[:VOCAB])}
    assert len(vocab) == VOCAB
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )  # fmt: skip
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).float()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)


def recipe(path: Path, model: Path, threads: int) -> None:
    path.write_text(
        f"""run_name = "logprob-bench"
steps = 1
batch_size = 1
seed = 0

[model]
name = "{model}"
threads = {threads}

[lora]
enabled = false

[data]
dataset = "logprob_bench"
task = "chain_sum"
n = 8
task_options = {{ min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }}

[rollout]
max_prompt_tokens = 1024
temperature = 1.0

[feedback]
mode = "none"

[summarizer]
enabled = false
"""
    )


def peak(cmd: list[str], env: dict[str, str], log: Path) -> int:
    """The peak RSS in bytes of `cmd`'s process (wait4's ru_maxrss: the largest of it and its waited children)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    return usage.ru_maxrss * 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4, help="rows of the micro-batch (grpo.micro_batch_size)")
    parser.add_argument("--n", type=int, default=0, help="rollouts of the prompt (rollout.n, >= 2; 0: --rows)")
    parser.add_argument("--response-tokens", type=int, default=1024, help="rollout.max_new_tokens")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arms", nargs="+", default=["default", "unfused"], choices=list(ARMS))
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (the runs' logs, the store)")
    args = parser.parse_args()
    copy = args.rows * args.response_tokens * VOCAB * 4
    print(
        f"lanpo train, 1 step: micro-batch {args.rows} x {args.response_tokens} tokens, vocabulary {VOCAB:,}, "
        f"hidden {args.hidden}; one full-logits copy = {copy / 2**30:.2f} GiB; peak RSS (wait4) above the same "
        f"arm at {BASELINE_TOKENS}-token responses"
    )
    tmp = tempfile.mkdtemp(prefix="lanpo-bench-logprob-")
    print(f"runs in {tmp}" + (" (kept)" if args.keep else ""))
    print("\n| arm | settings | peak at 16 tokens, MiB | peak, MiB | added, MiB | added, full-logits copies | s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    home, model, toml = Path(tmp, "home"), Path(tmp, "model"), Path(tmp, "recipe.toml")
    build_model(model, args.hidden)
    recipe(toml, model, args.threads)
    env = dict(os.environ, LANPO_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("LANPO_DATABASE_URL", None)
    lanpo = [sys.executable, "-m", "lanpo"]
    added: dict[str, float] = {}
    try:
        subprocess.run([*lanpo, "db", "upgrade"], env=env, capture_output=True, check=True)
        # a first step generates and imports the problems and starts the store: not in any arm's measure
        warm = ["--set", f"rollout.max_new_tokens={BASELINE_TOKENS}", "--set", "run_name=logprob-warmup"]
        peak([*lanpo, "train", "--config", str(toml), "--no-progress", *warm], env, Path(tmp, "warmup.log"))
        for arm in args.arms:
            peaks, seconds = {}, 0.0
            for tokens in (BASELINE_TOKENS, args.response_tokens):
                sets = [*ARMS[arm], f"rollout.max_new_tokens={tokens}", f"rollout.n={args.n or args.rows}"]
                sets += [f"grpo.micro_batch_size={args.rows}", f"run_name=logprob-{arm}-{tokens}"]
                cmd = [*lanpo, "train", "--config", str(toml), "--no-progress"]
                cmd += [item for s in sets for item in ("--set", s)]
                started = time.perf_counter()
                peaks[tokens] = peak(cmd, env, Path(tmp, f"{arm}-{tokens}.log"))
                seconds = time.perf_counter() - started
            added[arm] = peaks[args.response_tokens] - peaks[BASELINE_TOKENS]
            print(
                f"| {arm} | {', '.join(ARMS[arm]) or 'defaults'} | {peaks[BASELINE_TOKENS] / 2**20:,.0f} | "
                f"{peaks[args.response_tokens] / 2**20:,.0f} | {added[arm] / 2**20:,.0f} | {added[arm] / copy:.2f} | "
                f"{seconds:.0f} |",
                flush=True,
            )
    finally:
        subprocess.run([*lanpo, "db", "stop"], env=env, capture_output=True, check=False)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    got = ", ".join(f"{arm} {value / copy:.2f}" for arm, value in added.items())
    print(f"target: the default adds <= 1 full-logits copy (the fused head: <= 0.25) -> {got} copies")


if __name__ == "__main__":
    main()
