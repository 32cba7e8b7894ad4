"""The training store and a materialized dataset in S3: moto's real S3 server (tests/_s3.py), no mocks.

``s3://`` URIs reach it through ``AWS_ENDPOINT_URL``, set for each test only.
The end-to-end runs (a fit from S3 killed with SIGKILL and resumed, register
--from-store from S3) are in tests/train/test_s3_e2e.py.
"""

from __future__ import annotations

import pytest


def test_the_store_in_s3_checkpoints_events_run_record_and_model(s3):
    from sparktrain.data.run_store import RunStore
    from sparktrain.train._executor.checkpoint import Checkpointer

    store = s3.prefix("store")
    run = RunStore(store, "r1")
    assert not run.exists() and run.read_run() is None
    run.write_run({"run_id": "r1", "fingerprint": {"v": 1}})
    ck = Checkpointer(store, "r1", launch_id="L1")
    for seq in range(1, 5):
        ck.save(seq, {"epoch": seq, "layers": []}, bytes([seq]) * 5000, keep=2, best=1)
        ck.log_event("checkpoint", seq=seq)
    ck.write_model(b"network", {"launch": "L1", "history": [{"epoch": 0, "val_loss": 0.5}]})
    ck.record_failure(0, 1, {"message": "boom"})

    assert run.is_recorded() and run.read_run()["fingerprint"] == {"v": 1}
    assert [s for s, _ in ck.checkpoints()] == [1, 3, 4]  # the newest 2 and the best
    assert ck.load_latest() == (4, {"epoch": 4, "layers": []}, bytes([4]) * 5000)
    assert [e["seq"] for e in ck.events() if e["event"] == "checkpoint"] == [1, 2, 3, 4]
    assert ck.read_model() == (b"network", {"launch": "L1", "history": [{"epoch": 0, "val_loss": 0.5}]})
    assert ck.failures()[0]["message"] == "boom"
    keys = s3.keys(f"{store}/r1")
    assert not [k for k in keys if "/.tmp-" in k or k.startswith(".tmp-")]  # nothing half written left
    assert {"run.json", "checkpoints/ckpt-000004.ckpt", "model/network.ckpt"} <= set(keys)


def test_a_truncated_newest_checkpoint_in_s3_falls_back(s3, caplog):
    from sparktrain.train._executor.checkpoint import Checkpointer

    store = s3.prefix("store")
    ck = Checkpointer(store, "r")
    ck.save(1, {"epoch": 0}, b"x" * 3000)
    rel = ck.save(2, {"epoch": 1}, b"y" * 3000)
    with ck.store.fs.open_output_stream(ck.store.path(rel)) as out:  # a torn upload under the final name
        out.write(ck.store.read_bytes(rel)[:2000])
    with caplog.at_level("WARNING"):
        assert ck.load_latest() == (1, {"epoch": 0}, b"x" * 3000)
    assert ck.skipped == [2] and "checkpoint 2 is unreadable" in caplog.text


def test_the_endpoint_comes_from_aws_endpoint_url_or_a_filesystem(s3, monkeypatch):
    """Both ways to reach an S3-compatible server: the standard variable, or a filesystem built with
    ``endpoint_override`` passed to the store (what docs/cluster.md shows)."""
    from sparktrain.data.run_store import Store

    uri = s3.prefix("endpoint")
    Store(uri).write_bytes("a.json", b"{}")  # AWS_ENDPOINT_URL
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    explicit = Store(uri[len("s3://"):], filesystem=s3.filesystem())
    assert explicit.read_bytes("a.json") == b"{}" and explicit.listdir("") == ["a.json"]


