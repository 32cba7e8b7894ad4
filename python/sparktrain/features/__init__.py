"""Feature preprocessing: a declarative spec compiled into Spark ML stages, materialized to Parquet.

Importing this package imports no pyspark (the Spark-free scorer that reads
``features.json`` is :func:`sparktrain.serve.local.transform_local`).  Names
are resolved lazily on first access:

* spec classes (``NumericFeature``, ``CategoricalFeature``, ...) and
  ``parse_features`` (``sparktrain.features.spec``);
* :func:`compile_pipeline`, :func:`plan_features` (``.compile``);
* :func:`fit_features` (``.fit``), :func:`save_pipeline_model` (``.persist``);
* :func:`validate` (``.validate``);
* :func:`materialize`, :func:`format_summary`, ``PreprocessResult``
  (``.materialize``; :func:`sparktrain.job.run_preprocess` is the job's
  entry, with the embedded datasets);
* ``DataConfig``, ``SplitConfig``, ``OutputConfig`` (``.sections``), the
  job config's sections preprocessing reads;
* the stages ``ColumnScaler``, ``VocabularyIndexer``, ``FlatFeatureAssembler``
  and their models (``.stages``), ``VectorEncoder`` and ``TokenIndexer`` and
  their models (``.array_stages``: vector, text and set features),
  ``LabelIndexer`` and its model (``.label_stage``);
* :func:`load_input` (``.load``): the DataFrame a ``data:`` section names.

See ``docs/features.md``.
"""

from __future__ import annotations

from sparktrain._internal.lazy import lazy_exports

_EXPORTS = {
    "NumericFeature": "spec", "CategoricalFeature": "spec", "DatetimeFeature": "spec",
    "BooleanFeature": "spec", "CrossedFeature": "spec", "VectorFeature": "spec", "TextFeature": "spec",
    "SetFeature": "spec", "parse_features": "spec",
    "VectorEncoder": "array_stages", "VectorEncoderModel": "array_stages", "TokenIndexer": "array_stages",
    "TokenIndexerModel": "array_stages",
    "compile_pipeline": "compile", "plan_features": "compile",
    "fit_features": "fit", "save_pipeline_model": "persist",
    "validate": "validate",
    "materialize": "materialize", "format_summary": "materialize", "PreprocessResult": "materialize",
    "DataConfig": "sections", "SplitConfig": "sections", "OutputConfig": "sections",
    "ColumnScaler": "stages", "ColumnScalerModel": "stages", "VocabularyIndexer": "stages",
    "VocabularyIndexerModel": "stages", "FlatFeatureAssembler": "stages",
    "LabelIndexer": "label_stage", "LabelIndexerModel": "label_stage", "load_input": "load",
}

__all__ = ["BooleanFeature", "CategoricalFeature", "ColumnScaler", "ColumnScalerModel", "CrossedFeature",
           "DataConfig", "DatetimeFeature", "FlatFeatureAssembler", "LabelIndexer", "LabelIndexerModel",
           "NumericFeature", "OutputConfig", "PreprocessResult", "SetFeature", "SplitConfig", "TextFeature",
           "TokenIndexer", "TokenIndexerModel", "VectorEncoder", "VectorEncoderModel", "VectorFeature",
           "VocabularyIndexer", "VocabularyIndexerModel", "compile_pipeline", "fit_features", "format_summary",
           "load_input", "materialize", "parse_features", "plan_features", "save_pipeline_model", "validate"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
