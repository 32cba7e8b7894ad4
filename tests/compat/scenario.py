"""The core scenario of the compatibility matrix, run by the Python of one compat venv (tests/compat/test_compat.py).

In that venv sparktrain is the installed wheel (never the checkout), with one pyspark from PyPI.  In a fresh
working folder it:

1. writes a small table (3,000 rows: a key, two numerics with nulls, a categorical, a boolean label) as Parquet;
2. ``sparktrain run job.yaml --master local[2]``: profile, preprocess (a Spark ML pipeline fitted out of core,
   splits written as Parquet), ``TorchEstimator`` with 2 DDP workers in a barrier stage, ``transform`` on the test
   split (its AUC), then log and register the model in a sqlite MLflow, with the lineage of the source;
3. ``sparktrain score`` with the registered champion on the raw rows (with ``--jar``: under ``SPARKTRAIN_JAR``, the
   listener jar compiled against this very pyspark);
4. checks what MLflow holds and what was written, and prints one ``COMPAT-RESULT {json}`` line.

Exit status 0 when every check holds; otherwise the first failed check is printed and the status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROWS = 3000
MODEL = "compat-model"
EXPERIMENT = "sparktrain-compat"


def write_raw(path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    x1 = rng.normal(size=ROWS)
    x2 = rng.normal(size=ROWS)
    cat = rng.choice(["a", "b", "c", "d"], size=ROWS)
    logit = 1.5 * x1 - 1.0 * x2 + np.where(cat == "a", 1.0, 0.0) - np.where(cat == "d", 1.0, 0.0)
    label = rng.random(ROWS) < 1.0 / (1.0 + np.exp(-logit))
    x2_nulls = pa.array([None if i % 50 == 0 else float(v) for i, v in enumerate(x2)], pa.float64())
    path.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array(range(ROWS), pa.int64()), "x1": x1, "x2": x2_nulls,
                             "cat": pa.array(cat.tolist()), "label": label}), path / "part-0.parquet")


def job_yaml(base: Path) -> str:
    return f"""\
name: compat
data:
  source: {base / 'raw'}
  format: parquet
  label: label
  key: id
features:
  - {{name: x1, type: numeric, impute: median}}
  - {{name: x2, type: numeric, impute: median}}
  - {{name: cat, type: categorical}}
split: {{train: 0.8, validation: 0.1, test: 0.1, seed: 42}}
output:
  path: {base / 'dataset'}
train:
  framework: torch
  num_workers: 2
  epochs: 2
  batch_size: 128
  learning_rate: 0.01
  compare_baseline: false
  store: {base / 'store'}
tracking:
  uri: sqlite:///{base / 'mlflow.db'}
  artifact_location: {base / 'mlartifacts'}
  experiment: {EXPERIMENT}
  model_name: {MODEL}
spark:
  conf:
    spark.ui.enabled: "false"
    spark.sql.shuffle.partitions: "2"
    spark.local.dir: {base / 'spark-local'}
    spark.sql.warehouse.dir: {base / 'warehouse'}