@pytest.mark.torch
def test_the_reader_trains_from_a_materialized_dataset_in_s3(spark, s3, tmp_path):
    """Materialized locally by Spark (hadoop-aws is not installable here), uploaded with copy_files, then
    read back through s3:// by the reader and its torch loader: every row once, in bounded batches."""
    import numpy as np
    from pyspark.sql import functions as F

    from sparktrain.data import make_reader
    from sparktrain.data.manifest import write_parquet

    local = tmp_path / "ds"
    df = spark.range(3000).select(F.col("id").cast("int").alias("row_id"),
                                  (F.col("id") % 7).cast("float").alias("x"))
    write_parquet(df.repartition(3), str(local / "train"), row_group_rows=500)
    uri = s3.prefix("ds")
    s3.upload(str(local), uri)
    assert "train/_manifest.json" in s3.keys(uri)

    seen = []
    with make_reader(f"{uri}/train", columns=["row_id", "x"], batch_size=256, num_epochs=1, shuffle=False) \
            as reader:
        for batch in reader:
            assert len(batch["row_id"]) <= 256
            seen.append(np.asarray(batch["row_id"]))
    assert sorted(np.concatenate(seen).tolist()) == list(range(3000))

    import torch

    from sparktrain.data import make_torch_dataloader

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = 0
    with make_torch_dataloader(f"{uri}/train", columns=["x", "row_id"], batch_size=500, num_epochs=1) as loader:
        for batch in loader:
            x = batch["x"].reshape(-1, 1)
            loss = ((model(x) - x * 2) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rows += len(x)
    assert rows == 3000


def test_a_model_bundle_reads_features_json_and_the_pipeline_from_a_dataset_in_s3(s3, tmp_path):
    """``serve.pyfunc.write_bundle`` (what run_job's train stage logs to MLflow) reads the dataset through
    pyarrow.fs: ``features.json`` and ``pipeline_model/`` of a dataset in S3 land in the local bundle."""
    import json
    from pathlib import Path

    from sparktrain.serve.pyfunc import FEATURES, NETWORK, PIPELINE, write_bundle
    from sparktrain.train._executor.spec import InputSpec
    from sparktrain.train.model import TorchModel

    local = tmp_path / "ds"
    meta = {"format": "sparktrain.features/1", "label": "y", "columns": [{"name": "x", "type": "double"}]}
    (local / PIPELINE / "metadata").mkdir(parents=True)
    (local / "features.json").write_text(json.dumps(meta))
    (local / PIPELINE / "metadata" / "part-00000").write_text('{"class": "pyspark.ml.PipelineModel"}')
    (local / PIPELINE / "stages" / "0_imputer").mkdir(parents=True)
    (local / PIPELINE / "stages" / "0_imputer" / "data.parquet").write_bytes(b"PAR1 stand-in")
    uri = s3.prefix("bundle")
    s3.upload(str(local), uri)

    model = TorchModel(framework="torch", model_bytes=b"network bytes", history=[{"epoch": 0, "loss": 0.5}],
                       inputs=InputSpec(numeric=("x",), categorical=(), label="y", task="binary"))
    artifacts = write_bundle(model, uri, str(tmp_path / "bundle"))

    bundle = tmp_path / "bundle"
    assert artifacts == {NETWORK: str(bundle / NETWORK), FEATURES: str(bundle / FEATURES),
                         PIPELINE: str(bundle / PIPELINE)}
    assert json.loads((bundle / FEATURES / "features.json").read_text()) == meta
    assert sorted(str(p.relative_to(bundle / PIPELINE)) for p in (bundle / PIPELINE).rglob("*") if p.is_file()) \
        == ["metadata/part-00000", "stages/0_imputer/data.parquet"]
    assert (bundle / PIPELINE / "stages" / "0_imputer" / "data.parquet").read_bytes() == b"PAR1 stand-in"
    assert (bundle / NETWORK / "model.bin").read_bytes() == b"network bytes"
    assert Path(bundle / NETWORK / "spec.json").exists()


def test_a_model_bundle_names_a_missing_features_json_in_s3(s3, tmp_path):
    from sparktrain.errors import DatasetNotFoundError
    from sparktrain.serve.pyfunc import write_bundle
    from sparktrain.train._executor.spec import InputSpec
    from sparktrain.train.model import TorchModel

    uri = s3.prefix("nofeatures")
    model = TorchModel(framework="torch", model_bytes=b"n", history=[],
                       inputs=InputSpec(numeric=("x",), categorical=(), label="y", task="binary"))
    with pytest.raises(DatasetNotFoundError, match=r"features.json path '.*nofeatures.*/features.json' does not "
                                                   r"exist"):
        write_bundle(model, uri, str(tmp_path / "bundle"))


class _Unanswering:
    """A TCP server on 127.0.0.1 that reads each HTTP request and never answers (a frozen object store).

    ``requests`` counts the request heads received, one per attempt of the client.
    """

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.held: list = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn) -> None:
        buf = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\r\n\r\n" in buf:
                head, buf = buf.split(b"\r\n\r\n", 1)
                self.requests += 1

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("attempts", [None, "2"])
def test_a_frozen_store_fails_a_request_after_the_standard_retry_attempts(monkeypatch, attempts):
    """An s3:// URI's filesystem gives up on a store that accepts connections but never answers after the AWS
    standard mode's 3 attempts (AWS_MAX_ATTEMPTS changes it), with pyarrow's OSError naming the key. Before, the
    C++ default policy that FileSystem.from_uri leaves made about 10 attempts, 100 s per request: a frozen store
    held a checkpoint or a lease heartbeat for minutes before anything named it."""
    from sparktrain.data._fs import resolve

    server = _Unanswering()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    if attempts is None:
        monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    else:
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", attempts)
    try:
        fs, inner = resolve("s3://frozen-bucket/store/run")
        assert inner == "frozen-bucket/store/run"
        with pytest.raises(OSError, match="store/run"):
            fs.get_file_info(inner)
        assert server.requests == int(attempts or 3)
    finally:
        server.close()


