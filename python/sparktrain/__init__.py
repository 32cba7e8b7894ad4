"""sparktrain: data-parallel deep learning on Spark DataFrames.

features -> data -> train -> tune -> track: preprocess out of core with Spark ML
stages, stream Parquet into Keras or PyTorch, train in Spark barrier mode,
search with Hyperopt, record everything in MLflow, score as a Transformer.
"""

__version__ = "0.1.0"
