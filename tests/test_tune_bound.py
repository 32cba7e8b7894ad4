"""bench/tune_bound.py: the replay of learning curves follows Optuna's successive-halving rule and the clock."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bound():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_tune_bound", REPO / "bench" / "tune_bound.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _point(losses, epoch_s=1.0):
    return {"losses": list(losses), "epoch_s": [epoch_s] * len(losses), "overhead_s": 0.0}


def test_unpruned_replay_runs_points_in_order_on_free_slots(bound):
    pts = [_point([0.9, 0.8, 0.7]), _point([0.9, 0.6, 0.5], epoch_s=2.0), _point([0.4, 0.3, 0.2])]
    # slot 1: point 0 (0-3 s) then point 2 (3-6 s); slot 2: point 1 (0-6 s); 0.5 s overhead each
    out = bound.replay(pts, 2, None, 0.3, "none", 3, [1], 0.5)
    assert out["hit"] == pytest.approx(3.5 + 0.5 + 2.0)  # point 2's 2nd epoch, on slot 1
    assert out["trials"] == 3
    whole = bound.replay(pts, 2, None, -1.0, "none", 3, [1], 0.5)
    assert whole["hit"] is None and whole["wall"] == pytest.approx(7.0)
    cut = bound.replay(pts, 2, 5.0, 0.3, "none", 3, [1], 0.5)
    assert cut["hit"] is None  # the budget ends before point 2 gets there


def test_pruned_replay_applies_optunas_rule_at_each_rung(bound):
    # one slot: point 0 sets rung 1; point 1 is worse there, so it stops after 1 epoch; point 2 is better
    pts = [_point([0.5, 0.4, 0.3]), _point([0.6, 0.1, 0.1]), _point([0.45, 0.35, 0.25])]
    asha = bound.replay(pts, 1, None, 0.25, "asha", 3, [1], 0.0)
    assert asha["hit"] == pytest.approx(3 + 1 + 3)
    # the oracle ranks by the final value: point 1 (0.1) goes on, and reaches 0.25 at its 2nd epoch
    oracle = bound.replay(pts, 1, None, 0.25, "oracle", 3, [1], 0.0)
    assert oracle["hit"] == pytest.approx(3 + 2)
    # Optuna's rule: among n values at a rung, the best n // 3 go on (the best one while n < 3)
    assert bound._promotable(0.2, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 3)
    assert not bound._promotable(0.3, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 3)
    assert bound._promotable(0.1, [0.1, 0.2], 3) and not bound._promotable(0.2, [0.1, 0.2], 3)


def test_identical_searches_score_about_one_on_the_independent_measure(bound):
    import random

    rng = random.Random(3)
    points = []
    for _ in range(64):
        final = 0.25 + rng.random() * 0.05
        points.append(_point([final + 0.1 / (e + 1) for e in range(8)] + [final]))
    args = argparse.Namespace(min_epochs=1, eta=3, seed=0, draws=400, trials=16, parallelism=2)
    sim = bound.simulate({"points": points, "epochs": 9}, args)
    assert sim["rungs"] == [1, 3]
    same, independent = sim["summary"]["same"], sim["summary"]["independent"]
    assert 0.75 <= independent["none"]["median"] <= 1.33  # two unpruned random searches: a coin toss
    assert same["none"]["median"] < 1  # the target's own search found it first: the measure's bias
    assert same["asha"]["median"] > same["none"]["median"]  # pruning pays on curves that rank early