def test_register_from_store_on_a_store_that_does_not_answer_says_so_not_no_model(monkeypatch):
    """Probe R: with the store frozen, the recovery command said "no saved model at ...", as if the model were
    gone (network errors read as "not found"); it says the store did not answer and nothing changed."""
    from sparktrain.errors import ModelNotFoundError, StoreReadError
    from sparktrain.track.bundle import read_bundle

    server = _Unanswering()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(key, value)
    try:
        with pytest.raises(StoreReadError) as info:
            read_bundle("s3://frozen-bucket/store/run1")
    finally:
        server.close()
    text = str(info.value)
    assert "could not read the saved model's bundle.json in 's3://frozen-bucket/store/run1'" in text
    assert "whether the model is there is unknown. Nothing was changed" in text
    assert not isinstance(info.value, ModelNotFoundError)

    # `train --resume` on that store: the same, naming train.store (probe R 5: a raw pyarrow traceback)
    from sparktrain.config import parse_config
    from sparktrain.job import check_resume

    server = _Unanswering()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.port}")
    cfg = parse_config({"name": "r", "data": {"source": "/data/x.parquet", "label": "y"},
                        "train": {"store": "s3://frozen-bucket/store"}})
    try:
        with pytest.raises(StoreReadError, match=r"could not read train.store s3://frozen-bucket/store to resume run "
                                                 r"run1 .*Nothing was changed"):
            check_resume(cfg, ["train"], "run1")
    finally:
        server.close()


@pytest.mark.slow
def test_the_lease_put_on_a_frozen_store_is_bounded_like_the_pyarrow_side(monkeypatch):
    """Probe R: a lease claim on a frozen S3 store (boto3's conditional put) took 216 s to fail with botocore's
    defaults (60 s reads, 5 legacy attempts); now AWS_MAX_ATTEMPTS attempts of at most 15 s each."""
    from sparktrain.data.lease import _s3_put_if_absent

    server = _Unanswering()
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "2"}.items():
        monkeypatch.setenv(key, value)
    try:
        with pytest.raises(Exception, match="(?i)timeout|timed out"):
            _s3_put_if_absent(f"s3://frozen-bucket/out/_lease.json?endpoint_override=127.0.0.1:{server.port}"
                              f"&scheme=http", b"{}")
        assert server.requests == 2
    finally:
        server.close()


def test_a_bad_aws_max_attempts_is_refused_by_name(s3, monkeypatch):
    from sparktrain.data._fs import resolve
    from sparktrain.errors import ConfigError

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "three")
    with pytest.raises(ConfigError, match=r"AWS_MAX_ATTEMPTS \(environment variable\)' = 'three'.*integer such as 3"):
        resolve(s3.prefix("store"))
    assert resolve("/tmp/local-store")[1] == "/tmp/local-store"  # local paths do not read it


