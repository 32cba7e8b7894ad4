"""The one exception hierarchy of sparktrain.

Every error subclasses :class:`SparktrainError` *and* the built-in exception a
caller would naturally catch (``ValueError``, ``KeyError``, ...), following
scikit-learn's ``sklearn/exceptions.py``.  Messages are templated so that each
one names the offending key/column/parameter, the value received and the fix.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Optional, Sequence


class SparktrainError(Exception):
    """Base class of every error raised by sparktrain."""


class ConfigError(SparktrainError, ValueError):
    """A job config value is missing, unknown or out of range.

    Parameters
    ----------
    path : str
        Dotted key path, e.g. ``"train.num_workers"``.
    value : object
        The value received.
    fix : str
        What the user should do instead.
    kind : str, optional
        What ``path`` is to the user, which the message starts with:
        ``"option"`` for a command-line flag (``--output``), ``"parameter"``
        for a Param or argument of the Python API (``numWorkers``), else
        ``"config key"``.  By default ``--x`` is an option, a camelCase name a
        parameter, anything else a config key.
    """

    def __init__(self, path: str, value: object, fix: str, kind: Optional[str] = None) -> None:
        self.path = path
        self.value = value
        self.fix = fix
        self.kind = kind or _kind_of(path)
        super().__init__(f"{self.kind} '{path}' = {value!r}: {fix}")


def _kind_of(path: str) -> str:
    if path.startswith("--"):
        return "option"
    return "parameter" if re.fullmatch(r"[a-z]+(?:[A-Z][a-z0-9]*)+", path) else "config key"


class UnknownKeyError(ConfigError, KeyError):
    """A config key that no section defines (with a did-you-mean hint)."""

    def __init__(self, path: str, value: object, known: Iterable[str]) -> None:
        known = sorted(known)
        leaf = path.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        fix = f"unknown key; {hint}valid keys here: {', '.join(known)}"
        super().__init__(path, value, fix)

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class SchemaError(SparktrainError, ValueError):
    """A DataFrame or dataset lacks a column or has the wrong type."""


class MissingColumnError(SchemaError, KeyError):
    """A configured column is not in the data."""

    def __init__(self, column: str, available: Iterable[str], where: str = "the DataFrame",
                 fix: str = "Fix the column name (where the config or a Param names it) or add the column.") \
            -> None:
        available = list(available)
        close = difflib.get_close_matches(column, available, n=1)
        hint = _unicode_form_hint(column, available) or _duplicate_header_hint(column, available) or \
            (f" Did you mean '{close[0]}'?" if close else _separator_hint(column, available))
        super().__init__(f"column '{column}' is not in {where}.{hint} Columns that exist: "
                         f"{', '.join(available)}. {fix}")
        self.column = column

    def __str__(self) -> str:
        return self.args[0]


_SEPARATORS = {"\t": "\\t", ";": ";", "|": "|", ",": ","}


def _unicode_form_hint(column: str, available: Iterable[str]) -> str:
    """A column with the same letters in another Unicode normalization form (a macOS export's NFD 'e' + accent
    against the config's NFC 'é') looks identical in a message: say why it does not match."""
    import unicodedata

    same = [n for n in available if n != column and
            unicodedata.normalize("NFC", n) == unicodedata.normalize("NFC", column)]
    if not same:
        return ""
    if unicodedata.is_normalized("NFC", same[0]):  # the data is NFC: the name asked for is not
        return (f" Column {same[0]!r} has the same letters in another Unicode form: the data's name is NFC, the "
                f"name asked for is not (e.g. NFD, as macOS writes accents), so they differ byte by byte. Write the "
                f"name in NFC (unicodedata.normalize('NFC', name)) where the config or a Param names it.")
    return (f" Column {same[0]!r} has the same letters in another Unicode form (not NFC: e.g. NFD, as macOS and "
            f"some exports write accents), so the names differ byte by byte: rename it in the data (e.g. "
            f"withColumnRenamed to unicodedata.normalize('NFC', name)) or save the file with NFC names.")


def _duplicate_header_hint(column: str, available: Iterable[str]) -> str:
    """Spark's CSV reader renames a header name that appears more than once to name + its position ('x' twice in
    'id,x,x' gives x1 and x2): say so, since the file shows 'x'."""
    import re

    names = list(available)
    # Spark's suffix is the copy's column position: sensor1, sensor2 at other positions are the data's own names
    copies = [n for i, n in enumerate(names) if re.fullmatch(re.escape(column) + r"\d+", n)
              and int(n[len(column):]) == i]
    if len(copies) < 2:
        return ""
    return (f" The input's header holds '{column}' more than once: Spark's CSV reader renamed the copies "
            f"{', '.join(copies)} (name + column position). Give each header column its own name, or name one of "
            f"{', '.join(copies)}.")


def _separator_hint(column: str, available: Iterable[str]) -> str:
    """When one header holds the missing name between separators ('id\tx1\tx2'), a text file was split with the
    wrong separator: name the one it has."""
    for name in available:
        for sep, shown in _SEPARATORS.items():
            if sep in name and column in name.split(sep):
                return (f" Column {name!r} holds it between '{shown}': the file's separator is probably '{shown}' "
                        f"(CSV reader option sep, e.g. --option sep='{shown}' or data.options: {{sep: '{shown}'}}).")
    return ""


class ColumnClashError(SchemaError):
    """The DataFrame to score already has a column that scoring would add."""

    def __init__(self, columns: Iterable[str], where: str, adder: str, fix: str = "drop or rename them") -> None:
        self.columns = list(columns)
        super().__init__(f"{where} already has column(s) {', '.join(self.columns)} that {adder} adds; {fix}")


class DuplicateColumnError(SchemaError):
    """A DataFrame has two columns of one name (a join's both sides), so no column of that name can be read."""

    def __init__(self, names: Sequence[str], where: str) -> None:
        self.names = list(names)
        listed = ", ".join(f"'{n}'" for n in self.names)
        super().__init__(f"{where} has more than one column named {listed} (a join keeps both sides' columns), so "
                         f"Spark cannot tell which to read. Fix: rename one side before the join "
                         f"(df.withColumnRenamed('{self.names[0]}', ...), or col(...).alias(...)), or drop it")

    @classmethod
    def check(cls, columns: Sequence[str], where: str) -> None:
        """Raise for the names ``columns`` holds more than once."""
        from collections import Counter

        dups = [c for c, n in Counter(columns).items() if n > 1]
        if dups:
            raise cls(dups, where)


class DataError(SparktrainError, ValueError):
    """The data itself is unusable (all nulls, NaN/inf, vocabulary too large...)."""


class DatasetNotFoundError(SparktrainError, FileNotFoundError):
    """A dataset path does not exist."""


class StoreWriteError(SparktrainError, OSError):
    """A file of the training store could not be written (a full disk, no permission, the store unreachable).

    The write went to a temporary name first, which was removed: what was at
    ``path`` before (the previous checkpoint, the previous model) is unchanged.

    Parameters
    ----------
    path : str
        The file that was being written.
    cause : OSError
        What the filesystem raised.
    """

    def __init__(self, path: str, cause: BaseException) -> None:
        self.path = path
        self.errno_ = getattr(cause, "errno", None)
        super().__init__(
            f"could not write '{path}' ({type(cause).__name__}: {cause}); nothing was half written and the "
            f"previous file there is unchanged. Fix: free space on the store (or fewer keepCheckpoints), check "
            f"its permissions, or point store (train.store) at another place; then fit again with the same runId "
            f"to resume")

    def __str__(self) -> str:  # OSError would otherwise format (errno, strerror)
        return str(self.args[0])


class StoreReadError(SparktrainError, OSError):
    """A file of the training store could not be read for another reason than its absence (the store did not
    answer, or refused access): what the store holds is unknown, and nothing was changed."""

    def __str__(self) -> str:  # OSError would otherwise format (errno, strerror)
        return str(self.args[0])


class CorruptObjectError(SparktrainError, ValueError):
    """A checkpoint or a stored network is truncated or not sparktrain's format (names the path and the fix)."""


class PreflightError(SparktrainError, RuntimeError):
    """A driver-side check failed before any compute was launched."""


class NotFittedError(SparktrainError, ValueError, AttributeError):
    """A model or stage was used before it was fitted."""


class TrainingError(SparktrainError, RuntimeError):
    """A training worker failed; carries the rank, host and remote traceback.

    Parameters
    ----------
    rank : int or None
        Rank of the failed worker (``None`` when unknown).
    host : str or None
        Host the worker ran on.
    remote_traceback : str
        The full traceback formatted on the worker.
    """

    #: the run whose checkpoints a fit with ``runId`` resumes from (set by :meth:`name_run`)
    run_id: Optional[str] = None

    def __init__(self, message: str, rank: Optional[int] = None, host: Optional[str] = None,
                 remote_traceback: str = "") -> None:
        self.rank = rank
        self.host = host
        self.remote_traceback = remote_traceback
        where = f" on rank {rank} (host {host})" if rank is not None else ""
        self._text = f"training failed{where}: {message}"
        self._tail = "\n--- worker traceback ---\n" + remote_traceback.rstrip() if remote_traceback else ""
        super().__init__(self._text + self._tail)

    def name_run(self, run_id: str, checkpoints: Optional[int] = None) -> "TrainingError":
        """Record the failed fit's run and, unless the message says it already, how to resume it (before the
        worker traceback).  A search trial's run (:data:`TRIAL_RUN_ID`) gets the attribute only.

        ``checkpoints``: how many the run saved (``None``: unknown).  With none, fitting again with the run id
        reuses its materialized data but trains from the first epoch, and the message says so."""
        self.run_id = run_id
        if checkpoints == 0 and f"runId={run_id!r}" in self._text:  # a stall's or slots' own resume advice
            for promise in (f"to resume run {run_id} from its last checkpoint", "to resume from the last checkpoint"):
                self._text = self._text.replace(promise, f"to reuse run {run_id}'s data (it failed before its first "
                                                         f"checkpoint: it trains from the first epoch)")
            self.args = (self._text + self._tail,)
        if f"runId={run_id!r}" not in self._text and not TRIAL_RUN_ID.fullmatch(run_id):
            if checkpoints == 0:
                self._text += (f". Run {run_id} failed before its first checkpoint: once the cause is fixed, fit "
                               f"again with runId={run_id!r} to reuse its data (it trains from the first epoch)")
            else:
                self._text += (f". Run {run_id} keeps its checkpoints in the store: once the cause is fixed, fit "
                               f"again with runId={run_id!r} to resume it from the last one")
            self.args = (self._text + self._tail,)
        return self


class TrackingError(SparktrainError, RuntimeError):
    """The MLflow tracking server or registry cannot be used."""


class TrackingDownError(TrackingError):
    """The tracking server stopped answering after the work was done; the model is safe in the store.

    Attributes
    ----------
    reason : str
        What the failed MLflow call said (first line).
    run_dir : str or None
        The store folder that ``sparktrain register --from-store`` takes to finish the tracking.
    result : object
        What the stage produced before the outage (a search's ``SearchResult``), or None.
    """

    def __init__(self, message: str, reason: str = "", run_dir: Optional[str] = None, result: Any = None) -> None:
        super().__init__(message)
        self.reason, self.run_dir, self.result = reason, run_dir, result


class ModelNotFoundError(TrackingError, LookupError):
    """A registered model name or alias does not exist."""


class TuneError(SparktrainError, RuntimeError):
    """The hyperparameter search failed (e.g. every trial failed)."""


class SearchStoppedError(TuneError):
    """The search cannot go on: its Spark Connect server was lost, or the cluster no longer has the task slots a
    trial needs.  The search stopped; its finished trials are kept and its running ones recorded as interrupted
    (not counted against ``max_trials``), so the same search continues its study once the cause is fixed.

    ``why`` is the cause alone (the message adds what happened to the search).
    """

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(f"{why}. The search stopped: its finished trials are kept and the running ones recorded as "
                         f"interrupted (they do not count against tune.max_trials). Once that is fixed, run the same "
                         f"search again: an Optuna study continues where it stopped")


class MissingDependencyError(SparktrainError, ImportError):
    """An optional dependency is not installed; the message has the install line."""

    def __init__(self, package: str, install: str, why: str = "") -> None:
        extra = f" ({why})" if why else ""
        super().__init__(f"{package} is required{extra}. Install it with: {install}")


class UnsupportedVersionError(SparktrainError, RuntimeError):
    """pyspark, Python or Java is outside the versions sparktrain supports (refused before any job).

    Parameters
    ----------
    what : str
        ``"pyspark"``, ``"Python"`` or ``"Java"``.
    found : str
        The version found (and where, when that helps).
    supported : str
        The supported range.
    fix : str
        What to install or set instead.
    """

    def __init__(self, what: str, found: str, supported: str, fix: str) -> None:
        self.what = what
        self.found = found
        self.supported = supported
        super().__init__(f"{what} {found} is not supported by sparktrain (supported: {supported}). Fix: {fix}")


class DatasetExistsError(SparktrainError, FileExistsError):
    """A dataset directory already exists and overwriting was not allowed."""


class RunMismatchError(ConfigError):
    """An explicit ``runId`` names a run that was trained on other data or params."""

    def __init__(self, run_id: str, changes: Iterable[str]) -> None:
        self.run_id = run_id
        self.changes = list(changes)
        listed = "; ".join(self.changes)
        super().__init__("runId", run_id, f"that run was started on other data or params ({listed}). Fix: unset "
                                          f"runId (every fit() is then a new run) or pick a new one, or fit with "
                                          f"the same data and params to resume it")


#: A search trial's run id (``tune-<8 hex>`` from :func:`sparktrain.tune.search.run_search`, then
#: :meth:`sparktrain.tune._training._TrainingPlan.run_id`'s ``-t<number>``).
TRIAL_RUN_ID = re.compile(r"tune-[0-9a-f]{8}-t\d{3,}")


#: What a rank's heartbeat phase means, in a stall's message (a store phase names the write and the store itself).
_PHASES = {"start": "start-up", "data": "reading its next batch", "compute": "a step's computation",
           "collective": "a collective, waiting for its peers",
           "setup": "setting up (building its network: the model factory; restoring a checkpoint)",
           "step": "its training step (forward, backward and the gradients' all-reduce in one call)"}


class TrainingStalledError(TrainingError):
    """A rank made no progress for ``stallTimeout`` seconds; the fit was stopped (names rank, host, epoch, step).

    ``info`` is the watchdog's (``rank``, ``host``, ``epoch``, ``step``, ``phase``, ``seconds``, ``silent``,
    ``spark_task``, ``run``: the run id to fit again with to resume).
    """

    def __init__(self, info: dict, timeout: float) -> None:
        self.info = dict(info)
        run = info.get("run")
        resume = (f"fit again with runId={run!r} to resume run {run} from its last checkpoint" if run
                  else "the run resumes from its last checkpoint with the same runId")
        if run and TRIAL_RUN_ID.fullmatch(str(run)):  # a search's trial: nobody fits it again by its id
            resume = (f"this is a trial of a search ({run}): the search records it FAILED and goes on with its next "
                      f"trial; its last checkpoint stays in the store")
        phase = info.get("phase") or "start"
        what = "sent nothing (frozen or lost)" if info.get("silent") else \
            f"was stuck in {_PHASES.get(phase, phase)}"
        if info.get("all_in_step"):
            what += ("; so was every overdue rank, so the heartbeats cannot tell the one stuck in its network or "
                     "loss from those waiting for it in the all-reduce (a rank's Python stack shows it: py-spy "
                     "dump, or faulthandler)")
        if info.get("spark_task"):
            what += {"RUNNING": "; Spark reports its task still running: the process is alive but silent",
                     "PENDING": "; Spark's retry of the stage never started its task (it waited for free task "
                                "slots)",
                     "unknown": "; Spark's status tracker could not say whether its task runs"
                     }.get(info["spark_task"], f"; Spark reports its task {info['spark_task']}")
        super().__init__(
            f"rank {info.get('rank')} made no progress for {info.get('seconds')} s at epoch {info.get('epoch')}, "
            f"step {info.get('step')} ({what}); stallTimeout = {timeout:g} s. The barrier stage was cancelled. "
            f"Fix: find what blocks that rank (the store or data source it waits on, a deadlock in user code, a "
            f"lost host), or raise "
            f"stallTimeout (train.stall_timeout_s) if its steps are legitimately that slow; {resume}",
            rank=info.get("rank"), host=info.get("host"))


class SlotsUnavailableError(TrainingError):
    """Spark's retry of a failed training stage waited ``stallTimeout`` seconds for task slots that never came.

    A retried barrier stage starts only when all its tasks can start at once; after a lost executor
    that may be never.  The retry was cancelled; ``needed``, ``free`` and ``waited_s`` say why.
    """

    def __init__(self, run_id: str, needed: int, free: int, waited_s: float, cause: str = "",
                 min_workers: Optional[int] = None) -> None:
        self.run_id, self.needed, self.free, self.waited_s = run_id, needed, free, waited_s
        first = f"{cause} -- then " if cause else ""
        elastic = (f"lower minWorkers (train.min_workers, now {min_workers}) to at most {free}"
                   if min_workers is not None else
                   f"set elastic=True (train.elastic) with minWorkers <= {free} to continue on the free slots")
        super().__init__(
            f"{first}Spark's retry of the training stage waited {waited_s:.0f} s (stallTimeout) for {needed} task "
            f"slots at once, and only {free} were free (an executor was lost and not replaced, or other jobs hold "
            f"the slots). The retry was "
            f"cancelled. Fix: add executors (or free the slots other jobs hold), or {elastic}; fit again with "
            f"runId={run_id!r} to resume from the last checkpoint")


class OutputNotOwnedError(SparktrainError, FileExistsError):
    """An output folder holds files sparktrain did not write, so replacing it would destroy them.

    sparktrain replaces only an empty folder or one that carries its own
    marker (``features.json`` or ``_manifest.json``).

    Parameters
    ----------
    path : str
        The folder, as the user gave it.
    what : str
        The setting that named it (``output.path``, ``--output``).
    entries : list of str
        Up to a few of the names it holds (folders end in ``/``).
    total : int
        How many entries it holds in all.
    markers : iterable of str
        The marker names that would have made it sparktrain's.
    not_ours : iterable of str
        Files named like a marker whose content is not sparktrain's (not its
        format name or an unknown version).
    """

    def __init__(self, path: str, what: str, entries: Iterable[str], total: int,
                 markers: Iterable[str] = ("features.json", "_manifest.json"), not_ours: Iterable[str] = ()) -> None:
        self.path = path
        self.what = what
        self.entries = list(entries)
        self.total = total
        shown = ", ".join(self.entries[:-1]) + f" and {self.entries[-1]}" if len(self.entries) > 1 else \
            "".join(self.entries)
        if total > len(self.entries):
            shown = f"{', '.join(self.entries)} and {total - len(self.entries)} more"
        marks = " or ".join(markers)
        fakes = list(not_ours)
        if fakes:
            marks += f"; its {' and '.join(fakes)} is not sparktrain's: not its format name or a version it knows"
        super().__init__(
            f"{what} '{path}' holds {shown}, and no sparktrain marker ({marks}): sparktrain replaces only a "
            f"folder it wrote, or an empty one, so nothing was written or deleted. Fix: choose an empty or new "
            f"folder for {what}, or delete '{path}' yourself if what it holds can go")

    def __str__(self) -> str:  # OSError would otherwise format (errno, strerror)
        return str(self.args[0])


class LeaseHeldError(SparktrainError, RuntimeError):
    """Another job holds the lease on a run or an output (:mod:`sparktrain.data.lease`).

    Parameters
    ----------
    what : str
        What names the target (``runId``, ``output.path``, ``--output``).
    target : str
        The run's folder or the output path.
    lease : str
        The lease file.
    holder : dict
        ``host``, ``pid`` and ``started_at`` of the job that holds it.
    age : float
        Seconds since its last heartbeat.
    stale_after : float
        Seconds without a heartbeat after which a lease is taken over.
    clear : str, optional
        How to take the lease over at once (default: delete the lease file).
    """

    def __init__(self, what: str, target: str, lease: str, holder: dict, age: float, stale_after: float,
                 clear: Optional[str] = None) -> None:
        from sparktrain._internal.secrets import mask_value

        self.what, self.target, self.lease = what, target, lease
        self.holder = dict(holder)
        self.age, self.stale_after = age, stale_after
        import os
        import socket

        who = (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
               f"{holder.get('started_at', '?')}")
        mine = holder.get("pid") == os.getpid() and holder.get("host") in (socket.gethostname(), None)
        job = "another job in this process (a fit or search in another thread)" if mine else "another job"
        named = (f"runId '{target.rstrip('/').rsplit('/', 1)[-1]}' (run folder {mask_value(target)})"
                 if what == "runId" else f"{what} '{mask_value(target)}'")
        super().__init__(
            f"{named} is in use by {job} ({who}; last heartbeat {age:.0f} s ago), so "
            f"this job was refused and left it untouched. Fix: wait for that job to finish, or use another {what}. If "
            f"that job is gone (killed, its host lost), its lease is taken over automatically once it has sent no "
            f"heartbeat for {stale_after:.0f} s; to take over at once, "
            + (clear or f"delete the lease file '{mask_value(lease)}'")
            + " after making sure that process is not running")


class OutputOverlapError(ConfigError):
    """An output folder overlaps the input, the store, the MLflow store, the current or home directory, or ``/``."""


class PathNotWritableError(ConfigError, PermissionError):
    """A store or output folder (or the nearest folder above it that exists) cannot be written.

    Raised before any Spark job, instead of the ``PermissionError`` the first
    write (a run's lease, a dataset's folder) would raise.

    Parameters
    ----------
    what : str
        The Param or setting that named the folder (``store``, ``train.store``,
        ``output.path``, ``--output``).
    path : str
        The folder, as the user gave it.
    folder : str
        The folder that cannot be written (``path`` or the nearest one above it that exists).
    """

    def __init__(self, what: str, path: str, folder: str) -> None:
        self.folder = folder
        where = "it" if folder == path else f"'{folder}', where it would be made,"
        super().__init__(what, path, f"{where} is not writable by this process, so nothing can be "
                                     f"written there. Fix: make it writable (chmod u+w, chattr -i, a read-write "
                                     f"mount), or point {what} at a folder you can write")

    def __str__(self) -> str:  # OSError would otherwise format (errno, strerror)
        return str(self.args[0])
