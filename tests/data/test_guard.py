"""Guarded outputs: preprocess, score and atomic_dir replace only folders sparktrain wrote (sparktrain.data.guard).

Every refusal is checked three ways: the error type, a message that names the
path (and what it holds or overlaps) and the fix, and the user's files still there.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from sparktrain.cli import main
from sparktrain.config import load_config
from sparktrain.errors import DatasetExistsError, OutputNotOwnedError, OutputOverlapError, PathNotWritableError

REPO = Path(__file__).resolve().parents[2]
FLIGHTS_YAML = REPO / "conf" / "flights.yaml"
MISSING_SOURCE = "/nonexistent/sparktrain/raw.parquet"  # never read: each refusal comes first


def _user_folder(path: Path) -> Path:
    """A folder of a user's files: report.pdf, notes/todo.txt."""
    (path / "notes").mkdir(parents=True)
    (path / "report.pdf").write_bytes(b"%PDF-1.7 the user's report")
    (path / "notes" / "todo.txt").write_text("keep me")
    return path


def _intact(path: Path) -> bool:
    return ((path / "report.pdf").read_bytes() == b"%PDF-1.7 the user's report"
            and (path / "notes" / "todo.txt").read_text() == "keep me")


def _cfg(output, source=MISSING_SOURCE, *overrides):
    return load_config(FLIGHTS_YAML, overrides=[f"output.path={output}", f"data.source={source}", *overrides])


def _preprocess(cfg, spark):
    from sparktrain.features.materialize import materialize

    return materialize(spark, cfg)


# ---------------------------------------------------------------- what the folder holds


