"""Triton dtype <-> numpy mappings, BYTES tensor (de)serialization and the pb_utils config/tensor lookups."""

import struct
from collections import namedtuple

import numpy as np

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
]

# BF16 in Triton's python backend (there is no numpy bfloat16):
# - triton_to_numpy_type(14) returns None, triton_string_to_numpy("TYPE_BF16")
#   raises KeyError and numpy_to_triton_type() never returns 14.
# - Tensor.as_numpy() on a BF16 tensor raises TritonModelException("Tensor dtype
#   is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack()
#   instead."); triton_dtype() still reports 14. A BF16 tensor can only be made
#   with Tensor.from_dlpack() (e.g. from a torch.bfloat16 tensor).

# Model-config DataType values; TRITONSERVER_DataType uses the same numbers
# (TYPE_INVALID = 0, TYPE_STRING/BYTES = 13, TYPE_BF16 = 14).
_TRITON_TO_NUMPY = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}

# Note: "TYPE_BOOL" maps to the Python builtin bool, as in Triton.
TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# KServe wire dtype name -> Triton enum value, model-config type name, numpy
# dtype (None for BF16) and element byte size (None for variable-size BYTES).
_WireDtype = namedtuple("_WireDtype", "triton_type config_type numpy_dtype itemsize")
WIRE_DTYPES = {
    "BOOL": _WireDtype(1, "TYPE_BOOL", np.dtype(np.bool_), 1),
    "UINT8": _WireDtype(2, "TYPE_UINT8", np.dtype(np.uint8), 1),
    "UINT16": _WireDtype(3, "TYPE_UINT16", np.dtype(np.uint16), 2),
    "UINT32": _WireDtype(4, "TYPE_UINT32", np.dtype(np.uint32), 4),
    "UINT64": _WireDtype(5, "TYPE_UINT64", np.dtype(np.uint64), 8),
    "INT8": _WireDtype(6, "TYPE_INT8", np.dtype(np.int8), 1),
    "INT16": _WireDtype(7, "TYPE_INT16", np.dtype(np.int16), 2),
    "INT32": _WireDtype(8, "TYPE_INT32", np.dtype(np.int32), 4),
    "INT64": _WireDtype(9, "TYPE_INT64", np.dtype(np.int64), 8),
    "FP16": _WireDtype(10, "TYPE_FP16", np.dtype(np.float16), 2),
    "FP32": _WireDtype(11, "TYPE_FP32", np.dtype(np.float32), 4),
    "FP64": _WireDtype(12, "TYPE_FP64", np.dtype(np.float64), 8),
    "BYTES": _WireDtype(13, "TYPE_STRING", np.dtype(np.object_), None),
    "BF16": _WireDtype(14, "TYPE_BF16", None, 2),
}


def triton_to_numpy_type(data_type):
    """Numpy type for a Triton DataType int, or None (also for BF16 and INVALID)."""
    return _TRITON_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type):
    """Triton DataType int for a numpy type or dtype (compared with ==), or None."""
    for triton_type, np_type in _TRITON_TO_NUMPY.items():
        if data_type == np_type:
            return triton_type
    if data_type == np.bytes_:
        return 13
    return None


def triton_string_to_numpy(triton_type_string):
    """Numpy type for a "TYPE_*" string; KeyError for unknown names and TYPE_BF16."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor):
    """Serialize an object/bytes_ array as 4-byte little-endian length-prefixed elements in C order.

    Returns bytes; like Triton, returns () for an empty array and None for
    any other dtype (str_ arrays included). Object elements that are not
    exactly `bytes` are written as str(element) encoded in UTF-8; bytes_
    elements lose trailing NUL bytes (numpy strips them).
    """
    if input_tensor.size == 0:
        return ()
    is_object = input_tensor.dtype == np.object_
    if not is_object and input_tensor.dtype.type != np.bytes_:
        return None
    chunks = []
    for item in input_tensor.flat:
        if is_object and type(item) is not bytes:
            item = str(item).encode("utf-8")
        chunks.append(struct.pack("<I", len(item)))
        chunks.append(item)
    return b"".join(chunks)


def deserialize_bytes_tensor(encoded_tensor):
    """Decode length-prefixed elements into a 1-D object array of bytes (struct.error if truncated)."""
    items = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        (item,) = struct.unpack_from(f"<{length}s", encoded_tensor, offset)
        offset += length
        items.append(item)
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def get_input_tensor_by_name(inference_request, name):
    """The request's input Tensor called `name`, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    """The response's output Tensor called `name`, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config, name):
    """The model-config dict entry of input `name`, or None."""
    for properties in model_config.get("input", ()):
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config, name):
    """The model-config dict entry of output `name`, or None."""
    for properties in model_config.get("output", ()):
        if properties["name"] == name:
            return properties
    return None
