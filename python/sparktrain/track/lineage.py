"""Data lineage: the train/validation/test splits, and the sources they came from, as MLflow dataset inputs.

The splits come from each split's ``_manifest.json`` (path, digest, row
count, schema); no data is read.  A dataset's MLflow digest is the first 32
hex characters of the manifest digest (MLflow keeps at most 36); the full
sha256 is in its profile.  The sources come from ``features.json``'s
``dataset.sources``, which the lineage listener (:mod:`sparktrain.jvm`) filled
while the features were materialized: each file source or table the job read,
logged with the context ``source`` (digest: of the file listing).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from typing import Any, Dict, List, Mapping, Optional, Sequence

from mlflow.data.meta_dataset import MetaDataset

from sparktrain._internal.secrets import mask_value

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
CONTEXTS = {"train": "training", "validation": "validation", "test": "testing"}
SOURCE_CONTEXT = "source"

# Arrow type strings (as the manifest writes them) -> MLflow column types.
_TYPES = {"float": "float", "double": "double", "int8": "integer", "int16": "integer", "int32": "integer",
          "int64": "long", "uint8": "integer", "uint16": "integer", "uint32": "long", "bool": "boolean",
          "string": "string", "large_string": "string", "binary": "binary", "large_binary": "binary",
          "date32[day]": "datetime"}


def mlflow_schema(entries: Sequence[Mapping[str, Any]]):
    """An :class:`mlflow.types.Schema` for a manifest's ``schema`` list (lists as arrays)."""
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    cols: List[Any] = []
    for e in entries:
        t = str(e["type"])
        if t.startswith(("list<", "large_list<", "fixed_size_list<")):
            inner = t[t.index("<") + 1:t.index(">")]
            col_type: Any = Array(DataType[_TYPES.get(inner, "string")])
        elif t.startswith("timestamp"):
            col_type = DataType.datetime
        else:
            col_type = DataType[_TYPES.get(t, "string")]
        cols.append(ColSpec(col_type, e["name"], required=not e.get("nullable", True)))
    return Schema(cols)


class ManifestDataset(MetaDataset):
    """A metadata-only MLflow dataset built from a ``_manifest.json`` (the data is never loaded)."""

    def __init__(self, path: str, manifest: Mapping[str, Any], name: Optional[str] = None) -> None:
        from mlflow.data.spark_dataset_source import SparkDatasetSource

        self._manifest = dict(manifest)
        full = str(manifest.get("digest") or "")
        super().__init__(source=SparkDatasetSource(path=path if "://" in path else os.path.abspath(path)),
                         name=name or posixpath.basename(path.rstrip("/")),
                         digest=full[:32] or None, schema=mlflow_schema(manifest.get("schema", [])))

    @property
    def profile(self) -> Dict[str, Any]:
        m = self._manifest
        files = m.get("files", [])
        return {"num_rows": int(m.get("num_rows", 0)), "num_files": len(files),
                "size_bytes": int(sum(f.get("size_bytes", 0) for f in files)),
                "sha256": m.get("digest"), "created_at": m.get("created_at")}

    def to_dict(self) -> Dict[str, str]:
        out = super().to_dict()
        out["profile"] = json.dumps(self.profile)
        return out


class SourceDataset(MetaDataset):
    """A source the features were computed from (files or a table), as the lineage listener recorded it."""

    def __init__(self, source: Mapping[str, Any]) -> None:
        from mlflow.data.spark_dataset_source import SparkDatasetSource

        from sparktrain.jvm import local_path

        self._record = dict(source)
        paths = [local_path(p) for p in source.get("paths") or []]
        table = source.get("table")
        if table:
            src_origin, name = SparkDatasetSource(table_name=str(table)), str(table)
        else:
            src_origin = SparkDatasetSource(path=paths[0] if paths else "")
            name = os.path.basename(os.path.normpath(paths[0])) if paths else "source"
        super().__init__(source=src_origin, name=name, digest=str(source.get("digest") or "")[:32] or None)

    @property
    def profile(self) -> Dict[str, Any]:
        s = self._record
        return {k: s[k] for k in ("format", "paths", "files", "size_bytes") if k in s} | {
            "listing_sha256": s.get("digest")}

    def to_dict(self) -> Dict[str, str]:
        out = super().to_dict()
        out["profile"] = json.dumps(self.profile)
        return out


