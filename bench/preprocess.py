"""Feature preprocessing: our Spark pipeline against a single-process pandas/pyarrow implementation.

Usage (from the repo root)::

    PYTHONPATH=python .venv/bin/python bench/preprocess.py [--scales 1,5,20] [--cores 2] \
        [--driver-memory 1g] [--pandas-cap-gb 2] [--engines spark,pandas,copy] [--warmup 5] [--repeat 5] \
        [--conf KEY=VALUE ...]

Both sides run the feature spec of ``conf/flights.yaml`` on the same raw rows:
the flights join at ``scale`` N, exported once (untimed) to Parquet under
``work/bench/preprocess/``.  Each side then does the whole job and delivers
the same things: read, check the input (nulls, NaN/inf, casts; an error
stops the job), split 80/10/10 by a hash of the key, fit on train, transform
all splits, write three Parquet datasets (zstd, 65,536-row groups) with a
``_manifest.json`` each (files, row groups, sha256) and ``features.json``,
all staged and committed by one rename (:func:`sparktrain.data.manifest.atomic_dir`).

* **spark**: :func:`sparktrain.features.materialize.materialize` in a fresh
  ``local[cores]`` session with ``spark.driver.memory`` (it also saves the
  fitted ``PipelineModel``).
* **pandas**: pyarrow reads the whole table, pyarrow/numpy compute the same
  checks (:func:`sparktrain.features.validate.check_results` judges them)
  and fit the same statistics, :func:`sparktrain.serve.local.transform_local`
  transforms, ``pq.write_table`` writes.  It runs under a memory cap (polled
  every 0.1 s; default 2 GiB, about what the Spark side's process tree uses
  with a 1 GB heap): going over it is reported as OOM, not a crash of the
  benchmark.
* **copy** (the Spark floor): a Spark job that reads the same columns,
  tags the split and writes the three splits (same codec and row groups), with
  no checks, no fit and no transform; what any Spark implementation pays.

Each side runs in its own subprocess; peak memory is the peak of the summed
PSS (proportional set size, Linux; RSS elsewhere) of that process tree: the
driver python, the JVM and any Python workers for Spark.  The table shows rows/s,
peak memory and the ratios spark/pandas.  Each side runs the whole job
``--warmup + --repeat`` times in its process: the table shows the first run
(a fresh process: JIT and code generation are cold, more so for the JVM, as
for a one-off ``spark-submit``) and the median and best of the last
``--repeat`` runs (the steady state of a long-lived cluster, notebook kernel
or service; the JVM's JIT keeps compiling Spark's planner for about ten
runs, so fewer warm-up runs measure part of its warm-up).  The Spark side's
step times (fit: checks and statistics; write: transform, write, model save,
manifests) come from :class:`~sparktrain.features.materialize.PreprocessResult`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
WORK = REPO / "work" / "bench" / "preprocess"
CONFIG = REPO / "conf" / "flights.yaml"


# ------------------------------------------------------------------------------------------------ children
def _session(args: argparse.Namespace, memory: str, app: str):
    """``local[cores]`` with sparktrain's defaults (conf/spark-defaults.conf), then ``--conf`` on top."""
    from sparktrain.session import get_or_create_session

    conf = {"spark.driver.memory": memory, "spark.sql.shuffle.partitions": str(args.cores),
            "spark.ui.enabled": "false", "spark.local.dir": str(WORK / "spark-local")}
    for kv in args.conf:
        if "=" not in kv:
            raise SystemExit(f"--conf {kv!r}: expected KEY=VALUE, e.g. --conf spark.sql.shuffle.partitions=4")
        key, value = kv.split("=", 1)
        conf[key] = value
    return get_or_create_session(f"local[{args.cores}]", app, conf=conf)


def child_export(args: argparse.Namespace) -> None:
    from sparktrain.datasets import flights

    spark = _session(args, "2g", "bench-export")
    for scale in args.scales:
        path = WORK / f"raw_x{scale}"
        if not (path / "_SUCCESS").exists():
            flights(spark, scale=scale).write.mode("overwrite").parquet(str(path))
    spark.stop()


