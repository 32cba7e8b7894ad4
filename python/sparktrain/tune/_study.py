"""What keeps an Optuna study whole: one search at a time, and only searches whose trials compare.

A study outlives a search, and ``tune.study`` names one across config
changes.  Two things would mix it silently:

* **Two searches at once.**  The second would record the first's running
  trials as failed (they look left over from a crash).  A search therefore
  holds a lease on its study for as long as it runs: a lease file beside the
  journal (:mod:`sparktrain.data.lease`), or, for a study in a database
  (``tune.storage: postgresql://...``, which searches with other stores on
  other hosts may share), a user attribute of the study itself
  (:class:`DatabaseLease`) with the same holder, heartbeat and takeover
  rules.  A second search is refused with the holder's host, pid and start time.
* **A changed search.**  The first search records its settings on the study
  (user attribute ``sparktrain_search``).  A later search whose trials report
  a value of another meaning is refused, naming each key that differs: another
  ``tune.metric``, ``train.task`` or ``train.validation_fraction``
  (:data:`MEANING`).  Other changes (the space, the ``train:`` starting point,
  the mode, a new dataset generation) keep the values comparable, as Optuna
  allows: they are logged, key by key, and the study goes on (its best may be
  an earlier trial outside the new space).  The sampler, the pruner and the
  run-only ``train`` keys (:data:`RUN_ONLY`) are not compared.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

from sparktrain.config import JobConfig, TuneConfig
from sparktrain.errors import ConfigError
from sparktrain.train.inputs import SPLIT_ID

log = logging.getLogger(__name__)

#: the study's user attribute that holds a database study's lease
LEASE_ATTR = "sparktrain_lease"
#: where a study's journal lives under ``train.store`` by default
STUDIES_DIR = "_studies"
#: the study's user attribute that holds the settings its trials were run with
SEARCH_ATTR = "sparktrain_search"
#: settings whose change gives a trial's value another meaning: refused on a continued study
MEANING = ("tune.metric", "train.task", "train.validation_fraction")
#: the prefix of :func:`validation_digest`'s values (a study that holds another kind is not compared)
VALIDATION_ID = SPLIT_ID
#: ``train:`` keys that change how a trial runs, not the value it reports
RUN_ONLY = frozenset({"store", "log_every_steps", "log_every_s", "checkpoint_every_steps", "checkpoint_every_s",
                      "keep_checkpoints", "stall_timeout_s", "compare_baseline", "gpus_per_worker"})


def search_settings(cfg: JobConfig, dataset_path: Optional[str]) -> Dict[str, Any]:
    """The settings a study's trial values depend on, as JSON values (what a stored study holds)."""
    from sparktrain._internal.typed_build import to_dict

    tune: TuneConfig = cfg.tune  # type: ignore[assignment]
    train = {k: v for k, v in (to_dict(cfg.train) or {}).items() if k not in RUN_ONLY}
    settings = {"tune.space": tune.space, "tune.metric": tune.metric, "tune.mode": tune.mode,
                "train": train, "dataset": os.fspath(dataset_path or ""),
                "validation": validation_digest(dataset_path)}
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def validation_digest(dataset_path: Optional[str]) -> Optional[str]:
    """What identifies the rows every trial's value is measured on (:func:`sparktrain.train.inputs.split_identity`
    of the validation split)."""
    from sparktrain.train.inputs import split_identity

    return split_identity(dataset_path, "validation")