def test_preprocess_cli_refuses_a_folder_of_user_files_and_keeps_them(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    reports = _user_folder(tmp_path / "reports")
    rc = main(["preprocess", str(FLIGHTS_YAML), "--set", "output.path=reports", "--set", "tracking.enabled=false",
               "--set", f"data.source={MISSING_SOURCE}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert ("error: output.path 'reports' holds notes/ and report.pdf, and no sparktrain marker "
            "(features.json or _manifest.json)") in err
    assert "Fix: choose an empty or new folder for output.path, or delete 'reports' yourself" in err
    assert _intact(reports)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]  # no staging folder, no work/


def test_a_refused_folder_lists_five_entries_and_counts_the_rest(spark, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for i in range(17):
        (out / f"f{i:02d}.csv").write_text("x")
    with pytest.raises(OutputNotOwnedError) as err:
        _preprocess(_cfg(out), spark)
    assert f"output.path '{out}' holds f00.csv, f01.csv, f02.csv, f03.csv, f04.csv and 12 more" in str(err.value)
    assert err.value.total == 17 and len(list(out.iterdir())) == 17


def test_a_file_at_output_path_is_refused(spark, tmp_path):
    target = tmp_path / "dataset"
    target.write_text("a user's file")
    with pytest.raises(OutputNotOwnedError, match=r"holds a file \(13 bytes\), not a folder"):
        _preprocess(_cfg(target), spark)
    assert target.read_text() == "a user's file"


def test_overwrite_false_refuses_even_a_sparktrain_folder_before_any_job(spark, tmp_path):
    out = tmp_path / "dataset"
    out.mkdir()
    (out / "features.json").write_text("{}")
    with pytest.raises(DatasetExistsError, match=r"output.path '.*dataset' already exists and overwrite is off.*"
                                                 r"set output.overwrite: true"):
        _preprocess(_cfg(out, MISSING_SOURCE, "output.overwrite=false"), spark)
    assert (out / "features.json").read_text() == "{}"


def test_an_empty_folder_is_filled_and_a_sparktrain_dataset_is_replaced(spark, flights_sample, tmp_path,
                                                                        monkeypatch):
    """Through a filesystem that cannot move a directory (as S3): the commit protocol never renames one."""
    from sparktrain.features.materialize import materialize
    from sparktrain.features.spec import parse_features

    from tests._nomove import no_directory_moves

    nomove = no_directory_moves(monkeypatch)

    out = tmp_path / "dataset"
    out.mkdir()
    cfg = replace(_cfg(out), features=parse_features([{"name": "distance", "type": "numeric"}]))
    first = materialize(spark, cfg, flights_sample)
    gen = Path(first.generation)
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", gen.name])  # the record + generation
    assert sorted(p.name for p in gen.iterdir()) == ["_generation.json", "features.json", "pipeline_model", "test",
                                                     "train", "validation"]
    assert [f["name"] for f in first.features["features"]] == ["distance"]
    cfg = replace(cfg, features=parse_features([{"name": "distance", "type": "numeric"},
                                                {"name": "dep_delay", "type": "numeric"}]))
    second = materialize(spark, cfg, flights_sample)  # the commit record marks it as sparktrain's: replaced
    meta = json.loads((Path(second.generation) / "features.json").read_text())
    assert [f["name"] for f in meta["features"]] == ["distance", "dep_delay"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", Path(second.generation).name])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]  # no staging, old copy or lease left
    assert nomove.refused == [] and nomove.moves == []  # not a folder, not even a file was renamed


# ---------------------------------------------------------------- where the folder is


def test_output_path_dot_is_the_current_directory(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputOverlapError) as err:
        _preprocess(_cfg("."), spark)
    assert f"config key 'output.path' = '.': it is the current directory ({os.path.realpath(tmp_path)})" \
        in str(err.value)
    assert "Fix: point it at a folder of its own" in str(err.value)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_output_path_above_the_current_directory_is_refused(spark, tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    with pytest.raises(OutputOverlapError, match=r"'\.\.': it holds the current directory"):
        _preprocess(_cfg(".."), spark)


def test_output_path_home_is_refused(spark, tmp_path, monkeypatch):
    home = _user_folder(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(OutputOverlapError, match=rf"'{home}': it is the home directory \({home}\)"):
        _preprocess(_cfg(home), spark)
    assert _intact(home)


def test_output_path_root_is_refused(spark):
    with pytest.raises(OutputOverlapError, match=r"config key 'output.path' = '/': it is the root of the filesystem"):
        _preprocess(_cfg("/"), spark)


def test_output_inside_the_source_is_refused(spark, tmp_path):
    raw = _user_folder(tmp_path / "raw")
    with pytest.raises(OutputOverlapError, match=rf"it lies inside data.source '{raw}'.*beside the input"):
        _preprocess(_cfg(raw / "dataset", raw), spark)
    assert _intact(raw) and not (raw / "dataset").exists()


def test_source_inside_the_output_is_refused(spark, tmp_path):
    out = tmp_path / "out"
    source = out / "raw.csv"
    out.mkdir()
    source.write_text("a,b\n1,2\n")
    with pytest.raises(OutputOverlapError, match=rf"'{out}': it holds data.source '{source}'"):
        _preprocess(_cfg(out, source, "data.format=csv"), spark)
    assert source.read_text() == "a,b\n1,2\n"


def test_output_inside_the_store_and_the_store_inside_the_output_are_refused(spark, tmp_path):
    store = tmp_path / "store"
    with pytest.raises(OutputOverlapError, match=rf"it lies inside train.store '{store}'"):
        _preprocess(_cfg(store / "dataset", MISSING_SOURCE, f"train.store={store}"), spark)
    out = tmp_path / "out"
    with pytest.raises(OutputOverlapError, match=rf"'{out}': it holds train.store '{out / 'store'}'"):
        _preprocess(_cfg(out, MISSING_SOURCE, f"train.store={out / 'store'}"), spark)
    with pytest.raises(OutputOverlapError, match=rf"it is train.store '{store}'"):
        _preprocess(_cfg(store, MISSING_SOURCE, f"train.store={store}"), spark)


def test_output_the_mlflow_store_folder_is_refused(spark, tmp_path):
    mlflow_dir = tmp_path / "mlflow"
    mlflow_dir.mkdir()
    (mlflow_dir / "mlflow.db").write_bytes(b"SQLite format 3\x00")
    uri = f"sqlite:///{mlflow_dir / 'mlflow.db'}"
    with pytest.raises(OutputOverlapError, match=rf"it holds the MLflow store \({uri}\)"):
        _preprocess(_cfg(mlflow_dir, MISSING_SOURCE, f"tracking.uri={uri}"), spark)
    arts = tmp_path / "artifacts"
    with pytest.raises(OutputOverlapError, match=r"it lies inside the MLflow artifact folder"):
        _preprocess(_cfg(arts / "ds", MISSING_SOURCE, f"tracking.artifact_location={arts}"), spark)
    assert (mlflow_dir / "mlflow.db").read_bytes() == b"SQLite format 3\x00"


def test_symlinks_do_not_hide_an_overlap(spark, tmp_path):
    raw = _user_folder(tmp_path / "raw")
    (tmp_path / "link").symlink_to(raw)
    with pytest.raises(OutputOverlapError, match="it lies inside data.source"):
        _preprocess(_cfg(tmp_path / "link" / "dataset", raw), spark)


def test_the_store_is_refused_at_home_cwd_root_or_inside_the_dataset_or_source(tmp_path, monkeypatch):
    from sparktrain.data.guard import check_job_paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for store, match in [(".", "it is the current directory"), (str(tmp_path / "home"), "it is the home directory"),
                         ("/", "it is the root of the filesystem"),
                         ("out/store", "it lies inside output.path \\(the materialized dataset\\) 'out'"),
                         ("raw/store", "it lies inside data.source 'raw'")]:
        cfg = _cfg("out", "raw", f"train.store={store}")
        with pytest.raises(OutputOverlapError, match=match):
            check_job_paths(cfg, ("train",))
    check_job_paths(_cfg("out", "raw", "train.store=work/store"), ("train",))  # beside both: fine


# ---------------------------------------------------------------- a folder this process cannot write


@pytest.fixture
def read_only(tmp_path):
    """A folder this process cannot write: mode 0o500, or for root (who ignores modes) immutable (chattr +i)."""
    import subprocess

    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False).returncode != 0:
        pytest.skip("running as root, which ignores permissions, and chattr +i is not allowed here")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=False)


def test_the_cli_names_a_read_only_store_or_output_before_any_job(spark, tmp_path, read_only, capsys):
    cases = [
        (["train", str(FLIGHTS_YAML), "--set", f"train.store={read_only}", "--set", "tracking.enabled=false",
          "--set", f"output.path={tmp_path / 'dataset'}"], "train.store", str(read_only), "it"),
        (["preprocess", str(FLIGHTS_YAML), "--set", f"output.path={read_only / 'dataset'}", "--set",
          "tracking.enabled=false", "--set", f"data.source={MISSING_SOURCE}"], "output.path",
         str(read_only / "dataset"), f"'{read_only}', where it would be made,"),
        (["score", "--model", "models:/m@champion", "--input", str(tmp_path / "raw.parquet"), "--output",
          str(read_only), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"], "--output", str(read_only), "it"),
    ]
    for argv, what, value, where in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 1, (what, err)
        kind = "option" if what.startswith("--") else "config key"
        assert (f"error: {kind} '{what}' = '{value}': {where} is not writable by this process, so nothing can "
                f"be written there. Fix: make it writable (chmod u+w, chattr -i, a read-write mount), or point "
                f"{what} at a folder you can write") in err, err
        assert "Traceback" not in err
    assert list(read_only.iterdir()) == [] and not (tmp_path / "mlflow.db").exists()


def test_fit_names_a_read_only_store_or_a_file_before_the_run_lease(spark, tmp_path, read_only):
    from sparktrain.train.estimator import TorchEstimator

    with pytest.raises(PathNotWritableError) as err:
        TorchEstimator(labelCol="label", store=str(read_only)).fit(MISSING_SOURCE)
    assert err.value.path == "store" and err.value.folder == str(read_only)
    assert f"config key 'store' = '{read_only}': it is not writable" in str(err.value)
    assert isinstance(err.value, PermissionError) and list(read_only.iterdir()) == []
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    for store in (a_file, a_file / "runs"):  # fit used to fail on the run's lease with NotADirectoryError
        with pytest.raises(OutputOverlapError, match=f"'{a_file}' is a file, not a folder, so no run folder"):
            TorchEstimator(labelCol="label", store=str(store)).fit(MISSING_SOURCE)
    assert a_file.read_text() == "mine"


# ---------------------------------------------------------------- atomic_dir: the last line of defence


def test_atomic_dir_refuses_a_user_folder_on_entry_and_before_the_swap(tmp_path):
    from sparktrain.data.manifest import atomic_dir

    user = _user_folder(tmp_path / "user")
    with pytest.raises(OutputNotOwnedError, match="holds notes/ and report.pdf"):
        with atomic_dir(str(user)):
            pytest.fail("the body must not run")
    assert _intact(user)
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "_manifest.json").write_text(json.dumps({"format_version": 1, "files": []}))
    with pytest.raises(OutputNotOwnedError, match="holds notes/ and report.pdf"):
        with atomic_dir(str(ours)) as staging:
            Path(staging).mkdir()
            (Path(staging) / "new.parquet").write_text("new")
            (ours / "_manifest.json").unlink()  # meanwhile someone replaced it by their own files
            _user_folder(ours)
    assert _intact(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "user"]  # the staging folder went


# ---------------------------------------------------------------- sparktrain score --output


def test_score_cli_refuses_a_folder_of_user_files_before_the_model_is_read(spark, tmp_path, capsys):
    out = _user_folder(tmp_path / "scored")
    rc = main(["score", "--model", "models:/no-such-model@champion", "--input", str(tmp_path / "raw.parquet"),
               "--output", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"error: --output '{out}' holds notes/ and report.pdf, and no sparktrain marker" in err
    assert "Fix: choose an empty or new folder for --output" in err
    assert _intact(out) and not (tmp_path / "mlflow.db").exists()  # refused before the registry was opened


@pytest.mark.parametrize("output, problem", [
    ("{tmp}/raw.parquet", "it is --input"),
    ("{tmp}/raw.parquet/out", "it lies inside --input"),
    ("{tmp}", "it holds --input"),
    ("{tmp}/mlflow", "it holds the MLflow store"),
])
def test_score_cli_refuses_overlapping_outputs(spark, tmp_path, capsys, output, problem):
    raw = tmp_path / "raw.parquet"
    raw.mkdir()
    (raw / "part-0.parquet").write_bytes(b"PAR1")
    target = output.format(tmp=tmp_path)
    rc = main(["score", "--model", "models:/m@champion", "--input", str(raw), "--output", target,
               "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"error: option '--output' = '{target}': {problem}" in err
    assert (raw / "part-0.parquet").read_bytes() == b"PAR1"
