#!/usr/bin/env bash
# Data-parallel LANPO training with torchrun: one rank per GPU, rank 0 writes checkpoints and the store.
#
#   train/launch/torchrun.sh train/configs/lanpo-both.toml [extra `lanpo train` options, e.g. --resume]
#
# Environment:
#   NPROC        ranks on this node (default: the number of GPUs, else 2 CPU ranks with gloo)
#   NNODES       nodes (default 1); with more than one also set NODE_RANK and MASTER_ADDR (MASTER_PORT 29500)
#   LANPO_DATABASE_URL  the shared Postgres every rank reads (required across nodes: the embedded server is per node)
# batch_size must be divisible by the total number of ranks; each rank generates for batch_size / ranks problems.
set -euo pipefail
CONFIG=${1:?usage: $0 CONFIG.toml [lanpo train options]}
shift
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l || true)
NPROC=${NPROC:-$([ "${GPUS:-0}" -gt 0 ] && echo "$GPUS" || echo 2)}
NNODES=${NNODES:-1}
if [ "$NNODES" -gt 1 ]; then
  : "${MASTER_ADDR:?set MASTER_ADDR for a multi-node run}" "${NODE_RANK:?set NODE_RANK for a multi-node run}"
  : "${LANPO_DATABASE_URL:?set LANPO_DATABASE_URL: all nodes must share one Postgres}"
  RDZV=(--nnodes "$NNODES" --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}")
else
  RDZV=(--standalone)
fi
# Start (and migrate) the store once before the ranks race to it.
lanpo db upgrade
exec torchrun "${RDZV[@]}" --nproc_per_node "$NPROC" --no-python lanpo train --config "$CONFIG" --no-progress "$@"
