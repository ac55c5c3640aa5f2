"""The whole `triton_python_backend_utils` API, assembled from the tritium modules that implement it."""

from . import _runtime
from .bls import PreferredMemory, ResponseIterator, is_model_ready, load_model, unload_model  # noqa: F401
from .config import ModelConfig, using_decoupled_model_transaction_policy  # noqa: F401
from .dtypes import *  # noqa: F401,F403
from .dtypes import __all__ as _dtypes_all
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .metrics import MetricFamily  # noqa: F401
from .sender import InferenceResponseSender  # noqa: F401
from .tensor import InferenceRequest, InferenceResponse, InferenceTrace, Logger, Tensor  # noqa: F401


def get_model_dir():
    """The model's version directory (`<repository>/<model>/<version>`), as Triton's stub gives it,
    also for a Python-based backend whose model.py lives in the backend directory."""
    return _runtime.model_dir


__all__ = (
    list(_dtypes_all)
    + list(_errors_all)
    + [
        "ModelConfig",
        "using_decoupled_model_transaction_policy",
        "InferenceRequest",
        "InferenceResponse",
        "InferenceResponseSender",
        "InferenceTrace",
        "Logger",
        "get_model_dir",
        "Tensor",
        "MetricFamily",
        "PreferredMemory",
        "ResponseIterator",
        "is_model_ready",
        "load_model",
        "unload_model",
    ]
)
