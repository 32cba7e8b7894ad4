"""The Databricks-style source notebooks in notebooks/, executed cell by cell on real local Spark.

A notebook is plain Python: a ``# Databricks notebook source`` header and cells
separated by ``# COMMAND ----------``; markdown cells are ``# MAGIC`` comments.
Each cell is exec'd in one namespace with ``spark`` bound to the session
fixture, as Databricks would run it; the notebook's parameters come from
``NOTEBOOK_<NAME>`` variables for a tiny run (a 3% sample, 1 epoch, a sqlite
MLflow store under tmp).  A failing cell is reported by number and title.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"


def split_cells(path: Path) -> list[str]:
    """The cells of a Databricks source notebook (header checked, empty cells dropped)."""
    text = path.read_text()
    assert text.startswith(HEADER + "\n"), f"{path.name} must start with '{HEADER}'"
    cells = [c.strip("\n") for c in text[len(HEADER) + 1:].split("\n" + SEPARATOR + "\n")]
    return [c for c in cells if c.strip()]


def is_markdown(cell: str) -> bool:
    return all(line.startswith("# MAGIC") for line in cell.splitlines() if line.strip())


def run_notebook(path: Path, namespace: dict) -> list[tuple[int, float]]:
    """Exec every code cell of ``path`` in ``namespace``; returns ``(cell number, seconds)`` per code cell."""
    timings = []
    for number, cell in enumerate(split_cells(path), 1):
        if is_markdown(cell):
            continue
        t0 = time.perf_counter()
        try:
            exec(compile(cell, f"{path.name}[cell {number}]", "exec"), namespace)  # noqa: S102
        except Exception as exc:
            first = next((ln for ln in cell.splitlines() if ln.strip() and not ln.startswith("#")), "")
            raise AssertionError(f"{path.name}: cell {number} ({first!r}) failed: {exc!r}") from exc
        timings.append((number, time.perf_counter() - t0))
    return timings


def test_notebooks_are_databricks_source_format():
    paths = sorted(NOTEBOOKS.glob("*.py"))
    assert paths, "no notebooks"
    for path in paths:
        cells = split_cells(path)
        markdown = [c for c in cells if is_markdown(c)]
        code = [c for c in cells if not is_markdown(c)]
        assert markdown and code, path.name
        assert all(re.match(r"# MAGIC %md\b", c) for c in markdown), path.name  # every markdown cell says so
        for cell in code:  # no stray MAGIC lines inside code cells (Databricks would treat them as magics)
            assert not any(line.startswith("# MAGIC") for line in cell.splitlines()), (path.name, cell[:80])
            compile(cell, path.name, "exec")


@pytest.mark.torch
@pytest.mark.slow
def test_flights_end_to_end_notebook(spark, tmp_path, monkeypatch):
    import mlflow
    from mlflow import MlflowClient

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = {"config": str(REPO / "conf" / "flights.yaml"), "work_dir": str(tmp_path / "work"),
              "sample_percent": "3", "epochs": "1", "num_workers": "2", "tracking_uri": tracking,
              "experiment": "notebook-test", "model_name": "flights-late-notebook"}
    for name, value in params.items():
        monkeypatch.setenv(f"NOTEBOOK_{name.upper()}", value)
    monkeypatch.chdir(tmp_path)  # nothing lands in the repository
    previous = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    ns = {"spark": spark, "__name__": "__main__"}
    try:
        timings = run_notebook(NOTEBOOKS / "01_flights_end_to_end.py", ns)
    finally:
        mlflow.set_tracking_uri(previous[0])  # the notebook's JobTracker sets process-wide URIs
        mlflow.set_registry_uri(previous[1])
    print("cell seconds:", [(n, round(s, 1)) for n, s in timings])

    # ran on the fixture's session, on a ~3% sample, all splits written
    assert ns["spark"] is spark
    rows = ns["dataset"].row_counts
    assert 6_000 < sum(rows.values()) < 14_000 and all(rows[s] > 0 for s in ("train", "validation", "test"))
    assert ns["cfg"].data.source == str(tmp_path / "work" / "flights_sample.parquet")
    assert len(ns["pipeline"].getStages()) >= 3
    # trained across 2 ranks with identical weights, 1 epoch, better than chance on the test split
    launch = ns["launch"]
    assert len(launch.param_digests) == 2 and len(set(launch.param_digests.values())) == 1
    assert [h["epoch"] for h in ns["model"].history] == [0]
    assert ns["metrics"]["test_auc"] > 0.6
    # the fitted model as a Pipeline stage scores raw rows, and agrees with the registered model
    agreement = ns["agreement"]
    assert agreement.rows > 100
    assert agreement.max_diff < 1e-5
    assert 0.0 <= agreement.predicted_late_rate <= 1.0
    assert {"prediction", "probability"} <= set(ns["scored"].columns)
    # MLflow holds the job run, its stage runs and the registered champion
    client = MlflowClient(tracking, tracking)
    job = client.get_run(ns["job_run"].run_id)
    assert job.info.status == "FINISHED"
    runs = client.search_runs([job.info.experiment_id])
    stages = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == job.info.run_id}
    assert {"preprocess", "train"} <= set(stages)
    assert all(r.info.status == "FINISHED" for r in stages.values())
    assert stages["train"].data.metrics["test_auc"] == pytest.approx(ns["metrics"]["test_auc"])
    assert [m.step for m in client.get_metric_history(stages["train"].info.run_id, "val_loss")] == [0]
    champion = client.get_model_version_by_alias("flights-late-notebook", "champion")
    assert int(champion.version) == ns["registered"].version == 1
    assert not os.path.exists(REPO / "notebooks" / "work")
