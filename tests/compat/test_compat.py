"""The compatibility matrix (``make test-compat``): the wheel of ``make dist`` on each supported Spark line.

For each pyspark in ``COMPAT_VERSIONS`` (default: ``SPARK_TESTED``, 3.5.9 4.0.5 4.1.4 4.3.0) a venv under
``work/compat/<version>/`` gets that pyspark from PyPI, the built wheel with its ``torch`` extra (torch==2.13.0,
the CPU wheel on local disk: pinned, never resolved), and the lock's other pins, less what that line needs
instead (:data:`LINE_PINS`).  The venv is kept: a second run checks its stamp and only reinstalls a changed wheel.
Then the listener jar is compiled against that pyspark with the Scala compiler in its jars (``make
listener-jar``), and ``scenario.py`` runs the core scenario with the venv's Python (``PYSPARK_PYTHON`` set to it,
``SPARK_LOCAL_IP=127.0.0.1``, nothing of the checkout on ``PYTHONPATH``).

Each line's times and results are merged into ``work/compat/results.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from sparktrain._internal.spark_compat import SPARK_TESTED, version_tuple

pytestmark = [pytest.mark.slow, pytest.mark.compat]

REPO = Path(__file__).resolve().parents[2]
COMPAT = REPO / "work" / "compat"
LOCK = REPO / "python" / "requirements.lock"
SCENARIO = Path(__file__).resolve().parent / "scenario.py"
VERSIONS = os.environ.get("COMPAT_VERSIONS", " ".join(SPARK_TESTED)).split()
PYTHON_BIN = os.environ.get("PYTHON_BIN", "python3.11")
#: Pins a Spark line takes instead of the lock's (the lock's pyspark and py4j are always dropped: each pyspark
#: pins its own py4j).  Spark 3.5 runs on the lows of the metadata's ranges (python/pyproject.toml): pyarrow 17,
#: pandas 2.2, numpy 1.26 (its own era's releases); the 4.x lines on the lock's pins.
LINE_PINS: Dict[str, List[str]] = {"3.5": ["pyarrow==17.0.0", "pandas==2.2.3", "numpy==1.26.4"]}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _wheel() -> Path:
    wheels = sorted((REPO / "dist").glob("sparktrain-*-py3-none-any.whl"))
    if not wheels:
        pytest.fail("no wheel in dist/: run `make dist` (make test-compat does)")
    return wheels[-1]


def _constraints(version: str) -> str:
    """The lock's pins, less pyspark and py4j and whatever this line pins instead."""
    line = ".".join(map(str, version_tuple(version)[:2]))
    extra = LINE_PINS.get(line, [])
    replaced = {"pyspark", "py4j"} | {p.split("==")[0].lower() for p in extra}
    kept = [ln for ln in LOCK.read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and ln.split("==")[0].strip().lower() not in replaced]
    return "\n".join(kept + extra) + "\n"


def _pip(venv: Path, *args: str, timeout: int = 2400) -> None:
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def compat_venv(version: str) -> Path:
    """``work/compat/<version>``: a venv with pyspark ``version``, the wheel and its torch extra (kept between runs)."""
    venv = COMPAT / version
    stamp = venv / ".sparktrain-compat.json"
    wheel = _wheel()
    constraints = _constraints(version)
    deps = {"pyspark": version, "constraints": _sha(constraints.encode()), "python": PYTHON_BIN}
    wheel_sha = _sha(wheel.read_bytes())
    state = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if state.get("deps") != deps or not (venv / "bin" / "python").is_file():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([PYTHON_BIN, "-m", "venv", str(venv)], check=True, timeout=300)
        (venv / "constraints.txt").write_text(constraints)
        # torch comes pinned (the extra and the lock say torch==2.13.0: the CPU wheel on local disk)
        _pip(venv, f"pyspark=={version}", f"sparktrain[torch] @ {wheel.as_uri()}", "torch==2.13.0",
             "-c", str(venv / "constraints.txt"))
    elif state.get("wheel") != wheel_sha:
        _pip(venv, "--no-deps", "--force-reinstall", str(wheel))
    stamp.write_text(json.dumps({"deps": deps, "wheel": wheel_sha}, indent=1))
    return venv


def _site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site


def listener_jar_for(venv: Path) -> Path:
    """The listener jar compiled against this venv's pyspark with its bundled scalac (rebuilt when a source changed)."""
    jar = venv / "sparktrain-listener.jar"
    sources = list((REPO / "src" / "main" / "scala").rglob("*.scala"))
    if not jar.is_file() or any(s.stat().st_mtime > jar.stat().st_mtime for s in sources):
        jars = _site_packages(venv) / "pyspark" / "jars"
        proc = subprocess.run(["make", "-s", "listener-jar", f"LISTENER_SPARK_JARS={jars}", f"LISTENER_OUT={jar}"],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"the jar did not compile against {jars}:\n{proc.stdout}\n{proc.stderr}"
    return jar


def _scenario_env(venv: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SPARK_HOME", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "VIRTUAL_ENV")
           and not k.startswith("SPARKTRAIN_")}
    py = str(venv / "bin" / "python")
    env.update(PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py, SPARK_LOCAL_IP="127.0.0.1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1")
    return env


def _record(version: str, entry: dict) -> None:
    results = COMPAT / "results.json"
    data = json.loads(results.read_text()) if results.is_file() else {}
    data[version] = entry
    results.write_text(json.dumps(data, indent=1, sort_keys=True))


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("version", VERSIONS)
def test_core_scenario_on_this_spark_line(version, tmp_path):
    t0 = time.perf_counter()
    venv = compat_venv(version)
    t_venv = time.perf_counter() - t0
    jar = listener_jar_for(venv)
    t_jar = time.perf_counter() - t0 - t_venv
    proc = subprocess.run([str(venv / "bin" / "python"), str(SCENARIO), "--workdir", str(tmp_path / "work"),
                           "--jar", str(jar)], cwd=tmp_path, env=_scenario_env(venv), capture_output=True,
                          text=True, timeout=3000)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("COMPAT-RESULT ")]
    result = json.loads(lines[-1][len("COMPAT-RESULT "):]) if lines else {"failed": proc.stderr[-4000:]}
    result["seconds"] = {"venv": round(t_venv, 1), "jar": round(t_jar, 1), "scenario": sum(result["steps"].values())
                         if "steps" in result else None, "total": round(time.perf_counter() - t0, 1)}
    result["passed"] = proc.returncode == 0 and "failed" not in result
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    _record(version, result)
    print(f"pyspark {version}: {json.dumps(result, sort_keys=True)}", file=sys.stderr)
    assert result["passed"], result.get("failed", proc.stderr[-4000:])
    assert result["pyspark"] == version
    jar_scala = subprocess.run([str(venv / "bin" / "python"), "-c",
                                f"from sparktrain.jvm import jar_scala_version as v; print(v({str(jar)!r}))"],
                               capture_output=True, text=True, env=_scenario_env(venv)).stdout.strip()
    assert jar_scala == result["scala"] == ("2.12" if version.startswith("3.") else "2.13")
