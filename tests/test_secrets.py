"""Secrets are masked by key and by value (sparktrain._internal.secrets) wherever sparktrain records or logs them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sparktrain._internal.secrets import MASK, is_secret_key, mask_secrets, mask_value

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("key", [
    "spark.conf.spark.hadoop.fs.s3a.secret.key",
    "spark.conf.spark.hadoop.fs.s3a.session.token",
    "spark.conf.spark.hadoop.fs.azure.sas.mycontainer.myaccount.blob.core.windows.net",
    "spark.conf.spark.hadoop.fs.azure.account.key.myaccount.dfs.core.windows.net",  # the word is mid-key
    "spark.conf.spark.hadoop.fs.azure.account.oauth2.client.secret",
    "spark.conf.spark.hadoop.hadoop.security.credential.provider.path",
    "spark.conf.spark.hadoop.google.cloud.auth.service.account.json.private.key",
    "tracking.clientCredentials",
    "tracking.apiToken",
    "tracking.password",
    "features.dep_delay.api_key",
    "tracking.passphrase",
    "tracking.auth",                              # auth and pat: as the key's last word
    "spark.conf.spark.executorEnv.GITHUB_PAT",
    "spark.conf.spark.executorEnv.AWS_SECRET_ACCESS_KEY",
    "spark.conf.spark.executorEnv.MLFLOW_TRACKING_PASSWORD",
    "spark.conf.spark.executorEnv.HF_TOKEN",
    "spark.conf.spark.authenticate.secret",
    "spark.conf.spark.hadoop.fs.s3a.access.key",
])
def test_secret_keys_are_masked(key):
    assert is_secret_key(key)
    assert mask_secrets({key: "hunter2"}) == {key: MASK}


@pytest.mark.parametrize("key", [
    "data.key",                                   # the split column: a column name, never a credential
    "features.monkey_key.type",                   # a feature (column) name is not a setting name
    "features.token_count.type",
    "spark.conf.spark.sql.shuffle.partitions",
    "spark.conf.spark.sql.files.maxPartitionBytes",
    "spark.master",
    "train.store",
    "tracking.uri",
    "data.label",
    "output.path",
    "features.review.max_tokens",                 # a text feature's settings: tokens are not tokens
    "features.review.tokenizer",
    "features.review.pattern",
    "spark.conf.spark.authenticate",              # a switch, not the secret
    "spark.conf.spark.sql.sources.partitionOverwriteMode",
    "tracking.author",
    "data.path",
])
def test_innocuous_keys_stay_readable(key):
    assert not is_secret_key(key)
    assert mask_secrets({key: "customer_id"}) == {key: "customer_id"}


@pytest.mark.parametrize("value, masked", [
    ("sc://spark.example.com:15002/;user_id=ana;token=abc123", "sc://spark.example.com:15002/;user_id=ana;token=***"),
    ("sc://h:15002/;token=abc;use_ssl=true", "sc://h:15002/;token=***;use_ssl=true"),
    ("https://bob:pa/ss@mlflow.example.com:443", "https://bob:***@mlflow.example.com:443"),
    ("http://bob:p@ss:w/rd@127.0.0.1:5000", "http://bob:***@127.0.0.1:5000"),
    ("https://acct.blob.core.windows.net/c?sv=2022-11-02&se=2026-01-01T00%3A00Z&sp=r&sig=Zm9vYmFy%3D",
     "https://acct.blob.core.windows.net/c?***"),
    ("sv=2022-11-02&ss=b&srt=sco&sp=rl&se=2026-01-01&sig=Zm9vYmFy%3D", MASK),
    ("https://h/api?token=abc&page=2", "https://h/api?token=***&page=2"),
    ("https://h/data.csv?X-Amz-Credential=AKIA%2F&X-Amz-Signature=f00d", "https://h/data.csv?X-Amz-Credential=***&"
                                                                          "X-Amz-Signature=***"),
    ("-Dfs.s3a.secret.key=abc -Xmx2g -Dspark.app.name=x", "-Dfs.s3a.secret.key=*** -Xmx2g -Dspark.app.name=x"),
    ("Bearer eyJhbGciOi.J9", f"Bearer {MASK}"),
    # key=value after a space (a log line, a shell command, a repr)
    ("connecting as user=ana password=hunter2 to db", "connecting as user=ana password=*** to db"),
    ("env AWS_SECRET_ACCESS_KEY=wJalr/K7MDENG MLFLOW_TRACKING_PASSWORD=pw-1 sparktrain run",
     "env AWS_SECRET_ACCESS_KEY=*** MLFLOW_TRACKING_PASSWORD=*** sparktrain run"),
    ("--set spark.conf.spark.hadoop.fs.s3a.secret.key=abc --set train.epochs=2",
     "--set spark.conf.spark.hadoop.fs.s3a.secret.key=*** --set train.epochs=2"),
    ("login passphrase=open-sesame auth=xyz123 pat=ghi789 api_key=k1",
     "login passphrase=*** auth=*** pat=*** api_key=***"),
    ("TrackingConfig(uri='x', password='p w')", "TrackingConfig(uri='x', password='***')"),
    ("failed (token=tok-9(9)), retry. See secret_key=abc.", "failed (token=***), retry. See secret_key=***."),
    # JSON, a Python dict, YAML, sparktrain's own config errors
    ('{"user": "ana", "password": "p\\"w,d", "n": 1}', '{"user": "ana", "password": "***", "n": 1}'),
    ("{'Token': 'abc', 'page': 2}", "{'Token': '***', 'page': 2}"),
    ("tracking:\n  password: hunter2\n  uri: http://h", "tracking:\n  password: ***\n  uri: http://h"),
    ("config key 'spark.conf.x.secret.key' = 's3cr3t': bad", "config key 'spark.conf.x.secret.key' = '***': bad"),
    # HTTP credentials
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Basic ***"),
    ('-H "authorization: token ghx-123"', '-H "authorization: token ***"'),
    ("headers={'Authorization': 'Bearer abc.def-123'}", "headers={'Authorization': 'Bearer ***'}"),
    # well-known token formats, whatever surrounds them
    ("got eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl back", f"got {MASK} back"),
    ("push https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/o/r", f"push https://{MASK}@github.com/o/r"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
     f"-----BEGIN RSA PRIVATE KEY-----{MASK}-----END RSA PRIVATE KEY-----"),
    ("id AKIAIOSFODNN7EXAMPLE", f"id {MASK}"),
])
def test_secret_values_are_masked_whatever_the_key(value, masked):
    assert mask_value(value) == masked
    assert mask_secrets({"spark.conf.spark.some.setting": value}) == {"spark.conf.spark.some.setting": masked}


@pytest.mark.parametrize("value", [
    "sc://spark.example.com:15002/;user_id=ana",
    "http://127.0.0.1:5000",
    "sqlite:///work/mlflow.db",
    "wasbs://container@acct.blob.core.windows.net/raw/",
    "s3a://bucket/data/key=5/part-0.parquet",
    "use KEY=VALUE, e.g. --set train.epochs=2",
    "SELECT * FROM t WHERE key=1",
    "",
    "max_tokens=512 tokenizer=whitespace pattern=[a-z]+ path=/data author=ana",
    "a basic model; Basic settings; the bearer of bad news; bearer tokens",
    "sort by key=value pairs: {'key': 'flight_id', 'tokens': 3}",
    "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\nValueError: bad batch size 512",
    "spark.sql.shuffle.partitions=2 spark.master=local[2]",
])
def test_innocuous_values_stay_readable(value):
    assert mask_value(value) == value


def test_job_params_and_tags_of_a_spark_connect_job_hold_no_secret():
    from sparktrain.config import load_config
    from sparktrain.track.params import job_params, system_tags

    cfg = load_config(REPO / "conf" / "flights.yaml", overrides=[
        "spark.master=sc://connect.example.com:15002/;user_id=ana;token=tok-123",
        "spark.conf.spark.hadoop.fs.azure.sas.c.acct.blob.core.windows.net=sv=2022&sig=sig-456",
        "spark.conf.spark.driver.extraJavaOptions=-Dfs.s3a.secret.key=key-789",
        "tracking.uri=https://bob:pw/with/slashes@mlflow.example.com"])
    params = job_params(cfg)
    assert params["spark.master"] == "sc://connect.example.com:15002/;user_id=ana;token=***"
    assert params["spark.conf.spark.hadoop.fs.azure.sas.c.acct.blob.core.windows.net"] == MASK
    assert params["spark.conf.spark.driver.extraJavaOptions"] == "-Dfs.s3a.secret.key=***"
    assert params["tracking.uri"] == "https://bob:***@mlflow.example.com"
    assert params["data.key"] == "flight_id"
    tags = system_tags(None, cfg, master=cfg.spark.master)
    assert tags["sparktrain.spark.master"] == "sc://connect.example.com:15002/;user_id=ana;token=***"
    recorded = " ".join([*params.values(), *tags.values()])
    for secret in ("tok-123", "sig-456", "key-789", "pw/with"):
        assert secret not in recorded


def test_tracking_errors_do_not_quote_a_url_password():
    from sparktrain.errors import TrackingError
    from sparktrain.track.store import preflight

    with pytest.raises(TrackingError) as err:
        preflight("http://bob:hunter2@127.0.0.1:9", timeout=2)
    assert "http://bob:***@127.0.0.1:9 is unreachable" in str(err.value) and "hunter2" not in str(err.value)


def test_session_logs_mask_a_spark_connect_token(spark, caplog):
    from sparktrain.session import get_or_create_session

    with caplog.at_level(logging.INFO, logger="sparktrain.session"):
        assert get_or_create_session("sc://connect.example.com:15002/;token=tok-123") is spark
    assert "ignoring master=sc://connect.example.com:15002/;token=***" in caplog.text
    assert "tok-123" not in caplog.text


def test_known_values_are_masked_without_a_name(monkeypatch):
    from sparktrain._internal.secrets import known_secrets, remember
    from sparktrain.config import parse_config

    monkeypatch.setenv("SWEEP_UNIT_API_TOKEN", "env-value-8c1d")   # a secret name: its value, anywhere
    monkeypatch.setenv("SWEEP_UNIT_TOKENIZER", "whitespace-x")     # not one
    remember(["remembered-77aa", "short", None])
    parse_config({"spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "conf-secret-3e4f"}},
                  "tracking": {"uri": "https://bob:url-pw-9b0c@mlflow.example.com"}})
    assert mask_value("quoted env-value-8c1d, remembered-77aa, conf-secret-3e4f and url-pw-9b0c") == \
        "quoted ***, ***, *** and ***"
    assert mask_value("split on whitespace-x; a short secret stays") == "split on whitespace-x; a short secret stays"
    assert "short" not in known_secrets()


def test_nested_configs_and_bodies_are_masked_like_the_params():
    from sparktrain._internal.secrets import mask_config, mask_strings

    cfg = {"spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "abc", "spark.sql.shuffle.partitions": "2"}},
           "data": {"key": "customer_id", "source": "s3://AK:se/cret@bucket/raw"},
           "features": [{"name": "api_key", "type": "categorical"}, {"name": "txt", "max_tokens": 64}],
           "tracking": {"uri": "https://bob:pw@h", "passphrase": None}}
    assert mask_config(cfg) == {
        "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": MASK, "spark.sql.shuffle.partitions": "2"}},
        "data": {"key": "customer_id", "source": "s3://AK:***@bucket/raw"},
        "features": [{"name": "api_key", "type": "categorical"}, {"name": "txt", "max_tokens": 64}],
        "tracking": {"uri": "https://bob:***@h", "passphrase": None}}
    assert mask_strings({"dataset": "s3://AK:se@b/d", "rows": [1, "token=x1"], "n": 2.5}) == \
        {"dataset": "s3://AK:***@b/d", "rows": [1, "token=***"], "n": 2.5}


def test_the_log_filter_masks_message_arguments_and_tracebacks():
    import io

    from sparktrain._internal.log_masking import SecretFilter, install_log_masking

    logger = logging.getLogger("sparktrain.test_secrets.filter")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        assert install_log_masking(logger) == 1 and install_log_masking(logger) == 0  # once per handler
        assert [type(f) for f in handler.filters] == [SecretFilter]
        logger.info("connecting to %s with %s", "https://bob:hunter2@h", {"password": "p4ss"})
        try:
            raise ConnectionError("refused: Authorization: Basic dXNlcjpwYXNz")
        except ConnectionError:
            logger.exception("attempt %d failed (token=%s)", 2, "tok-99")
        logger.info("100%% of %d rows", 5)
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "INFO connecting to https://bob:***@h with {'password': '***'}" in text
    assert "ERROR attempt 2 failed (token=***)" in text
    assert "ConnectionError: refused: Authorization: Basic ***" in text and "Traceback" in text
    assert "INFO 100% of 5 rows" in text
    for secret in ("hunter2", "p4ss", "dXNlcjpwYXNz", "tok-99"):
        assert secret not in text


def test_a_resume_compares_the_fingerprint_masked_on_both_sides():
    from sparktrain._internal.secrets import mask_strings
    from sparktrain.errors import RunMismatchError
    from sparktrain.train.plan import check_same

    fingerprint = {"data": {"train": {"digest": "d1"}}, "dataset": "s3://AK:s3cr3t@bucket/ds", "params": {"seed": 1}}
    stored = {"fingerprint": mask_strings(fingerprint)}  # what run.json holds
    assert "s3cr3t" not in str(stored)
    check_same("r1", stored, fingerprint)
    with pytest.raises(RunMismatchError, match="seed"):
        check_same("r1", stored, {**fingerprint, "params": {"seed": 2}})


def test_the_tracking_preflight_sends_a_uri_password_as_basic_auth():
    import base64
    import http.server
    import threading

    from sparktrain.track.store import preflight

    seen = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://bob:p%40ss:w@127.0.0.1:{server.server_address[1]}/mlflow"
        assert preflight(uri, timeout=5) == uri  # urllib alone failed: 'bob:p%40ss:w@127.0.0.1' is no host
    finally:
        server.shutdown()
    assert seen == [("/mlflow/health", "Basic " + base64.b64encode(b"bob:p@ss:w").decode())]


def test_register_from_store_takes_a_masked_tracking_uri_from_the_environment(monkeypatch):
    from sparktrain.errors import TrackingError
    from sparktrain.track.bundle import _stored_tracking_uri

    assert _stored_tracking_uri("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(TrackingError, match=r"tracking URI https://bob:\*\*\*@h had a password, which sparktrain "
                                            r"never stores\. Pass it again: --tracking-uri"):
        _stored_tracking_uri("https://bob:***@h")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://bob:pw@h")
    assert _stored_tracking_uri("https://bob:***@h") == "https://bob:pw@h"