def test_train_and_tune_refuse_a_dataset_whose_test_split_spark_cannot_read_before_training(spark, s3, tmp_path):
    """A dataset in S3 that pyarrow reads (the reader trains from it) but this Spark cannot (no S3 connector):
    the test split is evaluated with Spark after training, so the fit and the search are refused first,
    naming output.path, the test split and the connector; nothing is trained and the store stays empty."""
    from pyspark.sql import functions as F

    from sparktrain.config import parse_config
    from sparktrain.data.manifest import write_parquet
    from sparktrain.errors import ConfigError
    from sparktrain.job import train_stage
    from sparktrain.tune.search import run_search

    local = tmp_path / "ds"
    df = spark.range(200).select((F.col("id") % 7).cast("float").alias("x"), (F.col("id") % 2).alias("label"))
    for split in ("train", "validation", "test"):
        write_parquet(df, str(local / split))
    uri = s3.prefix("ds")
    s3.upload(str(local), uri)
    store = tmp_path / "store"
    raw = {"name": "t", "data": {"source": str(local), "label": "label"},
           "train": {"num_workers": 1, "epochs": 1, "store": str(store)}, "tracking": {"enabled": False}}
    with pytest.raises(ConfigError) as err:
        train_stage(spark, parse_config(raw), uri)
    text = str(err.value)
    assert (err.value.path, err.value.value) == ("output.path", f"{uri}/test"), text
    assert "Spark cannot read the dataset's test split (evaluated with Spark after training; nothing was " \
           "trained)" in text and 'No FileSystem for scheme "s3"' in text and "hadoop-aws" in text, text
    tune = dict(raw, tune={"max_trials": 2, "space": {"learning_rate": {"choice": [0.01, 0.02]}}})
    with pytest.raises(ConfigError) as err:
        run_search(spark, parse_config(tune), uri)
    assert (err.value.path, err.value.value) == ("output.path", f"{uri}/test"), str(err.value)
    assert "no trial ran" in str(err.value) and "hadoop-aws" in str(err.value)
    assert not store.exists() or not any(store.iterdir())  # no run folder, no study journal


def test_a_store_in_a_bucket_that_does_not_exist_is_refused_by_name(s3):
    """train.store / store in a missing bucket: refused before any work, naming the setting and the bucket
    (it used to fail in the run's lease with botocore's NoSuchBucket); the lease itself names its setting too."""
    from sparktrain.data.guard import check_store_location
    from sparktrain.data.lease import Lease
    from sparktrain.errors import ConfigError

    for uri in ("s3://no-such-bucket-st/store", "s3a://no-such-bucket-st/store"):
        with pytest.raises(ConfigError) as err:
            check_store_location(uri, "train.store")
        assert (err.value.path, err.value.value) == ("train.store", uri)
        assert "its bucket 'no-such-bucket-st' does not exist" in str(err.value)
        assert "point train.store at an existing one" in str(err.value)
    check_store_location(s3.prefix("store"), "train.store")  # the fixture's bucket exists: accepted
    with pytest.raises(ConfigError) as err:
        Lease("s3://no-such-bucket-st/out", "output.path").acquire()
    text = str(err.value)
    assert err.value.path == "output.path" and "could not write its lease file" in text, text
    assert "NoSuchBucket" in text or "does not exist" in text, text
    with pytest.raises(ConfigError) as err:  # a run's lease names the store (probe R: "parameter 'runId'")
        Lease("s3://no-such-bucket-st/store/r1", "runId").acquire()
    assert err.value.path == "store" and "point the store (store / train.store) elsewhere" in str(err.value)


def test_pyarrow_reads_hadoops_s3a_as_s3_and_refuses_a_scheme_it_has_no_filesystem_for(s3):
    """s3a:// (what Spark writes through hadoop-aws) is the same object as s3:// for sparktrain's own files;
    a scheme pyarrow cannot open is refused with the URI and the schemes it can, not ArrowInvalid."""
    from sparktrain.data import _fs
    from sparktrain.errors import ConfigError

    uri = s3.prefix("s3a")
    fs, inner = _fs.resolve(uri)
    with fs.open_output_stream(f"{inner}/a.txt") as out:
        out.write(b"written as s3://")
    fs_a, inner_a = _fs.resolve(uri.replace("s3://", "s3a://", 1) + "/a.txt")
    assert inner_a == f"{inner}/a.txt"
    with fs_a.open_input_stream(inner_a) as src:
        assert src.read() == b"written as s3://"
    with pytest.raises(ConfigError) as err:
        _fs.resolve("dbfs://folder/data")
    assert err.value.value == "dbfs://folder/data" and "no filesystem for dbfs://" in err.value.fix
    assert "s3:// (or s3a://)" in err.value.fix