def source_datasets(dataset_root: str) -> List[SourceDataset]:
    """The sources in ``features.json``'s ``dataset.sources`` (empty when it has none)."""
    import pyarrow.fs as pafs

    from sparktrain.data import _fs
    from sparktrain.data.commit import resolve

    fs, base = _fs.resolve(resolve(dataset_root))
    path = _fs.join(base, "features.json")
    if _fs.info(fs, path).type != pafs.FileType.File:
        return []
    with fs.open_input_stream(path) as fh:
        sources = (json.loads(fh.read()).get("dataset") or {}).get("sources") or []
    return [SourceDataset(s) for s in sources]


def read_split_manifest(dataset_root: str, split: str) -> Optional[Dict[str, Any]]:
    """The manifest of one split, or ``None`` when the split or its manifest is absent."""
    from sparktrain.data.manifest import read_manifest

    return read_manifest(posixpath.join(dataset_root, split))  # local paths and URIs (pyarrow.fs)


def split_datasets(dataset_root: str, name: Optional[str] = None) -> Dict[str, ManifestDataset]:
    """``{split: ManifestDataset}`` for the splits of a materialized dataset that have a manifest."""
    base = name or posixpath.basename(dataset_root.rstrip("/"))
    out = {}
    for split in SPLITS:
        manifest = read_split_manifest(dataset_root, split)
        if manifest is None:
            log.warning("no manifest for split '%s' under %s: not logged as a dataset input", split, dataset_root)
            continue
        out[split] = ManifestDataset(posixpath.join(dataset_root, split), manifest, name=f"{base}-{split}")
    return out


def log_dataset_inputs(client: Any, run_ids: Sequence[str], dataset_root: str,
                       name: Optional[str] = None) -> Dict[str, ManifestDataset]:
    """``log_inputs`` of every split (context: training/validation/testing) and every source the dataset was
    computed from (context: source) to each run in ``run_ids``; returns the splits."""
    datasets = split_datasets(dataset_root, name)
    inputs = [_dataset_input(ds, CONTEXTS[s]) for s, ds in datasets.items()]
    inputs += [_dataset_input(src, SOURCE_CONTEXT) for src in source_datasets(dataset_root)]
    if inputs:
        for run_id in run_ids:
            client.log_inputs(run_id, datasets=inputs)
    return datasets


def log_source_inputs(client: Any, run_ids: Sequence[str], dataset_root: str) -> List[SourceDataset]:
    """``log_inputs`` of the sources of a dataset (context: source) to each run in ``run_ids``."""
    sources = source_datasets(dataset_root)
    inputs = [_dataset_input(src, SOURCE_CONTEXT) for src in sources]
    if inputs:
        for run_id in run_ids:
            client.log_inputs(run_id, datasets=inputs)
    return sources


def _dataset_input(dataset: MetaDataset, context: str) -> Any:
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    e = dataset._to_mlflow_entity()
    masked = Dataset(name=e.name, digest=e.digest, source_type=e.source_type, source=mask_value(e.source),
                     schema=e.schema, profile=mask_value(e.profile) if e.profile else e.profile)  # a URI's password
    return DatasetInput(masked, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])


def manifest_files(dataset_root: str) -> Dict[str, str]:
    """``{split: path of _manifest.json}`` for the splits that have one."""
    from sparktrain.data.commit import resolve
    from sparktrain.data.manifest import MANIFEST_NAME

    dataset_root = resolve(dataset_root)
    out = {}
    for split in SPLITS:
        p = os.path.join(dataset_root, split, MANIFEST_NAME)
        if os.path.isfile(p):
            out[split] = p
    return out
