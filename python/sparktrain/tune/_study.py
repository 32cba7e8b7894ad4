"""What keeps an Optuna study whole: one search at a time, and only searches whose trials compare.

A study outlives a search, and ``tune.study`` names one across config
changes.  Two things would mix it silently:

* **Two searches at once.**  The second would record the first's running
  trials as failed (they look left over from a crash).  A search therefore
  holds a lease (:mod:`sparktrain.data.lease`) on its study for as long as it
  runs: beside the journal file, or at ``<train.store>/_studies/<name>`` for a
  database storage.  A second search is refused with the holder's host, pid
  and start time.
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
from typing import Any, Dict, List, Optional

from sparktrain.config import JobConfig, TuneConfig
from sparktrain.errors import ConfigError

log = logging.getLogger(__name__)

#: where a study's journal lives under ``train.store`` by default
STUDIES_DIR = "_studies"
#: the study's user attribute that holds the settings its trials were run with
SEARCH_ATTR = "sparktrain_search"
#: settings whose change gives a trial's value another meaning: refused on a continued study
MEANING = ("tune.metric", "train.task", "train.validation_fraction")
#: ``train:`` keys that change how a trial runs, not the value it reports
RUN_ONLY = frozenset({"store", "log_every_steps", "log_every_s", "checkpoint_every_steps", "checkpoint_every_s",
                      "keep_checkpoints", "stall_timeout_s", "compare_baseline", "gpus_per_worker"})


def search_settings(cfg: JobConfig, dataset_path: Optional[str]) -> Dict[str, Any]:
    """The settings a study's trial values depend on, as JSON values (what a stored study holds)."""
    from sparktrain._internal.typed_build import to_dict

    tune: TuneConfig = cfg.tune  # type: ignore[assignment]
    train = {k: v for k, v in (to_dict(cfg.train) or {}).items() if k not in RUN_ONLY}
    settings = {"tune.space": tune.space, "tune.metric": tune.metric, "tune.mode": tune.mode,
                "train": train, "dataset": os.fspath(dataset_path or "")}
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


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
    diffs = differences(stored, now) if stored is not None else []
    refused = [d for d in diffs if d.split(":", 1)[0] in MEANING]
    if stored is not None:
        _check_space_kinds(study, stored.get("tune.space") or {}, now["tune.space"], where)
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


def lease_target(cfg: JobConfig, name: str, journal: Optional[str]) -> str:
    """What a search's lease on study ``name`` claims: its ``journal`` file, else ``<train.store>/_studies/<name>``."""
    if journal:
        return journal
    store = cfg.train.store if cfg.train is not None else "work/store"
    return f"{store.rstrip('/')}/{STUDIES_DIR}/{name}"


__all__ = ["MEANING", "RUN_ONLY", "SEARCH_ATTR", "STUDIES_DIR", "check_same_search", "differences", "lease_target",
           "search_settings"]
