"""The JVM lineage listener (src/main/scala, sparktrain.jvm): what queries read and wrote, on real Spark."""

from __future__ import annotations

import hashlib
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def recorder_cls(spark):
    from sparktrain.jvm import LineageRecorder, listener_jar

    assert listener_jar() is not None, "build/libs/sparktrain-listener.jar is missing: run `make jar`"
    assert LineageRecorder(spark).active, "the lineage listener is not on the driver's class path"
    return LineageRecorder


def _write_raw(path, parts):
    os.makedirs(path, exist_ok=True)
    for i, n in enumerate(parts):
        pq.write_table(pa.table({"k": list(range(n)), "x": [float(v) for v in range(n)]}),
                       os.path.join(path, f"part-{i}.parquet"))


def _listing_sha256(spark, path):
    """The digest the listener computes: sha256 of 'path<TAB>length<TAB>mtime-ms' per file, sorted by path."""
    jvm = spark.sparkContext._jvm
    fs_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = fs_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    lines = sorted((str(s.getPath().toString()), s.getLen(), s.getModificationTime()) for s in fs.listStatus(fs_path)
                   if str(s.getPath().getName()).endswith(".parquet"))
    return hashlib.sha256("".join(f"{p}\t{n}\t{m}\n" for p, n, m in lines).encode()).hexdigest()


def test_reads_and_writes_are_recorded_with_files_bytes_and_digest(spark, recorder_cls, tmp_path):
    raw, out = str(tmp_path / "raw"), str(tmp_path / "out")
    _write_raw(raw, [100, 50])
    with recorder_cls(spark) as rec:
        assert spark.read.parquet(raw).where("k >= 10").count() == 130
        spark.read.parquet(raw).write.parquet(out)
        assert spark.read.parquet(out).count() == 150
    events = rec.events()
    assert [e["action"] for e in events] == ["count", "command", "count"]
    read = events[0]["inputs"]
    assert len(read) == 1 and events[0]["outputs"] == []
    assert read[0]["format"] == "parquet" and read[0]["paths"] == [f"file:{raw}"]
    assert read[0]["files"] == 2
    assert read[0]["size_bytes"] == sum(os.path.getsize(os.path.join(raw, f)) for f in os.listdir(raw))
    assert read[0]["digest"] == _listing_sha256(spark, raw)
    written = events[1]["outputs"]
    assert [(o["path"], o["format"], o["mode"]) for o in written] == [(f"file:{out}", "parquet", "ErrorIfExists")]
    assert events[1]["inputs"] == read
    # the sources: what the work started from, not what it wrote and read back
    assert rec.sources() == read
    assert rec.sources(exclude=[raw]) == []


def test_digest_follows_the_files_not_the_path(spark, recorder_cls, tmp_path):
    raw = str(tmp_path / "raw")
    _write_raw(raw, [10])
    with recorder_cls(spark) as rec:
        spark.read.parquet(raw).count()
        spark.read.parquet(raw).count()
    first, again = [e["inputs"][0]["digest"] for e in rec.events()]
    assert first == again
    _write_raw(raw, [10, 5])  # a file more
    with recorder_cls(spark) as rec:
        spark.read.parquet(raw).count()
    (changed,) = rec.sources()
    assert changed["files"] == 2 and changed["digest"] != first


def test_csv_join_lists_every_source_once(spark, recorder_cls, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("k,x\n1,10\n2,20\n")
    b.write_text("k,y\n1,a\n3,c\n")
    with recorder_cls(spark) as rec:
        left = spark.read.option("header", True).csv(str(a))
        right = spark.read.option("header", True).csv(str(b))
        assert left.join(right, "k").count() == 1
    sources = rec.sources()
    assert sorted((s["format"], s["paths"][0], s["files"]) for s in sources) == [
        ("csv", f"file:{a}", 1), ("csv", f"file:{b}", 1)]


def test_records_only_this_sessions_work_inside_the_block(spark, recorder_cls, tmp_path):
    raw, other_raw = str(tmp_path / "raw"), str(tmp_path / "other")
    _write_raw(raw, [10])
    _write_raw(other_raw, [20])
    cls = spark.sparkContext._jvm.io.sparktrain.lineage.LineageListener
    spark.read.parquet(raw).count()  # no recording open: nothing is kept
    with recorder_cls(spark) as rec:
        other = spark.newSession()
        with recorder_cls(other) as other_rec:
            assert other.read.parquet(other_raw).count() == 20
        assert spark.read.parquet(raw).count() == 10
    spark.read.parquet(raw).count()  # after the block: not this block's
    assert [s["paths"] for s in rec.sources()] == [[f"file:{raw}"]]
    assert [s["paths"] for s in other_rec.sources()] == [[f"file:{other_raw}"]]
    last = cls.lastId()
    spark.read.parquet(raw).count()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
    assert cls.lastId() == last  # with no recorder open the listener does nothing


def test_materialize_stores_its_sources_in_features_json(spark, recorder_cls, flights_sample, tmp_path):
    from dataclasses import replace

    from sparktrain.config import load_config
    from sparktrain.features.materialize import materialize
    from sparktrain.jvm import local_path

    sample = os.path.dirname(local_path(flights_sample.inputFiles()[0]))
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "conf", "flights.yaml"))
    cfg = replace(cfg, data=replace(cfg.data, source=sample, format="parquet"),
                  output=replace(cfg.output, path=str(tmp_path / "dataset")))
    result = materialize(spark, cfg)
    meta = json.loads(Path(result.features_json).read_text())
    (source,) = meta["dataset"]["sources"]  # not the staging folder, not the splits it wrote
    assert source == result.features["dataset"]["sources"][0]
    assert (source["format"], source["paths"], source["digest"]) == ("parquet", [f"file:{sample}"],
                                                                     _listing_sha256(spark, sample))