def test_fit_of_a_dataframe_into_an_s3_store_is_refused_before_any_job_when_spark_cannot_write_there(spark, s3,
                                                                                                      tmp_path):
    """fit(DataFrame) writes the DataFrame into the store with Spark; this Spark has no s3 connector. Probe E: a
    60-line Py4J stack from DataFrameWriter.parquet naming neither the setting nor the connector. Now refused by
    name before any job, with the fix; nothing is written to the bucket."""
    from pyspark.sql import functions as F

    from sparktrain.errors import ConfigError
    from sparktrain.train.estimator import TorchEstimator

    store = s3.prefix("store")
    df = spark.range(200).select((F.col("id") % 7).cast("float").alias("x"), (F.col("id") % 2).alias("label"))
    est = TorchEstimator(numWorkers=1, epochs=1, labelCol="label", store=store)
    with pytest.raises(ConfigError) as info:
        est.fit(df)
    text = str(info.value)
    assert (info.value.path, info.value.value) == ("store", store), text
    assert "Spark cannot open the store, where fit(DataFrame) writes the DataFrame with Spark" in text
    assert "hadoop-aws" in text, text
    from pyarrow import fs as pafs

    fs, inner = pafs.FileSystem.from_uri(store)
    assert fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True)) == []  # nothing written


def test_preprocess_into_an_s3_output_spark_cannot_write_is_refused_before_any_work(spark, s3, tmp_path):
    """Probe R: output.path on s3:// with no connector in this Spark profiled, fitted the pipeline, then died at
    the Parquet write with an 80-line Py4J stack; now refused by name first, with nothing written."""
    from pyspark.sql import functions as F

    from sparktrain.config import parse_config
    from sparktrain.errors import ConfigError
    from pyarrow import fs as pafs

    from sparktrain.features.materialize import materialize

    out = s3.prefix("ds")
    df = spark.range(300).select((F.col("id") % 7).cast("double").alias("x"), (F.col("id") % 2).alias("label"))
    cfg = parse_config({"name": "s3out", "data": {"label": "label"}, "output": {"path": out},
                        "features": [{"name": "x", "type": "numeric"}]})
    with pytest.raises(ConfigError) as info:
        materialize(spark, cfg, df)
    assert (info.value.path, info.value.value) == ("output.path", out)
    assert "Spark cannot open the dataset's output" in str(info.value) and "hadoop-aws" in str(info.value)
    fs, inner = pafs.FileSystem.from_uri(out)
    assert fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True)) == []  # nothing written


@pytest.mark.parametrize("values, binary", [("CAST(id % 2 AS DOUBLE)", True), ("CAST(id % 3 AS DOUBLE) / 2", False)])
def test_a_float_label_in_s3_is_scanned_through_pyarrow_without_a_failing_spark_read(spark, s3, tmp_path, values,
                                                                                      binary):
    """Whether a float label is 0/1 (Spark ML's binary convention) is one scan. This Spark has no s3 connector:
    the scan goes through pyarrow after asking the JVM for the scheme's filesystem. Probe E: a Spark read was
    tried first, and Spark logged a 60-line Java stack on every fit("s3://...")."""
    import logging

    from sparktrain.data.manifest import write_parquet
    from sparktrain.train.plan import float_label_is_01

    local = tmp_path / "ds"
    write_parquet(spark.sql(f"SELECT {values} AS label FROM range(300)"), str(local / "train"))
    uri = s3.prefix("ds")
    s3.upload(str(local), uri)
    seen = []

    class Keep(logging.Handler):  # on the module's logger: an earlier test may have cut propagation above it
        def emit(self, record):
            seen.append(record.getMessage())

    logger, handler = logging.getLogger("sparktrain.train.plan"), Keep(level=logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert float_label_is_01(spark, f"{uri}/train", "label") is binary
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert any(f"Spark has no filesystem for {uri}/train" in m and "scanning label 'label' through pyarrow" in m
               for m in seen), seen
