"""`import triton_python_backend_utils as pb_utils` inside a model served by tritium."""

# Triton's module imports these itself, so model code can reach them as `pb_utils.np`,
# `pb_utils.json` and `pb_utils.struct`.
import json  # noqa: F401
import struct  # noqa: F401

import numpy as np  # noqa: F401
from tritium.pb_utils import *  # noqa: F401,F403
from tritium.pb_utils import __all__  # noqa: F401
