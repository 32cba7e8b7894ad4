#!/usr/bin/env bash
# Set up bench/peers/.venv-petastorm: an isolated venv where petastorm 0.13.1 imports.
#
# petastorm 0.13.1 needs pyarrow <= 14 (it imports pyarrow.filesystem, removed in 15;
# uber/petastorm#805) and numpy < 2, while sparktrain needs pyarrow >= 18 and numpy 2.
# So it lives in its own venv, used only by bench/peers/petastorm_bench.py, which
# bench/reader.py runs in a subprocess.  petastorm is installed with --no-deps (it asks
# for setuptools<70 and pyspark, which this benchmark does not need), plus the few
# packages it imports.  torch comes from the same pinned wheel as the main venv.
#
# Usage: bash bench/peers/setup.sh [python3.11]        (idempotent; ~2-4 minutes)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-petastorm"
py="${1:-${PYTHON_BIN:-python3.11}}"
stamp="$venv/.installed"
[ -f "$stamp" ] && { echo "petastorm venv ready: $venv"; exit 0; }
command -v "$py" >/dev/null 2>&1 || { echo "ERROR: $py not found (set PYTHON_BIN)" >&2; exit 1; }
rm -rf "$venv"
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "pyarrow==14.0.2" "numpy==1.26.4" "pandas<2.2" \
    "dill>=0.2.1" "diskcache>=3.0.0" "packaging>=15.0" "psutil>=4.0.0" "six>=1.5.0" "future>=0.10.2" \
    "fsspec" "pyzmq>=14.0.0"
"${pip[@]}" --no-deps "petastorm==0.13.1"
"${pip[@]}" "torch==2.13.0"
"$venv/bin/python" - <<'PY'
import numpy, pyarrow, petastorm, torch
from petastorm import make_batch_reader  # noqa: F401
from petastorm.pytorch import BatchedDataLoader  # noqa: F401
print("petastorm", petastorm.__version__, "pyarrow", pyarrow.__version__, "numpy", numpy.__version__,
      "torch", torch.__version__)
PY
touch "$stamp"
echo "petastorm venv ready: $venv"
