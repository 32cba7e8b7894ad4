"""What a job run records about itself: masked params and system tags.

Secret masking rule
-------------------
A flattened config key (``a.b.c``) is split into words at ``.``, ``_``, ``-``
and camelCase boundaries, lower-cased.  Its value is replaced by ``***`` when a
word

* contains ``token``, ``password``, ``passwd`` or ``secret``, or
* is ``key``/``keys`` or ends in ``key`` (``apikey``, ``accessKey``,
  ``spark.hadoop.fs.s3a.access.key``).

Two exceptions, both because the value is a column name fixed by the config
schema, never a credential, and masking it would make the run irreproducible:

* ``data.key`` is the column the split hashes (e.g. ``customer_id``);
* the segment after ``features.`` is a feature's (column) name, so it is not
  matched; the setting names under it are (``features.x.api_key`` is masked).

Independently of the key, a URL value with a password in it
(``http://user:pw@host``) keeps its user and host but loses the password.
Over-masking is preferred to under-masking: ``features.x.monkey`` would be
masked, a ``spark.conf`` credential never leaks.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import subprocess
from typing import Any, Dict, Mapping, Optional

log = logging.getLogger(__name__)

MASK = "***"
#: Keys whose value is a column name by the config schema (see the module docstring).
NOT_SECRET = frozenset({"data.key"})
_SECRET_PARTS = ("token", "password", "passwd", "secret")
_WORD_SPLIT = re.compile(r"[._\-/\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL_PASSWORD = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.\-]*://)(?P<user>[^:/@]*):(?P<pw>[^@/]*)@")
#: Distributions whose versions every run records (missing ones are skipped).
FRAMEWORKS = ("torch", "tensorflow", "keras", "pyspark", "mlflow", "pyarrow", "pandas", "numpy", "hyperopt")
#: MLflow param values are limited to 6,000 characters.
MAX_PARAM_CHARS = 6000


def _words(key: str) -> list:
    out = []
    for part in _WORD_SPLIT.split(key):
        out += [w.lower() for w in _CAMEL.split(part) if w]
    return out


def is_secret_key(key: str) -> bool:
    """Whether the dotted config ``key`` names a secret (the rule in the module docstring).

    Examples
    --------
    >>> is_secret_key("spark.conf.spark.hadoop.fs.s3a.secret.key"), is_secret_key("data.key")
    (True, False)
    >>> is_secret_key("tracking.apiToken"), is_secret_key("features.monkey_key.type")
    (True, False)
    """
    if key in NOT_SECRET:
        return False
    parts = key.split(".")
    if parts[0] == "features" and len(parts) > 2:  # features.<column name>.<setting>
        parts = [parts[0], *parts[2:]]
    for word in _words(".".join(parts)):
        if any(s in word for s in _SECRET_PARTS) or word in ("key", "keys") or word.endswith("key"):
            return True
    return False


def mask_url_password(value: str) -> str:
    """``scheme://user:pw@host...`` -> ``scheme://user:***@host...``; other strings unchanged."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", value)


def mask_secrets(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of a flat ``{dotted key: value}`` dict with secret values replaced by ``***``."""
    out: Dict[str, Any] = {}
    for k, v in flat.items():
        if is_secret_key(k) and v is not None:
            out[k] = MASK
        elif isinstance(v, str):
            out[k] = mask_url_password(v)
        else:
            out[k] = v
    return out


def job_params(cfg: Any) -> Dict[str, str]:
    """The flattened job config with secrets masked, as MLflow param strings."""
    from sparktrain.config import flatten

    params = mask_secrets(flatten(cfg.to_dict()))
    out = {}
    for k, v in params.items():
        text = "" if v is None else str(v)
        if len(text) > MAX_PARAM_CHARS:
            text = text[:MAX_PARAM_CHARS - 3] + "..."
        out[k] = text
    return out


def framework_versions() -> Dict[str, str]:
    """``{distribution: version}`` for :data:`FRAMEWORKS` that are installed (no imports)."""
    out = {}
    for dist in FRAMEWORKS:
        name = "tensorflow-cpu" if dist == "tensorflow" else dist
        for candidate in (dist, name):
            try:
                out[dist] = importlib.metadata.version(candidate)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def git_info(path: Optional[str] = None) -> Dict[str, str]:
    """``{"commit": sha, "dirty": "true"|"false", "branch": name}`` of the repo holding ``path``; {} outside git."""
    cwd = os.path.dirname(os.path.abspath(path)) if path and os.path.isfile(path) else (path or os.getcwd())

    def git(*args: str) -> Optional[str]:
        try:
            res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    info = {"commit": commit, "dirty": str(bool(status)).lower()}
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    if branch:
        info["branch"] = branch
    return info


def spark_master(spark: Any) -> str:
    """The master URL of ``spark`` (works with Spark Connect too)."""
    try:
        return str(spark.conf.get("spark.master"))
    except Exception:  # Spark Connect without the key: report the remote
        return "connect"


def system_tags(spark: Any, cfg: Any, master: Optional[str] = None) -> Dict[str, str]:
    """Tags every job run carries: Spark version and master, ``num_workers``, versions, git commit."""
    import sparktrain

    tags: Dict[str, str] = {"sparktrain.version": sparktrain.__version__, "sparktrain.job": cfg.name}
    if spark is not None:
        tags["sparktrain.spark.version"] = str(spark.version)
        tags["sparktrain.spark.master"] = spark_master(spark)
    elif master:
        tags["sparktrain.spark.master"] = master
    if cfg.train is not None:
        tags["sparktrain.num_workers"] = str(cfg.train.num_workers)
        tags["sparktrain.framework"] = cfg.train.framework
    for dist, version in framework_versions().items():
        tags[f"sparktrain.version.{dist}"] = version
    git = git_info(cfg.source_path)
    if git:
        tags["mlflow.source.git.commit"] = git["commit"]
        tags["sparktrain.git.dirty"] = git["dirty"]
        if "branch" in git:
            tags["mlflow.source.git.branch"] = git["branch"]
    if cfg.source_path:
        tags["sparktrain.config"] = os.path.abspath(cfg.source_path)
    return tags
