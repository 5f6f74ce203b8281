#!/usr/bin/env bash
# Data-parallel LANPO training with `accelerate launch` (same ranks as torchrun.sh; accelerate sets RANK,
# WORLD_SIZE and LOCAL_RANK, which lanpo.train.plumbing.dist reads). Gradients of the LoRA adapter are all-reduced by
# lanpo itself (DDP), and full fine-tuning (lora.enabled = false) is sharded by lanpo itself (FSDP2), so any
# accelerate config with `distributed_type: MULTI_GPU` (or MULTI_CPU) works: leave accelerate's own FSDP off.
#
#   train/launch/accelerate.sh train/configs/lanpo-both.toml [--resume]
#   ACCELERATE_CONFIG=my.yaml train/launch/accelerate.sh train/configs/lanpo-intra.toml
set -euo pipefail
CONFIG=${1:?usage: $0 CONFIG.toml [lanpo train options]}
shift
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l || true)
NPROC=${NPROC:-$([ "${GPUS:-0}" -gt 0 ] && echo "$GPUS" || echo 2)}
ARGS=(--num_processes "$NPROC" --no_python)
if [ -n "${ACCELERATE_CONFIG:-}" ]; then
  ARGS=(--config_file "$ACCELERATE_CONFIG" --no_python)
elif [ "${GPUS:-0}" -gt 0 ]; then
  ARGS+=(--multi_gpu)
fi
lanpo db upgrade
exec accelerate launch "${ARGS[@]}" lanpo train --config "$CONFIG" --no-progress "$@"
