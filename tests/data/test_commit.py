"""Commits without directory renames (sparktrain.data.commit) and ownership markers checked by content.

Everything here runs through a filesystem that refuses to move a directory
(tests/_nomove.py), as S3, GCS and ABFS do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktrain.data import commit, make_reader
from sparktrain.data.guard import check_replaceable, is_marker
from sparktrain.data.manifest import build_manifest, committed_files, read_manifest, write_manifest
from sparktrain.errors import DatasetExistsError, OutputNotOwnedError

from tests._nomove import no_directory_moves


@pytest.fixture
def nomove(monkeypatch):
    return no_directory_moves(monkeypatch)


def _write(folder: str, values) -> None:
    """A one-file dataset with column x and its manifest, at ``folder``."""
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.table({"x": pa.array(values, pa.float32())}), os.path.join(folder, "part-0.parquet"))
    write_manifest(folder, build_manifest(folder))


def _rows(path: str) -> list:
    with make_reader(path, batch_size=1000, shuffle=False, require_manifest=True) as reader:
        return sorted(float(v) for b in reader for v in b["x"])


def _generation(out: Path, values, parts=("",)) -> commit.Generation:
    with commit.Generation(str(out), "--output") as gen:
        for part in parts:
            _write(os.path.join(gen.uri, part) if part else gen.uri, values)
        gen.commit({"kind": "test"})
    return gen


def test_the_record_commits_a_generation_and_readers_follow_it(tmp_path, nomove):
    out = tmp_path / "out"
    first = _generation(out, [1.0, 2.0])
    record = json.loads((out / "_manifest.json").read_text())
    assert (record["format"], record["path"], record["kind"]) == ("sparktrain.commit/1", first.name, "test")
    assert _rows(str(out)) == [1.0, 2.0]
    assert read_manifest(str(out))["num_rows"] == 2
    assert committed_files(str(out)) == [f"{out}/{first.name}/part-0.parquet"]
    second = _generation(out, [3.0])
    assert _rows(str(out)) == [3.0]
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", second.name])  # the old one went
    assert nomove.refused == [] and nomove.moves == []  # nothing renamed, not even a file


def test_parts_resolve_inside_the_committed_generation(tmp_path, nomove):
    out = tmp_path / "ds"
    gen = _generation(out, [5.0, 6.0, 7.0], parts=("train", "test"))
    assert commit.resolve(str(out / "train")) == f"{out}/{gen.name}/train"
    assert commit.exists(str(out / "test")) and not commit.exists(str(out / "validation"))
    assert _rows(str(out / "train")) == [5.0, 6.0, 7.0]
    assert read_manifest(str(out / "test"))["num_rows"] == 3
    other = tmp_path / "plain"
    _write(str(other), [1.0])  # no record: resolves to itself
    assert commit.resolve(str(other)) == str(other) and _rows(str(other)) == [1.0]


@pytest.mark.parametrize("name, text, words", [
    ("_manifest.json", '{"format": "sparktrain.commit/1", "path": "_gen-', "commit record"),
    ("features.json", '{"features": [', "features.json"),
    ("features.json", '["not", "an", "object"]', "holds a JSON list, not an object"),
])
def test_a_torn_or_foreign_json_file_is_refused_by_name_and_left_in_place(tmp_path, name, text, words):
    from sparktrain.errors import DataError
    from sparktrain.train.inputs import read_features_json

    out = tmp_path / "ds"
    gen = _generation(out, [1.0], parts=("train",))
    torn = (out if name == "_manifest.json" else out / gen.name) / name
    torn.write_text(text)
    with pytest.raises(DataError) as info:
        read_features_json(str(out)) if name == "features.json" else commit.resolve(str(out))
    assert words in str(info.value) and str(torn) in str(info.value)
    assert ("preprocess" if name == "features.json" else "Write the output again") in str(info.value)
    assert torn.read_text() == text and (out / gen.name / "train" / "part-0.parquet").is_file()  # nothing deleted


def test_an_exception_before_the_record_keeps_the_previous_dataset(tmp_path, nomove, monkeypatch):
    out = tmp_path / "out"
    first = _generation(out, [1.0])

    def crash(fs, target, data):
        raise RuntimeError("injected: killed after the data, before the record")

    monkeypatch.setattr(commit, "_write_record", crash)
    with pytest.raises(RuntimeError, match="injected"):
        _generation(out, [9.0, 9.0])
    assert _rows(str(out)) == [1.0]
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", first.name])  # its data removed


def test_a_crash_leaves_the_previous_dataset_readable_and_the_next_run_cleans_up(tmp_path, nomove, monkeypatch):
    out = tmp_path / "out"
    first = _generation(out, [1.0])
    with monkeypatch.context() as m:  # a process killed after its data, before its record: no cleanup ran
        m.setattr(commit, "_write_record", lambda fs, target, data: (_ for _ in ()).throw(SystemExit(137)))
        m.setattr(commit.Generation, "abort", lambda self: None)
        with pytest.raises(SystemExit):
            _generation(out, [9.0, 9.0])
    left = [p.name for p in out.iterdir() if p.name not in ("_manifest.json", first.name)]
    assert len(left) == 1 and left[0].startswith("_gen-")
    assert _rows(str(out)) == [1.0]  # the uncommitted generation is invisible
    check_replaceable(str(out), "--output")  # still sparktrain's
    third = _generation(out, [4.0])  # the next run on the path removes what the crash left
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", third.name])
    assert _rows(str(out)) == [4.0]


def test_a_first_write_that_crashed_leaves_a_folder_sparktrain_may_replace(tmp_path, nomove, monkeypatch):
    out = tmp_path / "new"
    with monkeypatch.context() as m:
        m.setattr(commit, "_write_record", lambda fs, target, data: (_ for _ in ()).throw(SystemExit(137)))
        m.setattr(commit.Generation, "abort", lambda self: None)
        with pytest.raises(SystemExit):
            _generation(out, [9.0])
    assert read_manifest(str(out)) is None  # nothing committed: no dataset
    check_replaceable(str(out), "--output")  # only generations with their marker: ours
    gen = _generation(out, [2.0])
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", gen.name])
    (out / "_gen-user").mkdir()  # a folder named like a generation, without its marker, is not ours
    (out / "_manifest.json").unlink()
    with pytest.raises(OutputNotOwnedError, match=r"'.*new' holds _gen-"):
        check_replaceable(str(out), "--output")


def test_a_gen_folder_without_the_marker_is_kept_by_the_cleanup(tmp_path, nomove, caplog):
    """Probe R: the cleanup of uncommitted generations removed any `_gen-*` folder the record did not name, a
    user's `_gen-userbackup/` included, before the write (which then failed).  Only marked (or empty) ones go."""
    import logging

    out = tmp_path / "out"
    first = _generation(out, [1.0])
    (out / "_gen-userbackup").mkdir()
    (out / "_gen-userbackup" / "x.parquet").write_bytes(b"user data")
    (out / "_gen-empty").mkdir()  # a generation whose marker was never written: nothing to lose
    with caplog.at_level(logging.WARNING, logger="sparktrain.data.commit"):
        second = _generation(out, [2.0])
    assert (out / "_gen-userbackup" / "x.parquet").read_bytes() == b"user data"
    assert "keeping '_gen-userbackup': its name looks like a generation's, but it holds no sparktrain " \
           "_generation.json marker" in caplog.text
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", second.name, "_gen-userbackup"])
    assert not (out / first.name).exists() and _rows(str(out)) == [2.0]


