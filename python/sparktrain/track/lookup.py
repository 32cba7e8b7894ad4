"""Find a model in the MLflow registry before anything reads it: the store, the name, the alias or version.

The CLI (``sparktrain score``) and the Python API (``score_dataframe``,
``load_spark_model``) look a model up the same way: the store it is in
(:func:`use_store`), then :func:`resolve_model`, which refuses a store file
that does not exist, a name, alias or version the registry lacks (listing
what it has) and a version whose files are gone, and pins the URI to the
version it names now.
"""

from __future__ import annotations

import os
import re
from typing import Any, List, Optional

from sparktrain._internal.secrets import mask_value
from sparktrain.errors import ModelNotFoundError, TrackingError

DEFAULT_TRACKING_URI = "sqlite:///work/mlflow.db"
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>[^/]+))?/?$")


def resolve_tracking_uri(tracking_uri: Optional[str] = None) -> str:
    """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else the job default ``sqlite:///work/mlflow.db``."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def registered_model_names(client: Any) -> List[str]:
    """Names of every registered model (sorted)."""
    names, token = [], None
    while True:
        page = client.search_registered_models(max_results=1000, page_token=token)
        names += [m.name for m in page]
        token = getattr(page, "token", None)
        if not token:
            return sorted(names)


def pin_model_uri(client: Any, model_uri: str) -> str:
    """``models:/NAME@alias``, ``models:/NAME`` or ``models:/NAME/latest`` as the version it names now,
    ``models:/NAME/<version>``; any other URI as it is.

    A job that reads a model several times (its signature, its files, once per
    Spark worker) reads one version, even when another job moves the alias
    meanwhile.  Call :func:`check_model_uri` first for a clear error.
    """
    m = _MODELS_URI.match(model_uri)
    if m is None or m["name"].startswith("m-") or (m["version"] and m["version"] != "latest"):
        return model_uri
    name = m["name"]
    if m["alias"]:
        return f"models:/{name}/{client.get_model_version_by_alias(name, m['alias']).version}"
    versions = [int(v.version) for v in client.search_model_versions(f"name='{name}'")]
    return f"models:/{name}/{max(versions)}" if versions else model_uri


def check_model_uri(client: Any, model_uri: str, fix: str = "") -> None:
    """Raise :class:`ModelNotFoundError` when a ``models:/NAME...`` URI names nothing in the registry.

    The message names the model and lists the registered models (or the
    aliases and versions of the named one); ``fix`` is appended when the name
    is not registered at all (e.g. how to point at another store).
    """
    m = _MODELS_URI.match(model_uri)
    if m is None or m["name"].startswith("m-"):  # runs:/, a path, or models:/<logged model id>
        return
    name, alias, version = m["name"], m["alias"], m["version"]
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" not in str(getattr(exc, "error_code", "")) and "not found" not in str(exc):
            raise TrackingError(f"cannot read registered model '{name}' from {mask_value(client.tracking_uri)}: "
                                f"{mask_value(str(exc))}") from exc
        names = registered_model_names(client)
        listed = ", ".join(names) if names else "(none)"
        raise ModelNotFoundError(f"model '{name}' is not in the MLflow registry at {mask_value(client.tracking_uri)}. "
                                 f"Registered models: {listed}. Train one with `sparktrain run CONFIG` "
                                 f"(tracking.model_name) or fix the name in {model_uri}{fix}") from exc
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    if alias:
        try:
            client.get_model_version_by_alias(name, alias)
        except MlflowException as exc:
            aliases = dict(client.get_registered_model(name).aliases or {})
            if alias in aliases:  # the alias row outlived its version
                raise ModelNotFoundError(
                    f"alias '{alias}' of model '{name}' names version {aliases[alias]}, which no longer exists "
                    f"(deleted?; versions: {', '.join(map(str, versions)) or 'none'}); point the alias at a version "
                    f"that exists, or use models:/{name}/<version>") from exc
            raise ModelNotFoundError(f"model '{name}' has no alias '{alias}' (aliases: "
                                     f"{', '.join(sorted(aliases)) or 'none'}; versions: "
                                     f"{', '.join(map(str, versions)) or 'none'}); use "
                                     f"models:/{name}/<version> or set the alias") from exc
    elif version and version != "latest" and (not version.isdigit() or int(version) not in versions):
        raise ModelNotFoundError(f"model '{name}' has no version {version} (versions: "
                                 f"{', '.join(map(str, versions)) or 'none'})")


def missing_db(model_uri: str, registry_uri: str, fix: str) -> None:
    """Refuse a lookup in a sqlite store whose file does not exist: MLflow would create an empty store to say no."""
    from sparktrain.track import store

    uri = store.normalize_uri(registry_uri)
    db = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
    if model_uri.startswith(("models:/", "runs:/")) and db not in ("", ":memory:") and not os.path.exists(db):
        raise ModelNotFoundError(f"cannot look up {model_uri}: there is no MLflow store at {mask_value(uri)} (the "
                                 f"file does not exist){fix}")


def use_store(model_uri: str, tracking_uri: Optional[str] = None) -> Optional[str]:
    """The MLflow store the Python scoring API reads a model from, as ``sparktrain score`` does.

    ``tracking_uri`` when given; else MLflow's process-wide URI when one is set (``mlflow.set_tracking_uri``,
    ``MLFLOW_TRACKING_URI``; returns None); else the job default ``sqlite:///work/mlflow.db``, where
    ``sparktrain run`` registers (MLflow's own default, ``./mlflow.db``, is another file: a fresh notebook found
    no model, and an empty store was created).  A chosen store becomes MLflow's process-wide tracking and
    registry URI, since ``spark_udf`` and the model's download read those; a sqlite file that does not exist
    is refused first (:func:`missing_db`).
    """
    from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

    from sparktrain.track import store

    if (tracking_uri is None and is_tracking_uri_set()) or not model_uri.startswith(("models:/", "runs:/")):
        return tracking_uri  # a path needs no store: none is opened (a default one would be created)
    uri = store.normalize_uri(resolve_tracking_uri(tracking_uri))
    missing_db(model_uri, uri, ". Pass tracking_uri= (the job's tracking.uri), or call mlflow.set_tracking_uri"
                               if tracking_uri is None else "")
    store.configure(uri)
    return uri


def resolve_model(model_uri: str, registry_uri: Optional[str] = None, fix: str = "") -> str:
    """``model_uri`` pinned to the version it names now, after checking that it exists with its files.

    Raises :class:`~sparktrain.errors.ModelNotFoundError` for a sqlite store whose file does not exist (MLflow
    would create an empty one), a model, alias or version the registry does not have (listing what it has), and
    a version whose artifacts are gone (naming the version, its run and where they were), before any Spark job.
    ``registry_uri``: default MLflow's process-wide registry URI.
    """
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from mlflow.models import get_model_info


    registry = registry_uri or mlflow.get_registry_uri()
    missing_db(model_uri, registry, fix or ". Point MLflow at the store that holds it (mlflow.set_registry_uri, "
                                           "MLFLOW_TRACKING_URI)")
    client = None
    pinned = model_uri
    if model_uri.startswith("models:/"):  # a path or runs:/ has no registry entry to check or pin
        client = MlflowClient(registry_uri, registry_uri) if registry_uri else MlflowClient()
        check_model_uri(client, model_uri, fix=fix)
        pinned = pin_model_uri(client, model_uri)
    if client is None:  # a path or runs:/: read as MLflow reads it, when the caller loads it
        return pinned
    try:
        get_model_info(pinned)
    except Exception as exc:  # noqa: BLE001 - MLflow's, the filesystem's or the S3 client's: sorted below
        text = " ".join(str(exc).split())
        if not isinstance(exc, (MlflowException, OSError)) and \
                type(exc).__module__.split(".")[0] not in ("botocore", "boto3", "s3transfer"):
            raise
        where = ""
        m = re.match(r"models:/(?P<name>[^/@]+)/(?P<version>\d+)$", pinned)
        if m:
            mv = client.get_model_version(m["name"], m["version"])
            where = f" (run {mv.run_id}; its files are at {mask_value(str(mv.source))})"
        if "No such artifact" in text or isinstance(exc, FileNotFoundError) or \
                re.search(r"\b404\b|NoSuchKey|Not Found|does not exist", text):
            raise ModelNotFoundError(f"{model_uri} is {pinned}, whose files are gone{where}: its MLmodel cannot "
                                     f"be read ({mask_value(text)[:200]}). Fix: restore the artifact store, or "
                                     f"register the model again (sparktrain register --from-store STORE/RUN) or "
                                     f"score another version") from exc
        raise TrackingError(f"{model_uri} is {pinned}, whose files could not be read{where}: "
                            f"{type(exc).__name__}: {mask_value(text)[:300]}. The artifact store did not answer or "
                            f"refused access; nothing ran. Run again once it answers (check its endpoint and "
                            f"credentials)") from exc
    return pinned


__all__ = ["DEFAULT_TRACKING_URI", "check_model_uri", "missing_db", "pin_model_uri", "registered_model_names",
           "resolve_model", "resolve_tracking_uri", "use_store"]