"""


def run(cmd, log: Path, env=None) -> "tuple[int, str, float]":
    t0 = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=1500)
    text = proc.stdout + proc.stderr
    log.write_text(f"$ {' '.join(map(str, cmd))}\n{text}")
    return proc.returncode, text, time.perf_counter() - t0


class Failed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="an empty folder for everything the scenario writes")
    parser.add_argument("--jar", help="the listener jar compiled against this pyspark (used by the score step)")
    args = parser.parse_args(argv)
    base = Path(args.workdir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    result = {"python": sys.version.split()[0], "steps": {}}
    try:
        import pyspark

        import sparktrain
        from sparktrain._internal.spark_compat import scala_binary_version
        from sparktrain.jvm import find_listener_jar

        pkg = Path(sparktrain.__file__).resolve().parent
        result.update(pyspark=pyspark.__version__, sparktrain=str(pkg), scala=scala_binary_version())
        check(Path(sys.prefix) in pkg.parents, f"sparktrain imported from {pkg}, not from this venv ({sys.prefix})")
        jar, why = find_listener_jar()
        result["wheel_jar"] = jar
        check(jar is not None and Path(jar).parent == pkg / "jars", f"no listener jar from the wheel: {why}")
        check(Path(jar).name == f"sparktrain-listener_{result['scala']}.jar", f"wrong jar {jar} for {result['scala']}")
        from sparktrain.session import read_spark_defaults, spark_defaults_path

        check(spark_defaults_path() == pkg / "spark-defaults.conf" and  # probe Q: a wheel read none
              read_spark_defaults().get("spark.sql.session.timeZone") == "UTC",
              f"the wheel's spark-defaults.conf was not read ({spark_defaults_path()})")
        entry = subprocess.run([sys.executable, "-m", "sparktrain.jvm", "--entry"], capture_output=True,
                               text=True, timeout=120).stdout.strip()  # the script the help says to spark-submit
        check(entry == str(pkg / "__main__.py") and Path(entry).is_file(), f"--entry printed {entry!r}")

        write_raw(base / "raw")
        (base / "job.yaml").write_text(job_yaml(base))
        bin_dir = Path(sys.executable).parent
        env = dict(os.environ)
        env.pop("SPARKTRAIN_JAR", None)
        rc, out, secs = run([bin_dir / "sparktrain", "run", base / "job.yaml", "--master", "local[2]"],
                            base / "run.log", env)
        result["steps"]["run"] = round(secs, 1)
        check(rc == 0, f"sparktrain run exited {rc}: see {base / 'run.log'}\n{out[-4000:]}")
        check(f"Spark {pyspark.__version__}" in out, "the job did not run on this venv's pyspark")
        check("LineageListener registered on this session" in out, "the wheel's listener jar was not registered")
        check("training torch (ddp) with 2 workers" in out, "TorchEstimator did not train with 2 workers")
        check(out.count("data lineage of sources is off") == 0, "lineage was off during the job")

        env_score = dict(env)
        if args.jar:
            env_score["SPARKTRAIN_JAR"] = args.jar
        rc, out, secs = run([bin_dir / "sparktrain", "score", "--model", f"models:/{MODEL}@champion",
                             "--input", base / "raw", "--output", base / "scored", "--master", "local[2]",
                             "--tracking-uri", f"sqlite:///{base / 'mlflow.db'}"], base / "score.log", env_score)
        result["steps"]["score"] = round(secs, 1)
        check(rc == 0, f"sparktrain score exited {rc}: see {base / 'score.log'}\n{out[-4000:]}")
        check(f"scored {ROWS:,} rows" in out, "sparktrain score did not score every row")
        if args.jar:
            check("LineageListener registered on this session" in out,
                  f"the jar compiled against this pyspark ({args.jar}) was not registered")

        result.update(verify(base))
    except Failed as exc:
        result["failed"] = str(exc)
    except Exception as exc:  # an import or a check that raised: report it as the failure
        import traceback

        result["failed"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    print("COMPAT-RESULT " + json.dumps(result, sort_keys=True))
    return 1 if "failed" in result else 0


def verify(base: Path) -> dict:
    """What MLflow holds (the registered champion, the metrics, the source's lineage) and the scored rows."""
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    uri = f"sqlite:///{base / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    mv = client.get_model_version_by_alias(MODEL, "champion")
    check(str(mv.version) == "1", f"champion is version {mv.version}, expected 1")
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id])
    train = [r for r in runs if r.info.run_name == "train"]
    check(len(train) == 1, f"expected one train run, found {[r.info.run_name for r in runs]}")
    metrics = train[0].data.metrics
    check(metrics.get("test_auc", 0) > 0.6, f"test AUC {metrics.get('test_auc')} <= 0.6")
    sources = []
    for r in runs:
        for d in r.inputs.dataset_inputs:
            context = [t.value for t in d.tags if t.key == "mlflow.data.context"]
            if context == ["source"]:
                sources.append(json.loads(d.dataset.source)["path"])
    check(sources and all(s == str(base / "raw") for s in sources),
          f"lineage: the runs' source inputs are {sources}, expected {base / 'raw'}")
    features = json.loads((_committed(base / "dataset") / "features.json").read_text())
    lineage = features.get("dataset", {}).get("sources") or []
    check(len(lineage) == 1 and lineage[0].get("files") == 1 and lineage[0].get("digest"),
          f"features.json dataset.sources: {lineage}")
    scored = pq.read_table(_committed(base / "scored"))
    check(scored.num_rows == ROWS and "probability" in scored.column_names and "prediction" in scored.column_names,
          f"scored output: {scored.num_rows} rows, columns {scored.column_names}")
    return {"test_auc": round(metrics["test_auc"], 4), "registered": f"{MODEL} v{mv.version} @champion",
            "lineage_runs": len(sources)}


def _committed(path: Path) -> Path:
    """The generation a sparktrain commit record names (sparktrain.data.commit), or ``path`` (older layouts)."""
    record = path / "_manifest.json"
    if record.is_file():
        body = json.loads(record.read_text())
        if body.get("format") == "sparktrain.commit/1":
            return path / body["path"]
    return path


if __name__ == "__main__":
    raise SystemExit(main())
