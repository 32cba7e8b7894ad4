"""MLflow "models from code" entry point of the sparktrain pyfunc model.

MLflow copies this file into every logged model and runs it at load time
(after the model's bundled ``code/`` folder is on ``sys.path``), so the model
is rebuilt from source instead of being unpickled.
"""

from mlflow.models import set_model

from sparktrain.serve.pyfunc import SparktrainModel

set_model(SparktrainModel())
