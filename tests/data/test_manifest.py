"""sparktrain.data.manifest: manifest content, atomic_dir and the Spark writer."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktrain.data import (
    MANIFEST_NAME,
    atomic_dir,
    build_manifest,
    make_reader,
    read_manifest,
    write_manifest,
)
from sparktrain.data.manifest import write_parquet
from sparktrain.errors import ConfigError, DataError, DatasetExistsError, OutputNotOwnedError


def _two_files(d):
    d.mkdir()
    pq.write_table(pa.table({"a": np.arange(10), "b": np.ones(10, np.float32)}), d / "p0.parquet", row_group_size=4)
    pq.write_table(pa.table({"a": np.arange(5), "b": np.ones(5, np.float32)}), d / "p1.parquet")
    (d / "_SUCCESS").write_text("")
    (d / ".p0.parquet.crc").write_text("x")
    return str(d)


def test_build_write_read_manifest(tmp_path):
    p = _two_files(tmp_path / "ds")
    m = build_manifest(p, extra={"lineage": {"run": "abc"}})
    assert m["format_version"] == 1 and m["num_rows"] == 15 and m["lineage"] == {"run": "abc"}
    assert [f["path"] for f in m["files"]] == ["p0.parquet", "p1.parquet"]
    assert m["files"][0]["row_groups"] == [4, 4, 2] and m["files"][1]["row_groups"] == [5]
    assert m["files"][0]["size_bytes"] == os.path.getsize(tmp_path / "ds" / "p0.parquet")
    assert m["files"][0]["sha256"] == hashlib.sha256((tmp_path / "ds" / "p0.parquet").read_bytes()).hexdigest()
    assert m["schema"] == [{"name": "a", "type": "int64", "nullable": True},
                           {"name": "b", "type": "float", "nullable": True}]
    assert read_manifest(p) is None
    write_manifest(p, m)
    assert read_manifest(p) == json.loads((tmp_path / "ds" / MANIFEST_NAME).read_text()) == m
    # the digest follows the content
    assert build_manifest(p)["digest"] == m["digest"]
    pq.write_table(pa.table({"a": np.arange(5) + 1, "b": np.ones(5, np.float32)}), tmp_path / "ds" / "p1.parquet")
    assert build_manifest(p)["digest"] != m["digest"]
    # URIs work the same as paths
    assert build_manifest("file://" + p)["num_rows"] == 15


def test_read_manifest_rejects_garbage(tmp_path):
    p = _two_files(tmp_path / "ds")
    (tmp_path / "ds" / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        read_manifest(p)
    (tmp_path / "ds" / MANIFEST_NAME).write_text(json.dumps({"format_version": 99, "files": []}))
    with pytest.raises(DataError, match="format_version=99"):
        read_manifest(p)


def test_atomic_dir(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(str(final)) as staging:
        assert os.path.basename(staging).startswith(".out.staging-") and not os.path.exists(staging)
        os.makedirs(staging)
        (tmp_path / os.path.basename(staging) / "f.txt").write_text("one")
        (tmp_path / os.path.basename(staging) / MANIFEST_NAME).write_text(  # sparktrain's: replaceable
            json.dumps({"format_version": 1, "files": []}))
        assert not final.exists()
    assert (final / "f.txt").read_text() == "one"
    # failure: nothing left, the old copy intact
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(str(final)) as staging:
            os.makedirs(staging)
            (tmp_path / os.path.basename(staging) / "f.txt").write_text("half")
            raise RuntimeError("boom")
    assert sorted(os.listdir(tmp_path)) == ["out"] and (final / "f.txt").read_text() == "one"
    # overwrite replaces; overwrite=False refuses
    with atomic_dir(str(final)) as staging:
        os.makedirs(staging)
        (tmp_path / os.path.basename(staging) / "g.txt").write_text("two")
    assert os.listdir(final) == ["g.txt"] and sorted(os.listdir(tmp_path)) == ["out"]
    with pytest.raises(OutputNotOwnedError, match="'.*out' holds g.txt, and no sparktrain marker"):
        with atomic_dir(str(final)):  # g.txt alone carries no marker: not replaced again
            pass
    assert os.listdir(final) == ["g.txt"]
    with pytest.raises(DatasetExistsError, match="overwrite=False"):
        with atomic_dir(str(final), overwrite=False):
            pass
    with pytest.raises(DataError, match="nothing was written"):
        with atomic_dir(str(tmp_path / "empty")):
            pass
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_write_parquet_with_spark(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df = (spark.range(0, 5000, numPartitions=2)
          .withColumn("x", (F.col("id") * 2).cast("float"))
          .withColumn("arr", F.array(F.col("x"), F.col("x") + 1)))
    df = VectorAssembler(inputCols=["x", "id"], outputCol="vec").transform(df)
    target = str(tmp_path / "train")
    with atomic_dir(target) as staging:
        m = write_parquet(df, staging, row_group_rows=1000, extra={"split": "train"})
    manifest = read_manifest(target)
    assert manifest == m and m["num_rows"] == 5000 and m["split"] == "train" and len(m["files"]) == 2
    groups = [g for f in m["files"] for g in f["row_groups"]]
    assert sum(groups) == 5000 and max(groups) <= 1000 and len(groups) >= 6
    assert [c["name"] for c in m["schema"]] == ["id", "x", "arr", "vec"]
    with make_reader(target, batch_size=1000, shuffle=False, require_manifest=True) as r:
        batches = list(r)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids) == list(range(5000))
    b = batches[0]
    np.testing.assert_array_equal(b["arr"], np.stack([b["x"], b["x"] + 1], axis=1))
    assert b["vec"].dtype == np.float64 and b["vec"].shape == (1000, 2)
    np.testing.assert_array_equal(b["vec"][:, 1], b["id"])
    with pytest.raises(ConfigError, match="row_group_rows"):
        write_parquet(df, str(tmp_path / "bad"), row_group_rows=0)