def test_materialize_of_a_dataframe_names_its_source_not_the_staging_copy(spark, recorder_cls, flights_sample,
                                                                         tmp_path):
    from dataclasses import replace

    from sparktrain.config import load_config
    from sparktrain.features.materialize import materialize
    from sparktrain.jvm import local_path

    sample = os.path.dirname(local_path(flights_sample.inputFiles()[0]))
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "conf", "flights.yaml"))
    cfg = replace(cfg, output=replace(cfg.output, path=str(tmp_path / "dataset")))
    result = materialize(spark, cfg, spark.read.parquet(sample))  # a DataFrame: staged to staged_input/ first
    assert [(s["format"], s["paths"]) for s in result.features["dataset"]["sources"]] == [
        ("parquet", [f"file:{sample}"])]


def test_source_inputs_paths_compare_as_local_paths_and_drop_schema_inference_reads():
    from sparktrain.jvm import source_inputs

    events = [
        {"inputs": [{"kind": "files", "format": "text", "paths": ["file:/data/csv/a.csv", "file:/data/csv/b.csv"]}],
         "outputs": []},
        {"inputs": [{"kind": "files", "format": "csv", "paths": ["file:/data/csv"], "digest": "d1"}],
         "outputs": [{"path": "file:/out/.x.staging-1/staged_input"}]},
        {"inputs": [{"kind": "files", "format": "parquet", "paths": ["file:/out/.x.staging-1/staged_input"]},
                    {"kind": "files", "format": "parquet", "paths": ["s3a://bucket/raw/"]},
                    {"kind": "files", "format": "parquet", "paths": ["s3a://bucket/tmp/part"]},
                    {"kind": "files", "format": "parquet", "paths": ["file:///elsewhere/x"]}],
         "outputs": []},
    ]
    kept = source_inputs(events, exclude=["s3a://bucket/tmp/", "file:///elsewhere"])
    assert [(i["format"], i["paths"]) for i in kept] == [("csv", ["file:/data/csv"]),
                                                         ("parquet", ["s3a://bucket/raw/"])]


def test_missing_jar_names_the_path_and_the_fix(monkeypatch, tmp_path):
    from sparktrain.errors import MissingDependencyError
    from sparktrain.jvm import JAR_ENV, listener_jar

    missing = str(tmp_path / "nope.jar")
    monkeypatch.setenv(JAR_ENV, missing)
    assert listener_jar() is None
    with pytest.raises(MissingDependencyError) as err:
        listener_jar(required=True)
    assert missing in str(err.value) and "SPARKTRAIN_JAR" in str(err.value) and "make jar" in str(err.value)


def test_spark_jars_gets_the_jar_once(monkeypatch, tmp_path):
    from sparktrain.jvm import JAR_ENV
    from sparktrain.session import _add_listener_jar

    jar = tmp_path / "sparktrain-listener.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv(JAR_ENV, str(jar))
    settings = {"spark.jars": "/opt/other.jar"}
    _add_listener_jar(settings)
    _add_listener_jar(settings)
    assert settings["spark.jars"] == f"/opt/other.jar,{jar}"


def test_local_path():
    from sparktrain.jvm import local_path

    assert [local_path(u) for u in ("file:/a/b", "file:///a/b", "/a/b", "s3a://bucket/k")] == [
        "/a/b", "/a/b", "/a/b", "s3a://bucket/k"]