def differences(stored: Dict[str, Any], now: Dict[str, Any]) -> List[str]:
    """``key: stored -> now`` for each setting that differs (``tune.space`` and ``train`` key by key)."""
    out: List[str] = []
    for key in sorted(set(stored) | set(now)):
        old, new = stored.get(key), now.get(key)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict) and key in ("tune.space", "train"):
            out += [f"{key}.{k}: {old.get(k, '(not set)')!r} -> {new.get(k, '(not set)')!r}"
                    for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        else:
            out.append(f"{key}: {old!r} -> {new!r}")
    return out


def check_same_search(study: Any, cfg: JobConfig, dataset_path: Optional[str], where: str) -> None:
    """Record this search's settings on the study; refuse a continued study whose values mean something else.

    Raises
    ------
    ConfigError
        Naming the first key of :data:`MEANING` that differs, its value now, and every difference.
    """
    now = search_settings(cfg, dataset_path)
    stored = study.user_attrs.get(SEARCH_ATTR)
    diffs = [d for d in (differences(stored, now) if stored is not None else [])
             if not d.startswith("validation:")]  # refused below when both have one and they differ
    refused = [d for d in diffs if d.split(":", 1)[0] in MEANING]
    if stored is not None:
        _check_space_kinds(study, stored.get("tune.space") or {}, now["tune.space"], where)
    if stored is not None and str(stored.get("validation") or "").startswith(VALIDATION_ID) and \
            now["validation"] and stored["validation"] != now["validation"]:  # an older study holds none
        raise ConfigError("tune.study", study.study_name,
                          f"study '{study.study_name}' ({where}) holds trials measured on other validation rows: "
                          f"the dataset was preprocessed again ({stored.get('dataset')!r} -> {now['dataset']!r}; "
                          f"another split or other features give other validation rows), so their "
                          f"{now['tune.metric']} values do not compare with this search's. Name a new study "
                          f"(tune.study), or search the dataset the study was run on")
    if refused:
        first = refused[0].split(":", 1)[0]
        value = now.get(first) if first.startswith("tune.") else now["train"].get(first.split(".", 1)[1])
        raise ConfigError(first, value,
                          f"study '{study.study_name}' ({where}) holds trials whose values mean something else "
                          f"({'; '.join(refused)}), so they cannot be compared with this search's. Name a new "
                          f"study (tune.study), or set {first} back to continue it")
    if diffs:
        log.warning("study '%s' goes on with other settings than its earlier trials: %s. Their %s values still "
                    "compare and the sampler models all of them; the study's best may be an earlier trial outside "
                    "these settings. For a fresh start, name a new study (tune.study)", study.study_name,
                    "; ".join(diffs), now["tune.metric"])
    if stored != now:
        study.set_user_attr(SEARCH_ATTR, now)


def _kind(spec: Any) -> Any:
    """What Optuna cannot change within a study: the distribution's kind, and a choice's options."""
    if not isinstance(spec, dict) or len(spec) != 1:
        return ("fixed", json.dumps(spec, sort_keys=True))
    (kind, args), = spec.items()
    return (kind, json.dumps(args, sort_keys=True)) if kind == "choice" else (kind,)


def _check_space_kinds(study: Any, stored: Dict[str, Any], now: Dict[str, Any], where: str) -> None:
    """Refuse a key whose distribution changed kind (``loguniform`` -> ``uniform``) or whose choice options changed:
    Optuna refuses both within one study, after a trial has started."""
    for key in sorted(set(stored) & set(now)):
        if _kind(stored[key]) != _kind(now[key]):
            raise ConfigError(f"tune.space.{key}", now[key],
                              f"study '{study.study_name}' ({where}) sampled {key} as {stored[key]!r}; Optuna keeps "
                              "a key's distribution kind and a choice's options for the life of a study (a range "
                              "may change). Name a new study (tune.study), or set it back to continue the study")


class DatabaseLease:
    """One search at a time on a study in a database: the lease is the study's user attribute :data:`LEASE_ATTR`.

    Optuna has no compare-and-set on attributes, so the claim is written, then
    read back after a moment: of two searches that start within that moment,
    the one whose token is read back wins and the other is refused.

    Parameters
    ----------
    study : optuna.Study
        The loaded study.
    where : str
        The storage, masked (for messages).
    """

    def __init__(self, study: Any, where: str) -> None:
        from sparktrain.data.lease import STALE_INTERVALS, _default_heartbeat

        self.study, self.where = study, where
        self.heartbeat_s = _default_heartbeat()
        self.stale_after_s = STALE_INTERVALS * self.heartbeat_s
        self.token = uuid.uuid4().hex
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _current(self) -> Dict[str, Any]:
        value = self.study.user_attrs.get(LEASE_ATTR)  # read from the storage at each call
        return value if isinstance(value, dict) else {}

    def _write(self) -> None:
        self.study.set_user_attr(LEASE_ATTR, {
            "holder": {"host": socket.gethostname(), "pid": os.getpid(), "started_at": self.started_at},
            "token": self.token, "heartbeat_at": time.time(), "stale_after_s": self.stale_after_s})

    def _refuse(self, current: Dict[str, Any]) -> None:
        from sparktrain.errors import LeaseHeldError

        raise LeaseHeldError("tune.study", f"{self.study.study_name} in {self.where}",
                             f"user attribute '{LEASE_ATTR}'", current.get("holder") or {},
                             time.time() - float(current.get("heartbeat_at") or 0), self.stale_after_s,
                             clear=f"set the study's user attribute '{LEASE_ATTR}' to {{}} (Optuna: "
                                   f"study.set_user_attr('{LEASE_ATTR}', {{}}))")

    def acquire(self, settle_s: float = 0.5) -> "DatabaseLease":
        """Claim the study or raise :class:`~sparktrain.errors.LeaseHeldError` (a stale claim is taken over)."""
        from sparktrain.data.lease import _gone

        current = self._current()
        if current.get("token"):
            age = time.time() - float(current.get("heartbeat_at") or 0)
            holder = current.get("holder") or {}
            if age <= float(current.get("stale_after_s") or self.stale_after_s) and not _gone(holder):
                self._refuse(current)
            log.warning("taking over the lease on study '%s' (%s): its holder (host %s, pid %s, started %s) %s",
                        self.study.study_name, self.where, holder.get("host", "?"), holder.get("pid", "?"),
                        holder.get("started_at", "?"), "no longer exists on this host" if _gone(holder)
                        else f"sent no heartbeat for {age:.0f} s")
        self._write()
        time.sleep(settle_s)
        won = self._current()
        if won.get("token") != self.token:
            self._refuse(won)
        self._thread = threading.Thread(target=self._beat, name="sparktrain-lease-study", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if self._current().get("token") != self.token:
                    log.warning("the lease on study '%s' was taken over by another search", self.study.study_name)
                    return
                self._write()
            except Exception as exc:  # the database is down: the search's own calls report it
                log.warning("could not renew the lease on study '%s': %s", self.study.study_name, exc)

    def release(self) -> None:
        """Stop the heartbeat and clear the claim when it is still this search's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.heartbeat_s))
            self._thread = None
        try:
            if self._current().get("token") == self.token:
                self.study.set_user_attr(LEASE_ATTR, {})
        except Exception as exc:  # the search's own outcome (or error) must come through
            log.warning("could not release the lease on study '%s' (%s); it goes stale %.0f s after its last "
                        "heartbeat", self.study.study_name, exc, self.stale_after_s)


def lease_target(cfg: JobConfig, name: str, journal: Optional[str]) -> str:
    """What a search's lease file on study ``name`` claims: its ``journal`` file, else
    ``<train.store>/_studies/<name>``."""
    if journal:
        return journal
    store = cfg.train.store if cfg.train is not None else "work/store"
    return f"{store.rstrip('/')}/{STUDIES_DIR}/{name}"


__all__ = ["DatabaseLease", "LEASE_ATTR", "MEANING", "RUN_ONLY", "SEARCH_ATTR", "STUDIES_DIR", "check_same_search",
           "differences", "lease_target", "search_settings"]
