"""What a job run records about itself: masked params and system tags.

Secrets are masked by key and by value with the rules of
:mod:`sparktrain._internal.secrets` (re-exported here): a key whose words name
a credential (``token``, ``password``, ``secret``, ``credential``, ``key``,
``sas``; ``data.key`` and feature names excepted) loses its value, and any
string value loses URL passwords, SAS query strings, ``token=``-style
parameters (Spark Connect's ``;token=``) and bearer tokens.  The same rules
apply to the tags (the master URL) and, through :func:`mask_value`, to what
sparktrain logs and prints.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
from typing import Any, Dict, Optional

from sparktrain._internal.secrets import MASK, NOT_SECRET, is_secret_key, mask_secrets, mask_value

log = logging.getLogger(__name__)

#: Distributions whose versions every run records (missing ones are skipped).
FRAMEWORKS = ("torch", "tensorflow", "keras", "pyspark", "mlflow", "pyarrow", "pandas", "numpy", "hyperopt")
#: MLflow param values are limited to 6,000 characters.
MAX_PARAM_CHARS = 6000


def mask_url_password(value: str) -> str:
    """Mask every secret in a URL or other string (:func:`mask_value`; the name predates the value rules).

    ``scheme://user:pw@host`` -> ``scheme://user:***@host``, and also
    ``;token=``/``?sig=`` parameters, SAS query strings and bearer tokens.
    """
    return mask_value(value)


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
    """The master URL of ``spark`` (works with Spark Connect too), unmasked: record it through :func:`mask_value`."""
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
        tags["sparktrain.spark.master"] = mask_value(spark_master(spark))
    elif master:
        tags["sparktrain.spark.master"] = mask_value(master)
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


__all__ = ["FRAMEWORKS", "MASK", "MAX_PARAM_CHARS", "NOT_SECRET", "framework_versions", "git_info", "is_secret_key",
           "job_params", "mask_secrets", "mask_url_password", "mask_value", "spark_master", "system_tags"]
