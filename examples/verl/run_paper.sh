#!/usr/bin/env bash
# LANPO's paper recipe on verl: export the problems from lanpo's store as verl's parquet, then verl's trainer with
# examples/verl/lanpo_paper.yaml (Tables 6-7 in verl's keys, lanpo's store beside them; docs/verl.md).
#
#   MODEL_PATH=/models/qwen2.5-7b-sft examples/verl/run_paper.sh [more verl overrides, e.g. trainer.total_epochs=1]
#
# Environment (each has a default):
#   MODEL_PATH       the policy to start from (Qwen/Qwen2.5-7B; Section 5 starts RL from its SFT model: pass that)
#   NNODES           nodes (1). More than one: start a Ray cluster first (`ray start --head` here, `ray start
#                    --address=HEAD:6379` on the others), with LANPO_DATABASE_URL exported on every node before
#                    `ray start`: verl's workers run there and write to the store
#   GPUS_PER_NODE    GPUs on each node (nvidia-smi's count)
#   DATA_DIR         where the parquet files go (~/data/lanpo)
#   TRAIN_DATASET    the lanpo dataset trained on (dapo17k); VAL_DATASET the one validated on (aime25)
#   LANPO_CONFIG     the lanpo recipe: feedback, summaries, capacity, reward (train/configs/lanpo-both.toml)
#   EXPERIMENT       verl's experiment name, which is the store's run name (lanpo-both)
#   LANPO_DATABASE_URL  the store (required with NNODES > 1: the embedded Postgres serves one node)
#
# Before the first run (once; each is a lanpo command):
#   lanpo data import dapo-math-17k.parquet --preset dapo17k --skip-bad    # Section 5: the DAPO dataset
#   lanpo data import aime-2025.jsonl --preset aime25                      # Figure 5(a): AIME25 during training
#   lanpo relevance build --dataset dapo17k --judge Qwen/Qwen2.5-Math-7B-Instruct --stage1 bm25   # Section 5: gamma
# and install verl with lanpo beside it: pip install 'verl[vllm]==0.9.1' -e '.[verl]'
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B}
NNODES=${NNODES:-1}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l || true)
GPUS_PER_NODE=${GPUS_PER_NODE:-${GPUS:-0}}
DATA_DIR=${DATA_DIR:-$HOME/data/lanpo}
TRAIN_DATASET=${TRAIN_DATASET:-dapo17k}
VAL_DATASET=${VAL_DATASET:-aime25}
LANPO_CONFIG=$(realpath "${LANPO_CONFIG:-$ROOT/train/configs/lanpo-both.toml}")
EXPERIMENT=${EXPERIMENT:-lanpo-both}
if [ "$GPUS_PER_NODE" -lt 1 ]; then
  echo "error: no GPU found; set GPUS_PER_NODE (verl's trainer needs CUDA: NCCL)" >&2
  exit 2
fi
if [ "$NNODES" -gt 1 ]; then
  : "${LANPO_DATABASE_URL:?set LANPO_DATABASE_URL: every node writes to one shared Postgres}"
fi
mkdir -p "$DATA_DIR"
lanpo db upgrade
lanpo data export --dataset "$TRAIN_DATASET" --format verl --out "$DATA_DIR/$TRAIN_DATASET.parquet"
lanpo data export --dataset "$VAL_DATASET" --format verl --split test --out "$DATA_DIR/$VAL_DATASET.parquet"
exec python -m verl.trainer.main_ppo --config-path "$ROOT/examples/verl" --config-name lanpo_paper \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  data.train_files="$DATA_DIR/$TRAIN_DATASET.parquet" \
  data.val_files="$DATA_DIR/$VAL_DATASET.parquet" \
  trainer.nnodes="$NNODES" \
  trainer.n_gpus_per_node="$GPUS_PER_NODE" \
  trainer.experiment_name="$EXPERIMENT" \
  lanpo.config="$LANPO_CONFIG" \
  "$@"
