"""How much can pruning gain on part 3 of ``bench/tune.py``?  Learning curves, then a replay.

Usage (from the repo root)::

    PYTHONPATH=python SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$PWD/.venv/bin/python \
        .venv/bin/python bench/tune_bound.py [--configs 64] [--draws 4000]

Part 3 of ``bench/tune.py`` asks for Optuna TPE + ASHA to reach, in half the wall time or less, the
best ``val_loss`` of a 16-trial Hyperopt TPE search (whose 16 trials are random points: Hyperopt's
TPE starts with 20 random ones).  This script measures how far *any* ASHA search that starts from
random points can get on that task, so the goal can be judged against what is reachable:

1. **Curves.**  One search of ``--configs`` random points of the same space (:data:`tune.TTT_SPACE`),
   trained the same ``--epochs`` without pruning, single-task trials, ``--parallelism`` at a time,
   on flights.  Each point's ``val_loss`` after every epoch and its epochs' own time are kept
   (``work/bench/tune_curves.json``; ``--reuse`` replays a kept file).  ``--noise-seeds`` trains the
   4 best points again with other seeds: how much a final ``val_loss`` moves with the seed alone.
2. **Replay.**  ``--draws`` times: the points are shuffled; the first 16 are "Hyperopt" (a random
   search, 2 trials at a time, each trial taking its measured epoch times plus the measured
   per-trial overhead), whose best final ``val_loss`` is the target; the rest, in order, are fed to
   an asynchronous successive-halving search (Optuna's rule: a trial goes on past a rung when its
   value is within the best 1/η of those at that rung so far; η = 3, rungs at 1, 3... epochs), 2 at
   a time, until an epoch reaches the target or Hyperopt's wall is spent.  The ratio is Hyperopt's
   time to target over the pruned search's (0 when not reached), as part 3 counts it.  Three
   pruned searches are replayed on the same draws:

   * ``asha``: promotion by the rung's own ``val_loss`` (what ASHA sees);
   * ``oracle``: promotion by the trial's *final* ``val_loss`` (a rung that predicts perfectly);
   * ``none``: no pruning (a second random search: the control, ratio ~1).

No sampler is modelled: a sampler that learns (TPE) only starts after its random startup trials
(10 in Optuna), so the replay shows whether the goal can be met within those.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

import tune as ttt  # noqa: E402  (bench/tune.py: part 3's space, dataset and config)

CURVES = REPO / "work" / "bench" / "tune_curves.json"
#: the two measures the replay reports (see :func:`simulate`)
MEASURES = {"same": "the target from Hyperopt's own search (part 3's measure)",
            "independent": "an independent target: Hyperopt and the pruned search race to it from other points"}
log = logging.getLogger("bench.tune_bound")


def collect(spark, args) -> Dict[str, Any]:
    """Train ``args.configs`` random points unpruned; their curves, epoch times and per-trial overhead."""
    from dataclasses import replace

    from sparktrain.tune.search import run_search

    dataset = ttt.flights_dataset(spark)
    study_dir = ttt.WORK / "studies"
    study_dir.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(ttt_trials=args.configs, parallelism=args.parallelism, ttt_epochs=args.epochs,
                            ttt_pruner="asha", ttt_min_epochs=1, ttt_optuna_trials=args.configs)
    base = ttt.ttt_config("optuna", ns, args.seed, study_dir)
    cfg = replace(base, tune=replace(base.tune, sampler="random", pruner="none", stop_at=None, time_budget_s=None))
    t0 = time.perf_counter()
    res = run_search(spark, cfg, dataset)
    log.info("%d configs in %.0f s", len(res.trials), time.perf_counter() - t0)
    points = []
    for t in res.trials:
        losses = [float(h["val_loss"]) for h in t.history if isinstance(h.get("val_loss"), (int, float))]
        times = [float(h.get("epoch_time_s") or 0.0) for h in t.history if isinstance(h.get("val_loss"), (int, float))]
        if t.status == "FINISHED" and len(losses) == args.epochs:
            points.append({"params": t.params, "losses": losses, "epoch_s": times,
                           "overhead_s": max(t.seconds - sum(times), 0.0)})
    noise = []
    for p in sorted(points, key=lambda p: p["losses"][-1])[:4] if args.noise_seeds else []:
        finals = [p["losses"][-1]]
        for s in range(args.noise_seeds):
            one = replace(cfg, tune=replace(cfg.tune, max_trials=1, study=None, storage=None, engine="hyperopt",
                                            sampler=None, pruner="none",
                                            space={k: {"choice": [v]} for k, v in p["params"].items()}),
                          train=replace(cfg.train, seed=1000 + s))
            r = run_search(spark, one, dataset)
            finals.append(float(r.best_metric))
        noise.append({"params": p["params"], "finals": finals})
    return {"points": points, "noise": noise, "epochs": args.epochs, "parallelism": args.parallelism}


def _promotable(value: float, seen: List[float], eta: int) -> bool:
    """Optuna's successive-halving rule: ``value`` within the best ``len(seen) // eta`` (at least the best)."""
    ranked = sorted(seen)
    return value <= ranked[max(len(ranked) // eta - 1, 0)]


def replay(points: Sequence[Dict[str, Any]], slots: int, budget_s: Optional[float], target: float, prune: str,
           eta: int, rungs: Sequence[int], overhead_s: float) -> Dict[str, Any]:
    """Run ``points`` in order, ``slots`` at a time, pruned by ``prune`` (none | asha | oracle): a replay in
    time order of the epochs' ends.

    Returns ``hit`` (when an epoch first reached ``val_loss <= target``; None: not within ``budget_s``),
    ``wall`` (the last epoch's end) and ``trials`` (how many were started).
    """
    bound = target * (1 + 1e-9)
    at_rung: Dict[int, List[float]] = {r: [] for r in rungs}
    ends: List[tuple] = []  # (when epoch `done` of point `i` ends, tie-break, i, done)
    seq, nxt, wall = 0, 0, 0.0

    def start(t: float) -> None:
        nonlocal seq, nxt
        if nxt < len(points) and (budget_s is None or t < budget_s):
            heapq.heappush(ends, (t + overhead_s + points[nxt]["epoch_s"][0], seq, nxt, 1))
            seq, nxt = seq + 1, nxt + 1

    for _ in range(slots):
        start(0.0)
    while ends:
        t, _, i, done = heapq.heappop(ends)
        if budget_s is not None and t > budget_s:
            continue  # cut by the budget: the slot is not refilled either
        losses = points[i]["losses"]
        wall = max(wall, t)
        if losses[done - 1] <= bound:
            return {"hit": t, "wall": wall, "trials": nxt}
        go_on = done < len(losses)
        if go_on and done in at_rung and prune != "none":
            value = losses[-1] if prune == "oracle" else losses[done - 1]
            at_rung[done].append(value)
            go_on = _promotable(value, at_rung[done], eta)
        if go_on:
            heapq.heappush(ends, (t + points[i]["epoch_s"][done], seq, i, done + 1))
            seq += 1
        else:
            start(t)
    return {"hit": None, "wall": wall, "trials": nxt}


def _ratio(hyper_hit: Optional[float], pruned_hit: Optional[float]) -> Optional[float]:
    """Hyperopt's time to target over the other search's: 0 when only Hyperopt got there, None when neither."""
    if pruned_hit is None:
        return None if hyper_hit is None else 0.0
    return math.inf if hyper_hit is None else hyper_hit / pruned_hit


def _summary(ratios: Sequence[Optional[float]], started: Sequence[int]) -> Dict[str, Any]:
    rs = sorted(x for x in ratios if x is not None)
    q = [rs[len(rs) // 4], None, rs[(3 * len(rs)) // 4]]  # by rank: inf (only the pruned search got there) sorts
    share = sum(x >= 2 for x in rs) / len(rs)
    return {"median": rs[len(rs) // 2], "p25": q[0], "p75": q[2], "share_ge_2": share,
            "share_reached": sum(x > 0 for x in rs) / len(rs), "trials_started_median": statistics.median(started),
            "goal_odds": 3 * share * share - 2 * share ** 3,  # the median of 3 repeats >= 2
            "neither": sum(x is None for x in ratios) / len(ratios)}


def simulate(data: Dict[str, Any], args) -> Dict[str, Any]:
    """The replay over ``args.draws`` shuffles of the points, for two measures (each: per pruning, the ratios'
    quartiles and shares).

    ``same``, part 3's: the target is the best of Hyperopt's ``args.trials`` points, and Hyperopt's time to
    target is when that same search found it; the other search gets the rest of the points and Hyperopt's wall.
    ``independent``: the target comes from ``args.trials`` points that neither search gets; then Hyperopt (no
    pruning) and the pruned search race to it from half the rest each, within that target search's wall.
    """
    points = data["points"]
    overhead = statistics.median(p["overhead_s"] for p in points)
    rungs, r = [], args.min_epochs
    while r < data["epochs"]:
        rungs.append(r)
        r *= args.eta
    rng = random.Random(args.seed)
    prunes = ("asha", "oracle", "none")
    ratios: Dict[str, Dict[str, List[Optional[float]]]] = {m: {k: [] for k in prunes} for m in MEASURES}
    started: Dict[str, Dict[str, List[int]]] = {m: {k: [] for k in prunes} for m in MEASURES}
    hyper_hits = []

    def run(pts, budget, target, prune):
        return replay(pts, args.parallelism, budget, target, prune, args.eta, rungs, overhead)

    for _ in range(args.draws):
        order = list(points)
        rng.shuffle(order)
        first, rest = order[:args.trials], order[args.trials:]
        target = min(p["losses"][-1] for p in first)
        wall = run(first, None, -1.0, "none")["wall"]  # the whole search (no epoch reaches -1)
        own = run(first, None, target, "none")["hit"]
        hyper_hits.append(own / wall)
        half = len(rest) // 2
        race = run(rest[:half], wall, target, "none")["hit"]
        for prune in prunes:
            same = run(rest, wall, target, prune)
            ratios["same"][prune].append(_ratio(own, same["hit"]))
            started["same"][prune].append(same["trials"])
            other = run(rest[half:], wall, target, prune)
            ratios["independent"][prune].append(_ratio(race, other["hit"]))
            started["independent"][prune].append(other["trials"])
    return {"rungs": rungs, "overhead_s": overhead, "draws": args.draws,
            "summary": {m: {k: _summary(ratios[m][k], started[m][k]) for k in prunes} for m in MEASURES},
            "hyperopt_hit_share_of_wall_median": statistics.median(hyper_hits)}


def describe(data: Dict[str, Any]) -> None:
    finals = sorted(p["losses"][-1] for p in data["points"])
    print(f"{len(finals)} points, final val_loss: best {finals[0]:.5f}, 4th {finals[min(3, len(finals) - 1)]:.5f}, "
          f"median {statistics.median(finals):.5f}, worst {finals[-1]:.5f}")
    for e in (1, 3):
        pairs = [(p["losses"][e - 1], p["losses"][-1]) for p in data["points"]]
        print(f"rank correlation of val_loss after {e} epoch(s) with the final one: {_spearman(pairs):.2f}")
    for n in data.get("noise", []):
        f = n["finals"]
        print(f"seed noise, {n['params']}: finals {', '.join(f'{x:.5f}' for x in f)} "
              f"(spread {(max(f) - min(f)) / min(f) * 100:.2f}%)")


def _spearman(pairs: Sequence[tuple]) -> float:
    def ranks(xs):
        order = sorted(range(len(xs)), key=xs.__getitem__)
        out = [0] * len(xs)
        for r, i in enumerate(order):
            out[i] = r
        return out

    a, b = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    n = len(pairs)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    va = sum((x - ma) ** 2 for x in a) ** 0.5
    vb = sum((y - mb) ** 2 for y in b) ** 0.5
    return cov / (va * vb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", type=int, default=64, help="random points trained for the curves")
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--trials", type=int, default=16, help="Hyperopt's trials (the target is their best)")
    ap.add_argument("--eta", type=int, default=3, help="ASHA's reduction factor")
    ap.add_argument("--min-epochs", type=int, default=1, help="ASHA's first rung")
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--noise-seeds", type=int, default=2, help="other seeds for the 4 best points (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse", action="store_true", help=f"replay {CURVES.relative_to(REPO)}, train nothing")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "hyperopt", "sparktrain"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.reuse:
        data = json.loads(CURVES.read_text())
    else:
        ttt.WORK.mkdir(parents=True, exist_ok=True)
        spark = ttt.session(args.parallelism)
        ttt.warm_up(spark, args.parallelism)
        data = collect(spark, args)
        spark.stop()
        CURVES.parent.mkdir(parents=True, exist_ok=True)
        CURVES.write_text(json.dumps(data, indent=1))
    describe(data)
    sim = simulate(data, args)
    print(f"\nreplay: {sim['draws']} draws, {args.trials} Hyperopt trials, rungs {sim['rungs']} (eta {args.eta}), "
          f"{args.parallelism} at a time, {sim['overhead_s']:.2f} s overhead a trial; Hyperopt reaches its own best "
          f"at {sim['hyperopt_hit_share_of_wall_median'] * 100:.0f}% of its wall (median)")
    for measure, label in MEASURES.items():
        print(f"\n{label}:")
        print("| pruning | median ratio | quartiles | share >= 2x | share reached | trials started (median) "
              "| odds a median of 3 is >= 2 |")
        print("|---|---|---|---|---|---|---|")
        for prune, s in sim["summary"][measure].items():
            print(f"| {prune} | {s['median']:.2f} | {s['p25']:.2f}-{s['p75']:.2f} | {s['share_ge_2'] * 100:.0f}% | "
                  f"{s['share_reached'] * 100:.0f}% | {s['trials_started_median']:.0f} | {s['goal_odds'] * 100:.0f}% |")
    data["replay"] = sim
    CURVES.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
