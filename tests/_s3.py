"""A real S3-compatible server for the tests: moto's server mode on 127.0.0.1, a free port, one bucket.

``s3://`` URIs reach it through the standard ``AWS_ENDPOINT_URL`` (pyarrow's
``S3FileSystem.from_uri`` honours it, as the AWS SDKs do), with throwaway
credentials.  The session fixture in ``tests/conftest.py`` starts one server;
each test that uses it gets the variables set for that test only
(``monkeypatch``) and a prefix of its own, or passes :meth:`MotoS3.env` to
the subprocess it starts (a Spark driver and its Python workers).

moto is a test dependency (``moto[server]`` pinned in ``python/requirements.lock``).
"""

from __future__ import annotations

import uuid
from typing import Dict

BUCKET = "sparktrain-tests"


class MotoS3:
    """moto's S3 server in a thread of this process (:meth:`start`, :meth:`stop`)."""

    def __init__(self) -> None:
        self._server = None
        self.endpoint = ""

    def start(self) -> "MotoS3":
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.filesystem(allow_bucket_creation=True).create_dir(BUCKET)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def env(self) -> Dict[str, str]:
        """The variables that point ``s3://`` URIs at this server (throwaway credentials)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "sparktrain-test",
                "AWS_SECRET_ACCESS_KEY": "sparktrain-test-secret", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def filesystem(self, **options):
        """A pyarrow ``S3FileSystem`` on this server, built with ``endpoint_override`` (no variables needed)."""
        from pyarrow import fs as pafs

        env = self.env()
        return pafs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                                 endpoint_override=self.endpoint, scheme="http", region="us-east-1", **options)

    def prefix(self, name: str = "t") -> str:
        """A fresh ``s3://bucket/<name>-<random>`` no other test writes under."""
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"

    def upload(self, local: str, uri: str) -> None:
        """Copy the local folder ``local`` to ``uri`` (``s3://bucket/...``) with ``pyarrow.fs.copy_files``."""
        from pyarrow import fs as pafs

        pafs.copy_files(local, uri[len("s3://"):], source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.filesystem())

    def keys(self, uri: str) -> list:
        """Every object under ``uri``, relative to it, sorted."""
        from pyarrow import fs as pafs

        base = uri[len("s3://"):].rstrip("/")
        infos = self.filesystem().get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return sorted(i.path[len(base) + 1:] for i in infos if i.type == pafs.FileType.File)
