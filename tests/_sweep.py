"""Planted secrets and the grep that must not find them (tests/track/test_secret_sweep.py, test_job.py)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

SECRETS = {
    "s3a": "SweepS3aSecret-1a2b3c",
    "s3a_id": "SweepS3aAccessId-8e9f0a",
    "executor_env": "SweepExecEnv-4d5e6f",
    "uri_password": "SweepUriPassword-7a8b9c",
    "env_password": "SweepEnvPassword-0d1e2f",
    "trial_url": "SweepTrialUrl-3a4b5c",
    "trial_kv": "SweepTrialKv-6d7e8f",
    "trial_basic": "SweepTrialBasic-2d3e4f",
    "trial_json": "SweepTrialJson-9a0b1c",
    "fit_token": "SweepFitToken-5a6b7c",
    "e2e_s3a": "do-not-log-me",  # tests/track/test_job.py's job has it in its Spark conf
}
BASIC = base64.b64encode(f"ana:{SECRETS['trial_basic']}".encode()).decode()


def needles() -> Dict[str, bytes]:
    """Each secret, and the Basic header values that carry them (base64 of ``user:password``)."""
    out = {name: value.encode() for name, value in SECRETS.items()}
    out["trial_basic_b64"] = BASIC.encode()
    for user, key in (("sweep-user", "uri_password"), ("sweep-user", "env_password")):
        out[f"{key}_b64"] = base64.b64encode(f"{user}:{SECRETS[key]}".encode())
    return out


def leaks(roots: Iterable[Path], texts: Dict[str, str]) -> List[Tuple[str, str]]:
    """``(file or text name, secret name)`` for every secret in ``roots`` (files, or every file under a folder,
    read as bytes) or in ``texts``.

    Also checks that there was something to grep: more than 20 files.
    """
    wanted = needles()
    found: List[Tuple[str, str]] = []
    files = [p for root in map(Path, roots) for p in ([root] if root.is_file() else root.rglob("*"))
             if p.is_file() and not p.is_symlink()]
    assert len(files) > 20, files  # the job wrote its store, dataset and MLflow files there
    for path in files:
        data = path.read_bytes()
        found += [(str(path), name) for name, needle in wanted.items() if needle in data]
    for label, text in texts.items():
        found += [(label, name) for name, needle in wanted.items() if needle in text.encode()]
    return found


#: What a failing trial raises: credentials quoted the way libraries quote them.
TRIAL_ERROR = (f"feature store https://ana:{SECRETS['trial_url']}@fs.internal/v1 refused: user=ana "
               f"password={SECRETS['trial_kv']} headers={{'Authorization': 'Basic {BASIC}'}} "
               f"body={{\"api_key\": \"{SECRETS['trial_json']}\"}}")
#: What a failing model factory raises on the executor.
FIT_ERROR = f"cannot fetch the pretrained weights with token={SECRETS['fit_token']}"