def test_a_dataset_copied_without_its_commit_record_says_so(tmp_path, nomove):
    """Probe R: a committed dataset uploaded without _manifest.json (a copy interrupted before it) read as "holds
    no Parquet files", though a whole generation was there."""
    import shutil

    from sparktrain.data.manifest import build_manifest
    from sparktrain.errors import DataError

    out = tmp_path / "out"
    gen = _generation(out, [1.0])
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "_manifest.json").unlink()
    with pytest.raises(DataError, match=rf"holds generation folder\(s\) \({gen.name}\) but no commit record "
                                        r"\(_manifest.json\).*Copy the whole folder again"):
        build_manifest(str(copy))


def test_an_older_layout_is_read_then_replaced(tmp_path, nomove):
    out = tmp_path / "old"
    _write(str(out), [1.0, 2.0])  # files and a format_version 1 manifest at the top, as sparktrain wrote before
    assert _rows(str(out)) == [1.0, 2.0]
    gen = _generation(out, [3.0])
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", gen.name])  # old files removed
    assert _rows(str(out)) == [3.0]


def test_a_users_files_beside_a_committed_output_are_kept(tmp_path, nomove, caplog):
    """A user's notes put in a committed output folder survive the next write (the probe found them deleted)."""
    out = tmp_path / "out"
    _generation(out, [1.0])
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.csv").write_text("a,b")
    (out / "train").mkdir()  # even a name the earlier layout used: with a record, the output is all in its generation
    (out / "train" / "mine.txt").write_text("mine too")
    with caplog.at_level("WARNING", logger="sparktrain.data.commit"):
        gen = _generation(out, [2.0])
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", gen.name, "notes.txt", "analysis",
                                                           "train"])
    assert (out / "notes.txt").read_text() == "mine" and (out / "analysis" / "plot.csv").read_text() == "a,b"
    assert (out / "train" / "mine.txt").read_text() == "mine too"
    assert _rows(str(out)) == [2.0]
    assert "keeping analysis/, notes.txt, train/ beside the output (sparktrain did not write them" in caplog.text


