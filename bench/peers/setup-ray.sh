#!/usr/bin/env bash
# Set up bench/peers/.venv-ray: an isolated venv with Ray 2.60 (Data + Train + Tune) and torch,
# used only by bench/peers/ray_bench.py, which bench/actors.py runs in a subprocess.
#
# Ray is a peer we measure against, never a dependency of sparktrain or of `make test`.
# torch is pinned to the same CPU wheel as the main venv (never an unpinned torch: GBs of CUDA wheels).
#
# Usage: bash bench/peers/setup-ray.sh [python3.11]        (idempotent; a few minutes)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-ray"
py="${1:-${PYTHON_BIN:-python3.11}}"
stamp="$venv/.installed"
[ -f "$stamp" ] && { echo "ray venv ready: $venv"; exit 0; }
command -v "$py" >/dev/null 2>&1 || { echo "ERROR: $py not found (set PYTHON_BIN)" >&2; exit 1; }
rm -rf "$venv"
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade "pip>=24" "setuptools>=77" wheel
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "ray[data,train,tune]==2.60.0" "pyarrow>=18,<26" "pandas>=2.2,<3" "scikit-learn" "psutil" \
    "optuna==5.0.0"  # bench/tune.py --ray: Ray Tune's OptunaSearch, the same Optuna as sparktrain's lock
"$venv/bin/python" - <<'PY'
import pyarrow, ray, torch
import ray.data, ray.train.torch, ray.tune  # noqa: F401
print("ray", ray.__version__, "torch", torch.__version__, "pyarrow", pyarrow.__version__)
PY
touch "$stamp"
echo "ray venv ready: $venv"
