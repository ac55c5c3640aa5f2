"""`import triton_python_backend_utils as pb_utils` inside a model served by tritium."""

from tritium.pb_utils import *  # noqa: F401,F403
from tritium.pb_utils import __all__  # noqa: F401
