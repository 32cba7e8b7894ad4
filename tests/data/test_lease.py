"""Leases: one job per run and per output (sparktrain.data.lease)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparktrain.data.lease import claim, lease_path
from sparktrain.errors import LeaseHeldError

REPO = Path(__file__).resolve().parents[2]


def _wait_for(condition, what: str, limit: float = 30.0) -> None:
    """Poll ``condition`` (a bound on the wait, not a timed assertion)."""
    end = time.monotonic() + limit
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


def test_lease_file_beside_the_target(tmp_path):
    target = tmp_path / "store" / "run1"
    assert lease_path(str(target)) == str(tmp_path / "store" / ".run1.lease")
    assert lease_path("s3://bucket/store/run1/") == "s3://bucket/store/.run1.lease"
    with claim(str(target), "runId") as lease:
        body = json.loads(Path(lease.path).read_text())
        assert body["format"] == "sparktrain.lease/1" and body["what"] == "runId"
        assert body["holder"]["pid"] == os.getpid() and body["holder"]["host"] == socket.gethostname()
        assert not target.exists()  # claiming writes nothing inside the target
    assert not Path(lease.path).exists()  # released


def test_a_second_claim_in_the_same_process_is_refused_and_the_first_unaffected(tmp_path):
    target = str(tmp_path / "out")
    with claim(target, "output.path") as first:
        before = json.loads(Path(first.path).read_text())["holder"]
        with pytest.raises(LeaseHeldError) as err:
            with claim(target, "output.path"):
                pytest.fail("the second job must not run")
        text = str(err.value)
        assert f"output.path '{target}' is in use by another job in this process (a fit or search in another " \
               f"thread) (host {socket.gethostname()}, pid {os.getpid()}, started {first.started_at};" in text
        assert "Fix: wait for that job to finish, or use another output.path" in text
        assert f"delete the lease file '{first.path}'" in text and "taken over automatically" in text
        assert err.value.holder["pid"] == os.getpid()
        assert json.loads(Path(first.path).read_text())["holder"] == before  # the holder's lease untouched
        assert first.heartbeat() and not first.lost
    with claim(target, "output.path"):  # released: the next job gets it
        pass


def test_a_second_process_is_refused(tmp_path):
    target = str(tmp_path / "store" / "named")
    code = ("import sys\nfrom sparktrain.data.lease import claim\nfrom sparktrain.errors import LeaseHeldError\n"
            f"try:\n    claim({target!r}, 'runId').acquire()\nexcept LeaseHeldError as e:\n"
            "    print(e)\n    sys.exit(3)\nprint('claimed')\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'python'}{os.pathsep}{REPO}"}
    with claim(target, "runId") as held:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert f"runId 'named' (run folder {target}) is in use by another job (host {socket.gethostname()}, pid " \
               f"{os.getpid()}" in proc.stdout  # another process: not "in this process"
        assert held.heartbeat()  # still ours
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "claimed", proc.stderr[-2000:]


def test_a_stale_lease_is_taken_over_with_a_warning(tmp_path, caplog):
    target = str(tmp_path / "out")
    stale = {"format": "sparktrain.lease/1", "holder": {"host": "lost-host", "pid": 4242,
                                                        "started_at": "2026-01-01T00:00:00+00:00", "token": "old"},
             "heartbeat_at": time.time() - 3600}
    Path(lease_path(target)).write_text(json.dumps(stale))
    with caplog.at_level("WARNING", logger="sparktrain.data.lease"):
        with claim(target, "output.path") as lease:
            assert json.loads(Path(lease.path).read_text())["holder"]["token"] == lease.token
    assert "taking over the lease on output.path" in caplog.text
    assert "host lost-host, pid 4242, started 2026-01-01T00:00:00+00:00" in caplog.text


def test_a_lease_of_an_exited_process_of_this_host_is_taken_over_at_once(tmp_path, caplog):
    target = str(tmp_path / "out")
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)  # a driver that was killed: its pid no longer exists
    dead = {"format": "sparktrain.lease/1", "heartbeat_at": time.time(),
            "holder": {"host": socket.gethostname(), "pid": int(proc.stdout), "started_at": "now", "token": "x"}}
    Path(lease_path(target)).write_text(json.dumps(dead))
    with caplog.at_level("WARNING", logger="sparktrain.data.lease"):
        with claim(target) as lease:
            assert lease.held
    assert "its process no longer exists on this host" in caplog.text
    alive = dict(dead, holder=dict(dead["holder"], host="another-host"))  # another host: never guessed
    Path(lease_path(target)).write_text(json.dumps(alive))
    with pytest.raises(LeaseHeldError, match="host another-host"):
        claim(target).acquire()


def test_an_unreadable_fresh_lease_is_respected(tmp_path):
    target = str(tmp_path / "out")
    Path(lease_path(target)).write_text("")  # a holder between its create and its write
    with pytest.raises(LeaseHeldError, match=r"host \?, pid \?"):
        claim(target).acquire()


def test_the_heartbeat_keeps_a_live_lease(tmp_path):
    target = str(tmp_path / "out")
    with claim(target, heartbeat_s=0.1, stale_after_s=3.0) as lease:  # margins for a loaded machine
        path = Path(lease.path)
        first = json.loads(path.read_text())["heartbeat_at"]
        start = time.time()
        _wait_for(lambda: time.time() - start > 3.5 and json.loads(path.read_text() or "{}").get(
            "heartbeat_at", 0) > first + 3.0, "a stale period of heartbeats")
        with pytest.raises(LeaseHeldError):  # claimed longer ago than stale_after_s, but beating: not taken over
            claim(target, heartbeat_s=0.1, stale_after_s=3.0).acquire()
        assert not lease.lost


def test_a_job_whose_lease_was_taken_over_knows_it(tmp_path):
    target = str(tmp_path / "out")
    lease = claim(target, heartbeat_s=60).acquire()
    try:
        body = json.loads(Path(lease.path).read_text())
        body["heartbeat_at"] -= 3600  # as if its host had frozen for an hour
        Path(lease.path).write_text(json.dumps(body))
        with claim(target) as other:
            assert not lease.heartbeat() and lease.lost
            assert json.loads(Path(other.path).read_text())["holder"]["token"] == other.token  # not overwritten
    finally:
        lease.release()


def test_folders_a_claim_created_are_removed(tmp_path):
    target = tmp_path / "new" / "deeper" / "out"
    with claim(str(target)):
        assert (tmp_path / "new" / "deeper").is_dir()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- wired into fit, preprocess and score


def test_fit_on_a_claimed_run_is_refused_before_anything(tmp_path):
    from sparktrain.data.run_store import RunStore
    from sparktrain.train.estimator import TorchEstimator

    store = str(tmp_path / "store")
    est = TorchEstimator(labelCol="y", store=store, runId="nightly")
    with RunStore(store, "nightly").claim():
        with pytest.raises(LeaseHeldError,
                           match=r"runId 'nightly' \(run folder .*store/nightly\) is in use by another job"):
            est.fit(str(tmp_path / "no-such-dataset"))  # refused before the dataset is even looked at
    assert list(tmp_path.iterdir()) == []  # no run folder; the store folder the claim made went with it


def test_preprocess_and_score_on_a_claimed_output_are_refused(spark, flights_sample, tmp_path):
    from dataclasses import replace

    from sparktrain.config import load_config
    from sparktrain.features.materialize import materialize
    from sparktrain.serve.scoring import score_path

    out = str(tmp_path / "dataset")
    cfg = load_config(REPO / "conf" / "flights.yaml")
    cfg = replace(cfg, output=replace(cfg.output, path=out))
    with claim(out, "output.path"):
        with pytest.raises(LeaseHeldError, match="output.path '.*dataset' is in use by another job"):
            materialize(spark, cfg, flights_sample)
        assert not Path(out).exists()
        with pytest.raises(LeaseHeldError, match="--output '.*dataset' is in use by another job"):
            score_path(spark, "models:/none@champion", str(tmp_path / "raw"), out,
                       tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the registry was never opened, nothing written


# ---------------------------------------------------------------- on S3 (moto's real server, tests/_s3.py)


def _s3_lease_key(uri: str) -> tuple:
    """(bucket, key) of the lease of ``uri``."""
    path = lease_path(uri)[len("s3://"):]
    bucket, _, key = path.partition("/")
    return bucket, key


def test_a_lease_in_s3_is_a_conditional_create_refusing_a_second_claim(s3):
    boto3 = pytest.importorskip("boto3")
    from botocore.exceptions import ClientError

    from sparktrain._internal.secrets import mask_value

    target = f"{s3.prefix('lease')}/run1"
    bucket, key = _s3_lease_key(target)
    client = boto3.client("s3")  # AWS_ENDPOINT_URL: the moto server
    with claim(target, "runId") as first:
        body = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        assert body["holder"] == {"host": socket.gethostname(), "pid": os.getpid(), "started_at": first.started_at,
                                  "token": first.token}
        # the server honours If-None-Match: * (moto 5.2.5 does), so the create below is a real conditional put
        with pytest.raises(ClientError) as refused:
            client.put_object(Bucket=bucket, Key=key, Body=b"{}", IfNoneMatch="*")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        with pytest.raises(LeaseHeldError) as err:
            claim(target, "runId").acquire()
        # messages mask secrets: the throwaway access key 'sparktrain-test' is part of the bucket's name
        name = target.rstrip("/").rsplit("/", 1)[-1]
        assert f"runId '{name}' (run folder {mask_value(target)}) is in use by another job in this process (a fit " \
               f"or search in another thread) (host {socket.gethostname()}, pid {os.getpid()}, started " \
               f"{first.started_at};" in str(err.value)
        assert f"delete the lease file '{mask_value(lease_path(target))}'" in str(err.value)
        assert json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())["holder"]["token"] == first.token
        assert first.heartbeat() and not first.lost
    assert s3.keys(target.rsplit("/", 1)[0]) == []  # released: the lease object is gone, nothing else written
    with claim(target, "runId"):  # and the next job gets it
        pass


def test_claims_racing_on_s3_exactly_one_wins(s3):
    """The conditional put decides: of 8 claims started together, one holds the lease and 7 are refused."""
    pytest.importorskip("boto3")
    import threading

    target = f"{s3.prefix('race')}/run"
    leases = [claim(target, "runId", heartbeat_s=60) for _ in range(8)]
    start = threading.Barrier(len(leases))
    outcome: dict = {}

    def go(i: int) -> None:
        start.wait()
        try:
            leases[i].acquire()
            outcome[i] = "held"
        except LeaseHeldError:
            outcome[i] = "refused"

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert sorted(outcome.values()) == ["held"] + ["refused"] * 7
        winner = next(lease for lease in leases if lease.held)
        assert claim(target).read()["holder"]["token"] == winner.token
    finally:
        for lease in leases:
            lease.release()
    assert s3.keys(target.rsplit("/", 1)[0]) == []


def test_a_stale_lease_in_s3_is_taken_over(s3, caplog):
    target = f"{s3.prefix('stale')}/out"
    stale = {"format": "sparktrain.lease/1", "holder": {"host": "lost-host", "pid": 4242,
                                                        "started_at": "2026-01-01T00:00:00+00:00", "token": "old"},
             "heartbeat_at": time.time() - 3600}
    with s3.filesystem().open_output_stream(lease_path(target)[len("s3://"):]) as out:
        out.write(json.dumps(stale).encode())
    with caplog.at_level("WARNING", logger="sparktrain.data.lease"):
        with claim(target, "output.path") as lease:
            assert lease.read()["holder"]["token"] == lease.token
    assert "host lost-host, pid 4242, started 2026-01-01T00:00:00+00:00" in caplog.text
    assert "it sent no heartbeat for 3600 s" in caplog.text
    assert s3.keys(target.rsplit("/", 1)[0]) == []


def test_without_boto3_a_lease_in_s3_is_check_then_put(s3, monkeypatch):
    """The fallback (module docstring): pyarrow alone cannot put conditionally; sequential claims still exclude."""
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    from sparktrain.data.lease import _s3_put_if_absent

    target = f"{s3.prefix('noboto')}/out"
    assert _s3_put_if_absent(lease_path(target), b"{}") is None
    with claim(target, "output.path") as first:
        with pytest.raises(LeaseHeldError, match=f"pid {os.getpid()}"):
            claim(target, "output.path").acquire()
        assert first.read()["holder"]["token"] == first.token
    assert s3.keys(target.rsplit("/", 1)[0]) == []


def test_a_fit_with_its_store_in_s3_claims_and_releases_its_run_lease(spark, s3, tmp_path):
    from sparktrain.data.run_store import RunStore
    from sparktrain.train.estimator import TorchEstimator

    store = s3.prefix("store")
    est = TorchEstimator(labelCol="y", store=store, runId="nightly")
    with RunStore(store, "nightly").claim():  # another job holds the run: refused, nothing written
        with pytest.raises(LeaseHeldError, match=r"runId 'nightly' \(run folder .*/nightly\) is in use by another job"):
            est.fit(str(tmp_path / "no-such-dataset"))
    assert s3.keys(store) == []
    with pytest.raises(Exception) as err:  # claimed, then failed on the dataset: the lease is released
        est.fit(str(tmp_path / "no-such-dataset"))
    assert not isinstance(err.value, LeaseHeldError) and "no-such-dataset" in str(err.value)
    assert s3.keys(store) == []


def test_an_unreachable_store_at_release_does_not_hide_the_jobs_own_error(monkeypatch, caplog):
    """An object store that went away mid-job: releasing the lease cannot read or delete its file. The release
    used to raise pyarrow's raw OSError from the ``with`` block's exit, hiding the error that ended the job; now
    the job's error comes through and a warning names the lease left behind (it goes stale, then is taken over)."""
    pytest.importorskip("moto.server")
    from tests._s3 import MotoS3

    server = MotoS3().start()  # a server of its own: this test stops it
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    target = server.prefix("gone") + "/run1"
    try:
        with pytest.raises(ValueError, match="the job's own error"):
            with claim(target, "runId", heartbeat_s=5) as lease:
                assert server.keys(target.rsplit("/", 1)[0]) == [".run1.lease"]
                server.stop()
                raise ValueError("the job's own error")
        assert not lease.held
        text = caplog.text
        tail = lease.path.split("/", 3)[3]  # the bucket may be masked: the test's key id is a prefix of its name
        assert "could not release the lease '" in text and f"{tail}' (OSError" in text and "stale 30 s after" in text
    finally:
        server.stop()


def test_a_release_after_a_clean_job_on_an_unreachable_store_warns_and_returns(monkeypatch, caplog):
    pytest.importorskip("moto.server")
    from tests._s3 import MotoS3

    server = MotoS3().start()
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    try:
        lease = claim(server.prefix("gone") + "/run", "runId", heartbeat_s=5).acquire()
        server.stop()
        lease.release()  # no exception: the job's work is done, its lease goes stale
        assert not lease.held and "could not release the lease" in caplog.text
    finally:
        server.stop()