def test_an_older_layout_is_replaced_but_a_users_file_beside_it_is_kept(tmp_path, nomove):
    out = tmp_path / "old"
    _write(str(out), [1.0, 2.0])  # files and a format_version 1 manifest at the top, as sparktrain wrote before
    (out / "_SUCCESS").write_text("")
    (out / "._SUCCESS.crc").write_text("")
    (out / "README.txt").write_text("what this dataset is")
    gen = _generation(out, [3.0])
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", gen.name, "README.txt"])
    assert (out / "README.txt").read_text() == "what this dataset is"


def test_overwrite_false_refuses_a_committed_output(tmp_path, nomove):
    out = tmp_path / "out"
    _generation(out, [1.0])
    with pytest.raises(DatasetExistsError, match=r"'.*out' already holds a committed output"):
        with commit.Generation(str(out), "the run's data folder", overwrite=False):
            pytest.fail("the body must not run")
    assert _rows(str(out)) == [1.0]


def test_a_failed_first_write_leaves_no_folder(tmp_path, nomove):
    with pytest.raises(RuntimeError):
        with commit.Generation(str(tmp_path / "a"), "--output") as gen:
            _write(gen.uri, [1.0])
            raise RuntimeError("bad data")
    assert list(tmp_path.iterdir()) == []


def test_the_protocol_check_itself_refuses_a_directory_rename(tmp_path, nomove):
    from sparktrain.data.manifest import atomic_dir

    with pytest.raises(OSError, match="an object store has no directory rename"):
        with atomic_dir(str(tmp_path / "cache"), owned=None) as staging:
            _write(staging, [1.0])
    assert nomove.refused


# ---------------------------------------------------------------- markers checked by content


@pytest.mark.parametrize("name, body, ours", [
    ("features.json", {"format": "sparktrain.features/1"}, True),
    ("features.json", {}, False),
    ("features.json", {"format": "someone.elses/1", "features": []}, False),
    ("features.json", ["not", "a", "dict"], False),
    ("_manifest.json", {"format_version": 1, "files": []}, True),
    ("_manifest.json", {"format_version": 99, "files": []}, False),
    ("_manifest.json", {"format_version": 1}, False),
    ("_manifest.json", {"format": "sparktrain.commit/1", "path": "_gen-1"}, True),
    ("_manifest.json", {"format": "sparktrain.commit/1", "path": "../elsewhere"}, False),
    ("_generation.json", {"format": "sparktrain.generation/1"}, True),
])
def test_is_marker(name, body, ours):
    assert is_marker(name, body) is ours


def test_an_unrelated_features_json_does_not_make_a_folder_replaceable(tmp_path):
    out = tmp_path / "project"
    out.mkdir()
    (out / "features.json").write_text(json.dumps({"features": ["age", "income"]}))  # a user's own file
    (out / "model.pkl").write_bytes(b"user data")
    with pytest.raises(OutputNotOwnedError) as err:
        check_replaceable(str(out), "output.path")
    text = str(err.value)
    assert f"output.path '{out}' holds features.json and model.pkl" in text
    assert "its features.json is not sparktrain's: not its format name or a version it knows" in text
    assert (out / "model.pkl").read_bytes() == b"user data"
    (out / "features.json").write_text("not json at all")
    with pytest.raises(OutputNotOwnedError, match="is not sparktrain's"):
        check_replaceable(str(out), "output.path")
    (out / "features.json").write_text(json.dumps({"format": "sparktrain.features/1"}))
    check_replaceable(str(out), "output.path")  # sparktrain's own: replaceable


