"""The flights job on sparktrain (Spark DataFrames, barrier stages) and on Ray 2.60 (actors), side by side.

Usage (from the repo root)::

    PYTHONPATH=python .venv/bin/python bench/actors.py [--repeats 3] [--kill-step 100] [--no-ray]

Both sides train the same MLP (sparktrain's default network: embeddings + 64-64,
same inputs, Adam, batch 512, the epochs of ``conf/flights.yaml``) on the same
materialized Parquet (``work/flights/dataset``; made by ``sparktrain preprocess
conf/flights.yaml`` when missing), with 2 workers on this machine:

* **sparktrain**, in this process: ``TorchEstimator`` on ``local[2]`` (a barrier
  stage of 2 tasks, DDP over gloo), our reader, and ``sparktrain tune``
  (``tune.mode: single``) for the 8-trial search; the killed-worker run is a
  subprocess on ``local[2,2]`` with ``SPARKTRAIN_FAULT_INJECT`` (rank 1 exits in
  epoch 2) and the barrier stage's retry resuming from the last checkpoint;
* **Ray**, in a subprocess of ``bench/peers/.venv-ray`` (``bench/peers/ray_bench.py``):
  Ray Data reads the Parquet, Ray Train's ``TorchTrainer`` (2 workers) trains,
  ``FailureConfig(max_failures=1)`` restarts after the same kill, and Ray Tune runs
  the same 8 trials.  Ray is bound to 127.0.0.1; the bench lists the listening
  sockets of Ray's processes and says whether anything listens beyond loopback.

Printed side by side (medians of ``--repeats`` with min-max where repeated): time
from ``fit`` to the first step, whole-fit samples/s, reader rows/s, per-trial
overhead, seconds from the killed worker to training again and the steps redone,
test AUC; then the goals, met or not.  Results: ``work/bench/actors.json``.
Without the Ray venv the Ray side is skipped with a message (``--setup-ray``
creates it: ``bash bench/peers/setup-ray.sh``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from benchlib import Results, fmt_spread, met_at_least, met_at_most  # noqa: E402

PEERS = REPO / "bench" / "peers"
RAY_PY = PEERS / ".venv-ray" / "bin" / "python"
WORK = REPO / "work" / "bench" / "actors"
CONFIG = REPO / "conf" / "flights.yaml"
TUNE_SPACE = {"learning_rate": {"loguniform": [5.0e-4, 1.0e-2]},
              "hidden_units": {"choice": [[64, 64], [128, 64], [32]]}}

log = logging.getLogger("bench.actors")


def job_config(trials: int = 8, parallelism: int = 2, tune_epochs: int = 1):
    import yaml

    from sparktrain.config import parse_config

    raw = yaml.safe_load(CONFIG.read_text())
    raw["tracking"] = {"enabled": False}
    raw["train"] = dict(raw["train"], store=str(WORK / "store"), compare_baseline=False)
    raw["tune"] = {"mode": "single", "max_trials": trials, "parallelism": parallelism, "algo": "random",
                   "metric": "val_loss", "space": dict(TUNE_SPACE, epochs={"choice": [tune_epochs]})}
    raw["output"] = dict(raw["output"], path=str(REPO / raw["output"]["path"]))
    return parse_config(raw, str(CONFIG))


def ensure_dataset(spark, cfg) -> str:
    from sparktrain.job import run_preprocess

    root = cfg.output.path
    from sparktrain.train.inputs import read_features_json

    if read_features_json(root) is None:  # no committed dataset there yet
        print(f"materializing flights into {root} (once)...", flush=True)
        run_preprocess(spark, cfg)
    return root


def train_rows(root: str) -> int:
    from sparktrain.data.manifest import read_manifest

    return int(read_manifest(os.path.join(root, "train"))["num_rows"])


# ---------------------------------------------------------------------------------------------- ours
def ours_fit(spark, cfg, root: str) -> Dict[str, Any]:
    from sparktrain.data.commit import resolve
    from sparktrain.train.evaluate import estimator_from_config, evaluate_model

    est = estimator_from_config(cfg.train, cfg.data.label)
    est.show_progress = False
    t0 = time.perf_counter()
    model = est.fit(root)
    total = time.perf_counter() - t0
    auc = evaluate_model(model, spark.read.parquet(resolve(os.path.join(root, "test")))).metrics.get("test_auc")
    return {"first_step_s": est.last_launch.fit_to_first_step_s, "total_s": total,
            "samples_per_s": train_rows(root) * cfg.train.epochs / total, "test_auc": auc,
            "loop_samples_per_s": statistics.median(h["samples_per_s"] for h in model.history),
            "inputs": model.inputs.to_dict()}


def ours_reader(root: str, inputs: Dict[str, Any], batch: int) -> float:
    from sparktrain.data import make_reader

    cols = [*inputs["numeric"], *(c for c, _ in inputs["categorical"]), inputs["label"]]
    t0 = time.perf_counter()
    rows = 0
    with make_reader(os.path.join(root, "train"), cols, batch) as reader:
        for b in reader:
            rows += len(b[inputs["label"]])
    return rows / (time.perf_counter() - t0)


def ours_tune(spark, cfg, root: str) -> Dict[str, Any]:
    from sparktrain.tune.search import run_search

    t0 = time.perf_counter()
    result = run_search(spark, cfg, root)
    wall = time.perf_counter() - t0
    done = [t for t in result.trials if t.status == "FINISHED"]
    compute = statistics.mean(sum(e["epoch_time_s"] for e in t.history) for t in done) if done else None
    return {"wall_s": wall, "trials": len(result.trials), "finished": len(done), "at_once": result.concurrency,
            "compute_s": compute, "best_val_loss": result.best_metric,
            "overhead_s": (wall * result.concurrency / len(result.trials) - compute) if compute else None}


_FAULT_SCRIPT = r"""
import json, os, sys, time
sys.path.insert(0, {python!r}); sys.path.insert(0, {bench!r})
from actors import job_config
from sparktrain.session import get_or_create_session
from sparktrain.train.evaluate import estimator_from_config