def child_spark(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from sparktrain.config import load_config
    from sparktrain.features.materialize import materialize

    spark = _session(args, args.driver_memory, "bench-preprocess")
    cfg = load_config(CONFIG)
    # as a user would run it: data.source is the Parquet path (re-read per pass, no staging copy)
    cfg = replace(cfg, data=replace(cfg.data, source=args.raw, format="parquet"),
                  output=replace(cfg.output, path=args.out, overwrite=True))
    runs, steps, cpu = [], [], []
    for _ in range(args.warmup + args.repeat):
        c0, t0 = _tree_cpu(), time.perf_counter()
        result = materialize(spark, cfg)
        runs.append(time.perf_counter() - t0)
        cpu.append(_tree_cpu() - c0)
        steps.append({k: round(v, 3) for k, v in result.timings.items()})
    print("RESULT " + json.dumps({"rows": sum(result.row_counts.values()), "seconds": runs[0], "runs": runs,
                                  "cpu": cpu, "steps": steps}), flush=True)
    spark.stop()


def child_copy(args: argparse.Namespace) -> None:
    """The floor of any Spark job here: read the columns the spec uses, tag the split, write three splits.

    No checks, no fit, no transform: only the read, the split expression and
    the partitioned Parquet write (same codec and row groups) that the real
    job also does.  What this costs, every Spark implementation of the job pays.
    """
    from pyspark.sql import functions as F
    from sparktrain.config import load_config
    from sparktrain.data.manifest import parquet_writer
    from sparktrain.features.compile import source_columns
    from sparktrain.features.materialize import SPLIT_COLUMN, split_expression

    spark = _session(args, args.driver_memory, "bench-copy")
    cfg = load_config(CONFIG)
    cols = list(dict.fromkeys(source_columns(cfg.features) + [cfg.data.key, cfg.data.label]))

    def job(out: str) -> None:
        df = spark.read.parquet(args.raw).select(*cols)
        df = df.withColumn(SPLIT_COLUMN, F.expr(split_expression(cfg.data.key, cfg.split)))
        (parquet_writer(df, cfg.output.row_group_rows, cfg.output.compression).mode("overwrite")
         .partitionBy(SPLIT_COLUMN).parquet(out))

    runs, cpu = [], []
    for _ in range(args.warmup + args.repeat):
        c0, t0 = _tree_cpu(), time.perf_counter()
        job(args.out)
        runs.append(time.perf_counter() - t0)
        cpu.append(_tree_cpu() - c0)
    rows = spark.read.parquet(args.out).count()
    print("RESULT " + json.dumps({"rows": rows, "seconds": runs[0], "runs": runs, "cpu": cpu}), flush=True)
    spark.stop()


def fit_pandas(table: Any, plan: Any) -> Dict[str, Any]:
    """The statistics the Spark pipeline fits, computed with numpy/pyarrow in memory."""
    import numpy as np
    import pyarrow.compute as pc
    from sparktrain.serve import local as L
    from sparktrain.features import metadata as md
    from sparktrain.features.spec import CategoricalFeature, NumericFeature

    fitted: Dict[str, Dict[str, Any]] = {"impute": {}, "splits": {}, "labels": {}, "scale": {}}
    for spec in plan.specs:
        n = spec.name
        if isinstance(spec, NumericFeature):
            x = L._to_float(L._column(table, spec.source))
            x[~np.isfinite(x)] = np.nan
            if spec.impute == "constant":
                x = np.where(np.isnan(x), spec.impute_value, x)
            if spec.clip is not None:
                x = np.clip(x, *spec.clip)
            if spec.log1p:
                x = np.sign(x) * np.log1p(np.abs(x))
            col = plan.internal(n, "prep")
            if spec.impute != "constant":
                value = float(np.nanmean(x) if spec.impute == "mean" else np.nanmedian(x))
                fitted["impute"][col] = value
                x = np.where(np.isnan(x), value, x)
                col = plan.internal(n, "imp")
            if spec.buckets:
                qs = np.unique(np.quantile(x, np.linspace(0, 1, spec.buckets + 1)[1:-1]))
                fitted["splits"][col] = [-np.inf, *qs.tolist(), np.inf]
            if spec.scale == "standard":
                std = float(np.std(x, ddof=1))
                fitted["scale"][col] = ("standard", float(np.mean(x)), std if std > 0 else 1.0)
            elif spec.scale == "minmax":
                lo, hi = float(np.min(x)), float(np.max(x))
                fitted["scale"][col] = ("minmax", lo, hi - lo if hi > lo else 1.0)
        elif isinstance(spec, CategoricalFeature) and spec.hash_buckets is None:
            counts = pc.value_counts(L._as_text(L._column(table, spec.source)).drop_null())
            pairs = sorted(((-c, v) for v, c in zip(counts.field(0).to_pylist(), counts.field(1).to_pylist())
                            if c >= spec.min_frequency))
            fitted["labels"][plan.internal(n, "str")] = [v for _, v in pairs][:spec.max_vocab or None]
    return md.build_metadata(plan, fitted, schema={plan.label: "boolean"})


def child_pandas(args: argparse.Namespace) -> None:
    from sparktrain.config import load_config
    from sparktrain.features.compile import plan_features

    cfg = load_config(CONFIG)
    plan = plan_features(cfg.features, cfg.data.key, cfg.data.label)
    runs, cpu = [], []
    for _ in range(args.warmup + args.repeat):
        c0, t0 = _tree_cpu(), time.perf_counter()
        rows = _pandas_job(args, cfg, plan)
        runs.append(time.perf_counter() - t0)
        cpu.append(_tree_cpu() - c0)
    print("RESULT " + json.dumps({"rows": rows, "seconds": runs[0], "runs": runs, "cpu": cpu}), flush=True)


def _tree_cpu() -> float:
    """CPU seconds (user + system) used so far by this process and its children (the JVM, Python workers)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _pandas_checks(table: Any, cfg: Any, types: Dict[str, str]) -> None:
    """The checks of :mod:`sparktrain.features.validate`, computed with pyarrow, judged by ``check_results``."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    from sparktrain.features.spec import CrossedFeature, NumericFeature
    from sparktrain.features.validate import check_results

    target_of = {"numeric": pa.float64(), "datetime": pa.timestamp("us", tz="UTC"), "boolean": pa.bool_()}
    values: Dict[str, Any] = {"rows": table.num_rows, "keys": table.num_rows - table.column(cfg.data.key).null_count,
                              "labels": table.num_rows - table.column(cfg.data.label).null_count}
    for i, spec in enumerate(cfg.features):
        if isinstance(spec, CrossedFeature):
            continue
        col = table.column(spec.source)
        target = target_of.get(spec.type)
        if target is not None and pa.types.is_string(col.type):
            parsed = (pa.chunked_array([pa.array(pd.to_numeric(col.to_pandas(), errors="coerce"), pa.float64())])
                      if spec.type == "numeric" else pc.cast(col, target, safe=False))
            bad = pc.and_(pc.is_valid(col), pc.is_null(parsed))
            values[f"v{i}_bad"] = pc.sum(bad).as_py() or 0
            values[f"v{i}_sample"] = pc.min(pc.filter(col, bad)).as_py()
            col = parsed
        if isinstance(spec, NumericFeature):
            v = pc.cast(col, pa.float64())
            values[f"v{i}_nonnull"] = len(v) - v.null_count
            values[f"v{i}_nan"] = pc.sum(pc.is_nan(v)).as_py() or 0
            values[f"v{i}_inf"] = pc.sum(pc.is_inf(v)).as_py() or 0
        else:
            values[f"v{i}_present"] = len(col) - col.null_count
    check_results(values, cfg.features, cfg.data.label, types)


def _pandas_job(args: argparse.Namespace, cfg: Any, plan: Any) -> int:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sparktrain.data.manifest import atomic_dir, build_manifest, write_manifest
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import source_columns
    from sparktrain.serve.local import transform_local

    key, label = cfg.data.key, cfg.data.label
    table = pq.read_table(args.raw, columns=list(dict.fromkeys(source_columns(cfg.features) + [key, label])))
    _pandas_checks(table, cfg, {f.name: str(f.type) for f in table.schema})
    bucket = pd.util.hash_array(table.column(key).to_numpy(zero_copy_only=False)) % 10_000
    names = np.where(bucket < 8000, 0, np.where(bucket < 9000, 1, 2))
    meta = fit_pandas(table.filter(pa.array(names == 0)), plan)
    rows = 0
    with atomic_dir(args.out, overwrite=True) as staging:
        for i, split in enumerate(("train", "validation", "test")):
            part = table.filter(pa.array(names == i))
            out = pa.table(transform_local(part, meta))
            folder = os.path.join(staging, split)
            os.makedirs(folder)
            pq.write_table(out, os.path.join(folder, "part-0.parquet"), row_group_size=65_536, compression="zstd")
            write_manifest(folder, build_manifest(folder, extra={"split": split}))
            rows += out.num_rows
            del part, out
        with open(os.path.join(staging, "features.json"), "w") as fh:
            fh.write(md.dumps(meta))
    return rows


# ------------------------------------------------------------------------------------------------ parent
def _pss(proc: Any) -> int:
    """Proportional set size: shared pages split between sharers.  A process younger than 1 s counts 0:
    one the JVM is just spawning (Python workers) shares the JVM's memory until it execs, and would
    count the JVM twice."""
    if time.time() - proc.create_time() < 1.0:
        return 0
    info = proc.memory_full_info()
    return int(getattr(info, "pss", info.rss))


def run_child(mode: str, extra: List[str], cap_bytes: Optional[int] = None, timeout: float = 3600) -> Dict[str, Any]:
    """Run a child mode, polling the RSS of its process tree; kill it over ``cap_bytes``."""
    import psutil

    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable)
    proc = subprocess.Popen([sys.executable, __file__, mode, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    root = psutil.Process(proc.pid)
    peak, oom, t0 = 0, False, time.perf_counter()
    parts = {"python": 0, "jvm": 0, "workers": 0}
    while proc.poll() is None:
        try:
            kids = root.children(recursive=True)
            now = {"python": _pss(root), "jvm": sum(_pss(p) for p in kids if p.name() == "java"),
                   "workers": sum(_pss(p) for p in kids if p.name() != "java")}
        except psutil.Error:
            now = {}
        rss = sum(now.values())
        for k, v in now.items():
            parts[k] = max(parts[k], v)
        peak = max(peak, rss)
        if cap_bytes and rss > cap_bytes:
            oom = True
            for p in [*root.children(recursive=True), root]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            break
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            break
        time.sleep(0.1)
    out, _ = proc.communicate()
    lines = [ln for ln in (out or "").splitlines() if ln.startswith("RESULT ")]
    res: Dict[str, Any] = json.loads(lines[-1][7:]) if lines else {}
    res.update(peak_rss=peak, peak_rss_parts=parts, oom=oom, rc=proc.returncode)
    return res


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", default="bench", choices=["bench", "_export", "_spark", "_pandas", "_copy"])
    p.add_argument("--scales", default="1,5", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--driver-memory", default="1g")
    p.add_argument("--pandas-cap-gb", type=float, default=2.0,
                   help="kill the pandas run (reported as OOM) when its memory goes over this; the default is "
                        "about what the Spark side uses with a 1 GB heap")
    p.add_argument("--engines", default="spark,pandas,copy", type=lambda s: s.split(","),
                   help="spark: our job; pandas: the single-process baseline; copy: the Spark floor (read, "
                        "split, write; no fit, no transform)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed-for-the-steady-state runs of the whole job before the timed ones, in the same "
                        "process (the first of them is the cold run the table shows)")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed runs of the whole job per engine and scale after the warm-up, in one process; "
                        "the table shows their median and best (the steady state, as on a long-lived cluster "
                        "or kernel)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the Spark sides' sessions, over conf/spark-defaults.conf "
                        "(repeat it; e.g. --conf spark.driver.extraJavaOptions=-XX:+UseG1GC)")
    p.add_argument("--raw")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.mode != "bench":
        {"_export": child_export, "_spark": child_spark, "_pandas": child_pandas,
         "_copy": child_copy}[args.mode](args)
        return
    WORK.mkdir(parents=True, exist_ok=True)
    common = ["--cores", str(args.cores), "--scales", ",".join(map(str, args.scales)), "--repeat", str(args.repeat),
              "--warmup", str(args.warmup), *[f"--conf={kv}" for kv in args.conf]]
    exp = run_child("_export", common)
    if exp["rc"] != 0:
        raise SystemExit(f"exporting the raw flights tables failed (exit {exp['rc']})")
    rows_out = []
    for scale in args.scales:
        raw = str(WORK / f"raw_x{scale}")
        res = {}
        for engine, mode, cap in (("spark", "_spark", None),
                                  ("pandas", "_pandas", int(args.pandas_cap_gb * (1 << 30))),
                                  ("copy", "_copy", None)):
            if engine not in args.engines:
                res[engine] = {"peak_rss": 1, "oom": False, "rc": None}
                continue
            out = str(WORK / f"out_{engine}_x{scale}")
            subprocess.run(["rm", "-rf", out], check=False)
            res[engine] = run_child(mode, [*common, "--driver-memory", args.driver_memory, "--raw", raw,
                                           "--out", out], cap_bytes=cap)
            r = res[engine]
            status = "OOM" if r["oom"] else ("ok" if r.get("seconds") else f"failed (exit {r['rc']})")
            print(f"x{scale} {engine}: {status} {json.dumps(r)}", file=sys.stderr, flush=True)
        rows_out.append((scale, res))
    print_table(rows_out, args)
    write_results(rows_out, args)


def write_results(results: List[Any], args: argparse.Namespace) -> None:
    """``work/bench/preprocess.json``: every timed run per engine and scale (bench/report.py renders it)."""
    import statistics

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import Results

    res = Results("preprocess", {"scales": args.scales, "cores": args.cores, "driver_memory": args.driver_memory,
                                 "warmup": args.warmup, "repeat": args.repeat, "pandas_cap_gb": args.pandas_cap_gb},
                  title="feature preprocessing, conf/flights.yaml spec")
    names = {"spark": "sparktrain (Spark)", "pandas": "pandas/pyarrow, 1 process",
             "copy": "Spark floor (read, split, write)"}
    for scale, by_engine in results:
        for engine, r in by_engine.items():
            if r.get("oom"):
                res.add(f"x{scale} {names[engine]}: steady s", [], "s",
                        note=f"out of memory (> {args.pandas_cap_gb:g} GiB)")
                continue
            if not r.get("seconds"):
                continue
            res.add(f"x{scale} {names[engine]}: cold s", [r["runs"][0]], "s", digits=1)
            res.add(f"x{scale} {names[engine]}: steady s", _steady(r), "s", digits=2)
            res.add(f"x{scale} {names[engine]}: peak MB", [r["peak_rss"] / 2**20], "MB", digits=0)
        s, pd_ = by_engine["spark"], by_engine["pandas"]
        if s.get("seconds") and pd_.get("seconds"):
            pandas_med = statistics.median(_steady(pd_))
            res.add(f"x{scale} Spark / pandas (steady)", [t / pandas_med for t in _steady(s)], "ratio",
                    note="each Spark run over the pandas median")
    res.write()


def _steady(r: Dict[str, Any], key: str = "runs") -> List[float]:
    """The timed runs: the last ``repeat`` of the child's runs (``print_table`` caps it at the runs there are)."""
    values = r.get(key) or []
    return values[-r["repeat"]:] if r.get("repeat") else values


def print_table(results: List[Any], args: argparse.Namespace) -> None:
    import statistics

    extra = "".join(f"; {kv}" for kv in args.conf)
    print(f"\nfeature preprocessing, conf/flights.yaml spec, local[{args.cores}] "
          f"(spark.driver.memory={args.driver_memory}{extra}; pandas capped at {args.pandas_cap_gb:g} GiB; "
          f"{args.warmup} warm-up + {args.repeat} timed run(s) each, in one process per side)")
    head = (f"{'scale':>5} {'rows':>10} | {'spark s':>20} {'rows/s':>9} {'peak MB':>8} | "
            f"{'pandas s':>20} {'rows/s':>9} {'peak MB':>8} | {'time x':>18} {'mem x':>6}")
    print(head)
    print("-" * len(head))
    for scale, res in results:
        for r in res.values():
            r["repeat"] = min(args.repeat, len(r.get("runs") or []))
        s, pd_ = res["spark"], res["pandas"]
        rows = s.get("rows") or pd_.get("rows") or 0

        def cells(r: Dict[str, Any]) -> str:
            if r.get("oom"):
                return f"{'OOM':>20} {'-':>9} {r['peak_rss'] / 2**20:>8.0f}"
            if r.get("rc") is None:
                return f"{'skipped':>20} {'-':>9} {'-':>8}"
            if not r.get("seconds"):
                return f"{'failed':>20} {'-':>9} {r['peak_rss'] / 2**20:>8.0f}"
            steady = _steady(r)
            times = f"{r['runs'][0]:.1f} / {statistics.median(steady):.2f} / {min(steady):.2f}"
            return f"{times:>20} {r['rows'] / statistics.median(steady):>9,.0f} {r['peak_rss'] / 2**20:>8.0f}"

        both = s.get("seconds") and pd_.get("seconds")
        if both:
            med = statistics.median(_steady(s)) / statistics.median(_steady(pd_))
            tx = f"{s['runs'][0] / pd_['runs'][0]:.1f} / {med:.2f} / {min(_steady(s)) / min(_steady(pd_)):.2f}"
        else:
            tx = "-"
        mx = f"{s['peak_rss'] / pd_['peak_rss']:>6.2f}" if both else f"{'-':>6}"
        print(f"{scale:>5} {rows:>10,} | {cells(s)} | {cells(pd_)} | {tx:>18} {mx}")
    print("seconds: first run (cold process) / median / best of the timed runs after the warm-up; rows/s from "
          "the median; time x = spark / pandas for each (lower is better for spark); mem x = spark peak / "
          "pandas peak (PSS of the process tree)")
    for scale, res in results:
        s, c, pd_ = res["spark"], res["copy"], res["pandas"]
        if s.get("steps") and pd_.get("seconds"):
            steady = s["steps"][-s["repeat"]:]
            pandas = statistics.median(_steady(pd_))
            parts = [(name, statistics.median(step[name] for step in steady)) for name in steady[-1] if name != "total"]
            print(f"our job's steps at {scale}x (median): " + ", ".join(
                f"{name} {sec:.2f} s ({sec / pandas:.2f}x pandas' whole job)" for name, sec in parts))
        if c.get("seconds"):
            med = statistics.median(_steady(c))
            ratio = f", {med / statistics.median(_steady(pd_)):.2f}x pandas" if pd_.get("seconds") else ""
            mine = (f"; our job is {statistics.median(_steady(s)) / med:.2f}x the floor" if s.get("seconds") else "")
            print(f"Spark floor at {scale}x (read, split, write the same rows; no checks, fit or transform): "
                  f"{c['runs'][0]:.1f} s cold, {med:.2f} s median{ratio}{mine}")
    for scale, res in results:
        for engine in ("spark", "pandas"):
            if res[engine].get("runs"):
                print(f"{engine} runs at {scale}x, in order (s): " + ", ".join(f"{t:.2f}" for t in res[engine]["runs"]))
    for scale, res in results:
        parts = [f"{engine} {statistics.median(_steady(res[engine], 'cpu')):.1f}"
                 for engine in ("spark", "pandas", "copy") if res[engine].get("cpu")]
        if parts:
            print(f"CPU seconds of the process tree (median of the timed runs) at {scale}x: " + ", ".join(parts))


if __name__ == "__main__":
    main()