def test_generation_content_is_the_dataset_numbers(tmp_path, nomove):
    out = tmp_path / "n"
    _generation(out, np.arange(100, dtype=np.float32).tolist())
    files = committed_files(str(out))
    assert len(files) == 1 and pq.read_table(files).num_rows == 100


# ---------------------------------------------------------------- readers keep the generation they read


def test_a_reader_keeps_its_generation_through_another_jobs_commit(tmp_path, nomove, caplog):
    """A fit reads one generation from start to end: a commit meanwhile keeps it, the next write after removes it."""
    out = tmp_path / "out"
    first = _generation(out, [1.0, 2.0])
    with commit.reading(str(out)) as read:
        assert read == f"{out}/{first.name}"
        pins = [p.name for p in tmp_path.iterdir() if ".pin-" in p.name]
        assert len(pins) == 1 and json.loads((tmp_path / pins[0]).read_text())["generation"] == first.name
        second = _generation(out, [3.0])  # another job commits meanwhile
        assert _rows(read) == [1.0, 2.0] and _rows(str(out)) == [3.0]  # the reader's rows; new readers' rows
        assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", first.name, second.name])
        assert "keeping the previous generation" in caplog.text and f"pid {os.getpid()}" in caplog.text
        third = _generation(out, [4.0])  # still read: kept again, the replaced second goes
        assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", first.name, third.name])
    assert [p.name for p in tmp_path.iterdir() if ".pin-" in p.name] == []  # released
    fourth = _generation(out, [5.0])
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", fourth.name])
    assert nomove.moves == []


def test_a_pin_whose_job_is_gone_keeps_nothing(tmp_path, nomove):
    """A reader killed with kill -9 leaves its pin: a dead pid (or a stale heartbeat) does not keep a generation."""
    import subprocess
    import sys
    import time

    from sparktrain.data.lease import Pin

    out = tmp_path / "out"
    first = _generation(out, [1.0])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    for pid, beat in ((int(dead.stdout), time.time()), (os.getpid(), time.time() - 3600)):
        pin = Pin(str(out), first.name)
        body = {**pin.body(), "heartbeat_at": beat}
        body["holder"]["pid"] = pid
        Path(pin.path).write_text(json.dumps(body))
    second = _generation(out, [2.0])
    assert sorted(p.name for p in out.iterdir()) == sorted(["_manifest.json", second.name])
    assert [p.name for p in tmp_path.iterdir() if ".pin-" in p.name] == []  # both removed as stale


def test_reading_the_generation_a_job_wrote_after_another_commit(tmp_path, nomove):
    from sparktrain.errors import DataError

    out = tmp_path / "out"
    first = _generation(out, [1.0])
    with commit.reading(str(out), generation=first.name) as read:
        _generation(out, [2.0])
        assert read == f"{out}/{first.name}" and _rows(read) == [1.0]
    third = _generation(out, [3.0])  # the first write after the reader: the first generation goes
    with pytest.raises(DataError, match=rf"generation {first.name}, which this job wrote, is gone: another job "
                                        rf"committed"):
        with commit.reading(str(out), generation=first.name):
            pytest.fail("must not be reached")
    with commit.reading(str(out)) as read:
        assert read == f"{out}/{third.name}"
    plain = tmp_path / "plain"
    _write(str(plain), [7.0])
    with commit.reading(str(plain)) as read:  # no record: read as it is, no pin
        assert read == str(plain) and not [p for p in tmp_path.iterdir() if ".pin-" in p.name]


def test_a_truncated_part_file_is_named(tmp_path, nomove):
    """Probe R: a part file cut short in an upload gave a bare ArrowInvalid naming no file and no dataset."""
    from sparktrain.errors import DataError
    from sparktrain.train.inputs import column_stats

    out = tmp_path / "out"
    _generation(out, [1.0, 2.0])
    part = next(p for p in out.rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-20])
    with pytest.raises(DataError) as info:
        column_stats(str(part.parent))
    assert f"'{part}' under the dataset" in str(info.value) and "not a readable Parquet file" in str(info.value)