cfg = job_config()
spark = get_or_create_session("local[2,2]")   # spark.task.maxFailures=2: a failed barrier stage is retried
events = []
class Steps:
    def on_step(self, epoch, step, metrics): events.append((time.time(), epoch, step))
    def on_epoch(self, epoch, metrics): events.append((time.time(), epoch, -1))
est = estimator_from_config(cfg.train, cfg.data.label).setCallbacks([Steps()])
est.setLogEverySteps(1)
est.show_progress = False
os.environ["SPARKTRAIN_FAULT_INJECT"] = "1:1:{kill_step}:exit"   # rank 1 os._exit()s in epoch 2 (index 1)
t0 = time.time()
model = est.fit({root!r})
total = time.time() - t0
print("RESULT " + json.dumps({{"events": events, "total_s": total, "attempts": est.last_launch.attempts}}))
spark.stop()
"""


def ours_fault(root: str, kill_step: int) -> Dict[str, Any]:
    """Kill rank 1 in epoch 2 (index 1) before step ``kill_step``; the barrier stage's retry resumes."""
    script = _FAULT_SCRIPT.format(python=str(REPO / "python"), bench=str(REPO / "bench"), root=root,
                                  kill_step=kill_step)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1200,
                          check=False)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]}
    out = json.loads(line[0][len("RESULT "):])
    ev = out["events"]
    # the gap: the first step event whose (epoch, step) does not move forward is the resumed stage's first
    for i in range(1, len(ev)):
        (_, e0, s0), (t1, e1, s1) = ev[i - 1][:3], ev[i]
        if s1 >= 0 and s0 >= 0 and (e1, s1) <= (e0, s0):
            last_before = max(t for t, e, s in ev[:i])
            return {"recovery_s": t1 - last_before, "steps_redone": s0 - s1 + 1, "killed_at": [e0, s0],
                    "resumed_at": [e1, s1], "attempts": out["attempts"], "total_s": out["total_s"]}
    return {"error": f"no restart seen in {len(ev)} step events (attempts {out['attempts']})"}


