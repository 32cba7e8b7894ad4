"""make_spark_converter with real Spark (issue 4 §7)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sparktrain.data import make_spark_converter, read_manifest
from sparktrain.errors import ConfigError


@pytest.fixture(scope="module")
def frame(spark):
    from pyspark.sql import functions as F

    return (spark.range(0, 1000, numPartitions=3)
            .withColumn("x", F.col("id").cast("double") / 10)
            .withColumn("arr", F.array(F.col("x"), -F.col("x")))
            .withColumn("label", (F.col("id") % 2).cast("int")))


@pytest.mark.torch
def test_converter_materializes_once_and_streams(frame, tmp_path):
    import torch

    conv = make_spark_converter(frame, str(tmp_path / "cache"))
    assert len(conv) == conv.dataset_size == 1000
    assert os.path.dirname(conv.path) == str(tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == [os.path.basename(conv.path)]  # no staging left behind
    m = read_manifest(conv.path)
    assert m["source"] == "make_spark_converter" and m["num_rows"] == 1000
    assert {c["name"]: c["type"] for c in m["schema"]} == {"id": "int64", "x": "float", "arr": "list<float>",
                                                            "label": "int32"}
    # same plan -> same folder, not rewritten
    again = make_spark_converter(frame, str(tmp_path / "cache"))
    assert again.path == conv.path and read_manifest(again.path)["created_at"] == m["created_at"]
    # another plan -> another folder
    other = make_spark_converter(frame.where("id < 10"), str(tmp_path / "cache"))
    assert other.path != conv.path and len(other) == 10

    seen = []
    for shard in range(2):  # petastorm argument names
        with conv.make_torch_dataloader(batch_size=128, cur_shard=shard, shard_count=2, num_epochs=1,
                                        shuffling_queue_capacity=0) as loader:
            assert len(loader) == 4
            for b in loader:
                assert b["x"].dtype == torch.float32 and b["arr"].shape[1:] == (2,)
                torch.testing.assert_close(b["arr"][:, 1], -b["x"])
                torch.testing.assert_close(b["x"], b["id"].float() / 10)
                seen.append(b["id"].numpy())
    assert sorted(np.concatenate(seen)) == list(range(1000))  # 1000 rows split evenly: no padding
    conv.delete()
    assert not os.path.exists(conv.path)


@pytest.mark.tensorflow
def test_converter_tf_dataset(frame, tmp_path):
    import tensorflow as tf

    conv = make_spark_converter(frame, "file://" + str(tmp_path / "cache"), dtype=None)
    with conv.make_tf_dataset(batch_size=250, num_epochs=1, shuffle=False) as ds:
        assert ds.element_spec["x"].dtype == tf.float64  # dtype=None keeps double
        ids = np.concatenate([b["id"].numpy() for b in ds])
    assert sorted(ids) == list(range(1000))


def test_converter_needs_a_cache_dir(frame):
    with pytest.raises(ConfigError, match="sparktrain.data.cacheDir"):
        make_spark_converter(frame)
    with pytest.raises(ConfigError, match="dtype"):
        make_spark_converter(frame, "/tmp/never", dtype="float16")
