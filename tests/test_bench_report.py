"""bench/report.py: README and docs tables are generated from the benches' JSON, never typed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, str(REPO / "bench"))
    import benchlib

    monkeypatch.setattr(benchlib, "RESULTS", tmp_path / "bench")
    monkeypatch.setattr(sys, "argv", ["bench/reader.py", "--repeats", "3"])
    res = benchlib.Results("reader", {"rows": 10}, title="t")
    fig = res.add("raw", [9.0, 8.0, 10.0], "M rows/s")
    fig["vs_raw"] = benchlib.spread([1.0, 1.0, 1.0])
    res.add("tf.data | graph", [4.0, 5.0, 6.5], "M rows/s", note="in graph")
    res.goal("tf / raw", benchlib.ratios([4.0, 5.0, 6.5], [9.0, 8.0, 10.0]), ">= 0.5",
             benchlib.met_at_least(benchlib.ratios([4.0, 5.0, 6.5], [9.0, 8.0, 10.0]), 0.5))
    res.goal("ours / peer", [], ">= 3", None, note="peer venv missing")
    res.note("noisy machine")
    path = res.write()
    return path


def test_results_json_keeps_runs_median_and_spread(results):
    doc = json.loads(results.read_text())
    assert doc["bench"] == "reader" and doc["command"].endswith("reader.py --repeats 3")
    raw = doc["figures"][0]
    assert raw["runs"] == [9.0, 8.0, 10.0] and raw["median"] == 9.0 and (raw["min"], raw["max"]) == (8.0, 10.0)
    goal = doc["goals"][0]
    assert goal["runs"] == pytest.approx([4 / 9, 5 / 8, 0.65]) and goal["median"] == pytest.approx(0.625)
    assert goal["met"] is True
    assert doc["goals"][1]["met"] is None and doc["goals"][1]["median"] is None


def test_rewrite_replaces_only_marked_blocks(report, results):
    text = ("# Title\nkept\n<!-- bench:reader -->\nold 5.15 best-of figure\n<!-- /bench:reader -->\n"
            "middle\n<!-- bench:reader:goals -->\n<!-- /bench:reader -->\n"
            "<!-- bench:missing -->\nkeep me\n<!-- /bench:missing -->\nend\n")
    warnings = []
    out = report.rewrite(text, results.parent, warn=warnings.append)
    assert "5.15" not in out and out.startswith("# Title\nkept\n") and out.endswith("end\n")
    full = out.split("<!-- bench:reader -->\n")[1].split("<!-- /bench:reader -->")[0]
    assert "| raw | 9.00 (8.00-10.00) | M rows/s | 3 | 1.00x |  |" in full
    assert "| tf.data \\| graph | 5.00 (4.00-6.50) | M rows/s | 3 |  | in graph |" in full
    assert "| tf / raw | 0.62 (0.44-0.65) | >= 0.5 | **met** |" in full
    assert "| ours / peer | n/a | >= 3 | n/a (peer venv missing) |" in full
    assert "- noisy machine" in full and "reader.py --repeats 3" in full
    goals_only = out.split("<!-- bench:reader:goals -->\n")[1].split("<!-- /bench:reader -->")[0]
    assert "| tf / raw |" in goals_only and "| raw |" not in goals_only
    assert "<!-- bench:missing -->\nkeep me\n<!-- /bench:missing -->" in out
    assert len(warnings) == 1 and "missing" in warnings[0]
    assert report.rewrite(out, results.parent, warn=warnings.append) == out  # idempotent


def test_main_rewrites_files(report, results, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("a\n<!-- bench:reader:goals -->\n<!-- /bench:reader -->\n")
    assert report.main(["--results", str(results.parent), str(doc)]) == 0
    assert "| tf / raw |" in doc.read_text()


def test_derived_goal_shows_its_basis(report, tmp_path, monkeypatch):
    import benchlib

    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    res = benchlib.Results("actors", {})
    res.goal("ours / peer", [5.92], ">= 3", True, basis="ratio of the medians")
    path = res.write()
    out = report.rewrite("<!-- bench:actors:goals -->\n<!-- /bench:actors -->\n", path.parent, warn=print)
    assert "| ours / peer | 5.92 (ratio of the medians) | >= 3 | **met** |" in out