# ---------------------------------------------------------------------------------------------- ray
def ray_side(root: str, inputs: Dict[str, Any], cfg, args) -> Dict[str, List[Dict[str, Any]]]:
    if not RAY_PY.exists():
        if not args.setup_ray:
            return {"skipped": [{"reason": f"no Ray venv at {RAY_PY.relative_to(REPO)}: run "
                                           "`bash bench/peers/setup-ray.sh` (or bench/actors.py --setup-ray)"}]}
        setup = subprocess.run(["bash", str(PEERS / "setup-ray.sh")], capture_output=True, text=True, check=False)
        if setup.returncode != 0 or not RAY_PY.exists():
            tail = (setup.stderr or setup.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"skipped": [{"reason": f"Ray venv setup failed: {tail[0]}"}]}
    WORK.mkdir(parents=True, exist_ok=True)
    inputs_file = WORK / "inputs.json"
    inputs_file.write_text(json.dumps(inputs))
    scratch = Path(tempfile.mkdtemp(prefix="ray-", dir=str(WORK)))
    t = cfg.train
    from sparktrain.data.commit import resolve

    gen = resolve(root)  # Ray reads the committed generation's split folders directly
    cmd = [str(RAY_PY), str(PEERS / "ray_bench.py"), "--train", os.path.join(gen, "train"),
           "--validation", os.path.join(gen, "validation"), "--test", os.path.join(gen, "test"),
           "--inputs", str(inputs_file), "--epochs", str(t.epochs), "--batch", str(t.batch_size),
           "--lr", str(t.learning_rate), "--hidden", *map(str, t.hidden_units), "--emb", str(t.embedding_dim),
           "--workers", str(t.num_workers), "--repeats", str(args.repeats), "--kill-step", str(args.kill_step),
           "--trials", str(cfg.tune.max_trials), "--parallelism", str(cfg.tune.parallelism),
           "--scratch", str(scratch), "--parts", args.ray_parts]
    # Ray's own venv: our PYTHONPATH gives it only sparktrain's executor-side model code (numpy + torch).
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON")}
    env["PYTHONPATH"] = str(REPO / "python")
    env["RAY_TMPDIR"] = str(scratch)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ray_timeout, env=env, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        proc = subprocess.CompletedProcess(cmd, 124, out, "timed out")
    results: Dict[str, List[Dict[str, Any]]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            results.setdefault(r.pop("kind"), []).append(r)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
        results.setdefault("errors", []).append({"exit": proc.returncode, "stderr": tail})
        print(f"ray side exited {proc.returncode}:\n{tail}", flush=True)
    return results


def non_loopback(addrs: List[str]) -> List[str]:
    def loopback(a: str) -> bool:
        host = a.rsplit(":", 1)[0].removeprefix("::ffff:")
        return host.startswith("127.") or host in ("::1", "localhost")
    return sorted(a for a in set(addrs) if not loopback(a))


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kill-step", type=int, default=100)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--setup-ray", action="store_true", help="create bench/peers/.venv-ray when missing")
    ap.add_argument("--ray-parts", default="reader,train,fault,tune")
    ap.add_argument("--ours-parts", default="reader,train,fault,tune")
    ap.add_argument("--ray-timeout", type=int, default=3600)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "hyperopt", "sparktrain"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    WORK.mkdir(parents=True, exist_ok=True)
    parts = args.ours_parts.split(",")

    from sparktrain.session import get_or_create_session

    cfg = job_config(trials=args.trials)
    t0 = time.perf_counter()
    spark = get_or_create_session("local[2]")
    spark.range(1).collect()
    session_s = time.perf_counter() - t0
    root = ensure_dataset(spark, cfg)
    rows = train_rows(root)
    t = cfg.train
    print(f"flights: {rows:,} train rows, {t.epochs} epochs, batch {t.batch_size}, MLP {list(t.hidden_units)}, "
          f"{t.num_workers} workers, {os.cpu_count()} CPUs; {args.repeats} repeats", flush=True)

    ours: Dict[str, Any] = {"session_s": session_s, "fits": [], "reader": []}
    first = ours_fit(spark, cfg, root)  # the first fit: Python workers start and import torch (cold)
    ours["cold_fit"] = first
    inputs = first["inputs"]
    log.info("ours cold fit: %s", {k: v for k, v in first.items() if k != "inputs"})
    if "train" in parts:
        for _ in range(args.repeats):
            ours["fits"].append(ours_fit(spark, cfg, root))
            log.info("ours fit: %s", {k: v for k, v in ours["fits"][-1].items() if k != "inputs"})
    if "reader" in parts:
        for _ in range(args.repeats):
            ours["reader"].append(ours_reader(root, inputs, t.batch_size))
    if "tune" in parts:
        ours["tune"] = ours_tune(spark, cfg, root)
        log.info("ours tune: %s", ours["tune"])
    spark.stop()
    if "fault" in parts:
        ours["fault"] = ours_fault(root, args.kill_step)
        log.info("ours fault: %s", ours["fault"])

    ray = {"skipped": [{"reason": "--no-ray"}]} if args.no_ray else ray_side(root, inputs, cfg, args)
    report(args, cfg, rows, ours, ray)
    return 0


def report(args, cfg, rows: int, ours: Dict[str, Any], ray: Dict[str, Any]) -> None:
    t = cfg.train
    res = Results("actors", {"train_rows": rows, "epochs": t.epochs, "batch": t.batch_size, "workers": t.num_workers,
                             "repeats": args.repeats, "kill_step": args.kill_step, "trials": args.trials},
                  title="flights on sparktrain (Spark) vs Ray 2.60 (Data + Train + Tune)")
    skipped = ray.get("skipped", [{}])[0].get("reason") if "skipped" in ray else None
    fits = ours["fits"] or [ours["cold_fit"]]
    rtrain = [r for r in ray.get("train", []) if not r.get("error")]
    rows_ = []

    def pair(label: str, unit: str, mine: List[float], theirs: List[float], digits: int = 2, note: str = ""):
        a = res.add(f"{label}: sparktrain", mine, unit, digits=digits, note=note)
        b = res.add(f"{label}: Ray", theirs, unit, digits=digits,
                    note=("skipped: " + skipped) if skipped else "")
        rows_.append((label, unit, a, b))

    pair("cluster start (not in fit)", "s", [ours["session_s"]], [r["seconds"] for r in ray.get("init", [])],
         note="SparkSession local[2] vs ray.init()")
    pair("fit -> first step", "s", [f["first_step_s"] for f in fits], [r["first_step_s"] for r in rtrain])
    pair("fit -> first step, first fit (cold workers)", "s", [ours["cold_fit"]["first_step_s"]], [])
    pair("whole fit", "s", [f["total_s"] for f in fits], [r["total_s"] for r in rtrain])
    pair("whole-fit samples/s", "samples/s", [f["samples_per_s"] for f in fits],
         [rows * t.epochs / r["total_s"] for r in rtrain], digits=0)
    pair("training loop samples/s (epochs only)", "samples/s", [f["loop_samples_per_s"] for f in fits],
         [r["steps"] * t.batch_size * t.num_workers / r["train_s"] for r in rtrain if r.get("train_s")], digits=0,
         note="median epoch; ours: the workers' samples_per_s, Ray: steps x batch x workers / epoch loop time")
    pair("reader rows/s (1 process, batch %d)" % t.batch_size, "rows/s", ours["reader"],
         [r["rows"] / r["seconds"] for r in ray.get("reader", [])], digits=0)
    ot, rt = ours.get("tune") or {}, (ray.get("tune") or [{}])[0]
    r_over = (rt["wall_s"] * rt["at_once"] / rt["trials"] - rt["compute_s"]) if rt.get("compute_s") else None
    pair(f"tune: {args.trials} trials wall", "s", [ot["wall_s"]] if ot else [], [rt["wall_s"]] if rt else [])
    pair("tune: per-trial overhead", "s", [ot["overhead_s"]] if ot.get("overhead_s") is not None else [],
         [r_over] if r_over is not None else [],
         note="wall x at-once / trials - the trial's own training+validation time")
    of, rf = ours.get("fault") or {}, (ray.get("fault") or [{}])[0]
    pair("killed worker -> training again", "s", [of["recovery_s"]] if "recovery_s" in of else [],
         [rf["recovery_s"]] if rf.get("recovery_s") is not None else [],
         note=of.get("error", "") or "rank 1 killed in epoch 2")
    pair("steps redone per worker after the kill", "steps", [of["steps_redone"]] if "steps_redone" in of else [],
         [rf["steps_redone"]] if rf.get("steps_redone") is not None else [], digits=0,
         note="here both checkpoint at epoch ends only: the interrupted epoch restarts")
    pair("test AUC", "", [f["test_auc"] for f in fits if f.get("test_auc")],
         [r["test_auc"] for r in rtrain if r.get("test_auc")], digits=4)

    print()
    print(f"| {'measure':<44} | {'sparktrain (Spark)':>24} | {'Ray 2.60':>24} | {'ours / Ray':>10} |")
    print(f"|{'-' * 46}|{'-' * 26}|{'-' * 26}|{'-' * 12}|")
    for label, unit, a, b in rows_:
        ratio = f"{a['median'] / b['median']:.2f}" if a["median"] and b["median"] else "n/a"
        d = a["digits"]
        print(f"| {label + (' (' + unit + ')' if unit else ''):<44} | {fmt_spread(a, d):>24} | "
              f"{fmt_spread(b, d):>24} | {ratio:>10} |")
    print()

    def med(name: str) -> Optional[float]:
        return next((f["median"] for f in res.figures if f["name"] == name), None)

    def ratio_goal(name: str, num: str, den: str, goal: str, check, target: float) -> None:
        a, b = med(num), med(den)
        if a is None or b is None:
            res.goal(name, [], goal, None, note=skipped or "not measured")
        else:
            res.goal(name, [a / b], goal, check([a / b], target), basis="ratio of the medians")

    ratio_goal("whole-fit samples/s, ours / Ray Train", "whole-fit samples/s: sparktrain",
               "whole-fit samples/s: Ray", ">= 3", met_at_least, 3.0)
    ratio_goal("fit -> first step, ours / Ray Train", "fit -> first step: sparktrain", "fit -> first step: Ray",
               "<= 0.5", met_at_most, 0.5)
    a, b = med("tune: per-trial overhead: sparktrain"), med("tune: per-trial overhead: Ray")
    res.goal("per-trial overhead, ours - Ray Tune (s)", [a - b] if a is not None and b is not None else [],
             "< 0", (a < b) if a is not None and b is not None else None, note="" if b is not None else
             (skipped or "not measured"), basis="difference of the medians")
    a, b = med("test AUC: sparktrain"), med("test AUC: Ray")
    res.goal("test AUC, |ours - Ray|", [abs(a - b)] if a is not None and b is not None else [], "<= 0.005",
             (abs(a - b) <= 0.005) if a is not None and b is not None else None, digits=4,
             note=("" if abs(a - b) <= 0.005 else "see bench/shuffle.py: the shuffle window, not the network")
             if a is not None and b is not None else (skipped or "not measured"), basis="difference of the medians")
    listening = sorted({x for r in ray.get("init", []) + ray.get("listeners", []) for x in r.get("listeners", [])})
    if listening:
        outside = non_loopback(listening)
        msg = (f"Ray listened on {len(listening)} sockets, " + ("all on loopback (127.0.0.1)" if not outside else
               f"{len(outside)} beyond loopback: {', '.join(outside)}"))
        res.note(msg)
        print(msg)
    if skipped:
        res.note(f"Ray side skipped: {skipped}")
        print(f"Ray side skipped: {skipped}")
    for err in ray.get("errors", []):
        res.note(f"Ray side exited {err['exit']}: {err['stderr'].splitlines()[-1] if err['stderr'] else ''}")
    if of.get("error"):
        res.note(f"our killed-worker run: {of['error']}")
    res.note("Samples/s = train rows x epochs / whole fit (planning, launch, epochs, validation, model export). "
             "Ours: the median fit after a first (cold) one; Ray starts new worker actors on every fit.")
    res.note("Both run on one 2-core machine shared with other jobs: the figures are noisy; compare ratios.")
    res.write()
    # keep the raw sides too, for the docs
    (WORK / "raw.json").write_text(json.dumps({"ours": {k: v for k, v in ours.items()}, "ray": ray}, indent=1,
                                              default=str))


if __name__ == "__main__":
    sys.exit(main())
