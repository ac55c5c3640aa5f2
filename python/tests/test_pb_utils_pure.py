"""Tests for the pure-Python pb_utils parts: dtypes, byte tensors, errors and ModelConfig."""

import json
import struct

import numpy as np
import pytest
from tritium import config, dtypes, errors, tensor
from tritium.config import ModelConfig, using_decoupled_model_transaction_policy
from tritium.errors import TritonError, TritonModelException

# (Triton enum value, "TYPE_*" name, KServe wire name, numpy type)
TYPES = [
    (1, "TYPE_BOOL", "BOOL", np.bool_),
    (2, "TYPE_UINT8", "UINT8", np.uint8),
    (3, "TYPE_UINT16", "UINT16", np.uint16),
    (4, "TYPE_UINT32", "UINT32", np.uint32),
    (5, "TYPE_UINT64", "UINT64", np.uint64),
    (6, "TYPE_INT8", "INT8", np.int8),
    (7, "TYPE_INT16", "INT16", np.int16),
    (8, "TYPE_INT32", "INT32", np.int32),
    (9, "TYPE_INT64", "INT64", np.int64),
    (10, "TYPE_FP16", "FP16", np.float16),
    (11, "TYPE_FP32", "FP32", np.float32),
    (12, "TYPE_FP64", "FP64", np.float64),
    (13, "TYPE_STRING", "BYTES", np.object_),
]


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("enum_value,type_name,wire,np_type", TYPES)
def test_dtype_mappings_both_ways(enum_value, type_name, wire, np_type):
    assert dtypes.triton_to_numpy_type(enum_value) is np_type
    assert dtypes.numpy_to_triton_type(np_type) == enum_value
    assert dtypes.numpy_to_triton_type(np.dtype(np_type)) == enum_value
    expected = bool if type_name == "TYPE_BOOL" else np_type
    assert dtypes.triton_string_to_numpy(type_name) is expected
    assert dtypes.TRITON_STRING_TO_NUMPY[type_name] is expected
    info = dtypes.WIRE_DTYPES[wire]
    assert info.triton_type == enum_value
    assert info.config_type == type_name
    assert info.numpy_dtype == np.dtype(np_type)
    if wire != "BYTES":
        assert info.itemsize == np.dtype(np_type).itemsize
        assert tensor._wire_dtype(np.zeros(2, dtype=np_type)) == wire


def test_string_to_numpy_bool_is_python_bool():
    assert dtypes.triton_string_to_numpy("TYPE_BOOL") is bool
    assert dtypes.triton_to_numpy_type(1) is np.bool_


def test_bf16_and_invalid_have_no_numpy_type():
    assert dtypes.triton_to_numpy_type(14) is None
    assert dtypes.triton_to_numpy_type(0) is None
    assert dtypes.triton_to_numpy_type(15) is None
    with pytest.raises(KeyError):
        dtypes.triton_string_to_numpy("TYPE_BF16")
    with pytest.raises(KeyError):
        dtypes.triton_string_to_numpy("TYPE_INVALID")
    bf16 = dtypes.WIRE_DTYPES["BF16"]
    assert (bf16.triton_type, bf16.config_type, bf16.numpy_dtype, bf16.itemsize) == (
        14,
        "TYPE_BF16",
        None,
        2,
    )


def test_wire_table_is_complete():
    assert set(dtypes.WIRE_DTYPES) == {w for _, _, w, _ in TYPES} | {"BF16"}
    assert dtypes.WIRE_DTYPES["BYTES"].itemsize is None


def test_numpy_to_triton_bytes_and_unsupported():
    assert dtypes.numpy_to_triton_type(np.bytes_) == 13
    assert dtypes.numpy_to_triton_type(np.dtype("S")) == 13
    # Like Triton: sized bytes_ dtypes, str_ and unknown types give None.
    assert dtypes.numpy_to_triton_type(np.dtype("S5")) is None
    assert dtypes.numpy_to_triton_type(np.str_) is None
    assert dtypes.numpy_to_triton_type(np.complex64) is None
    assert dtypes.numpy_to_triton_type("TYPE_FP32") is None


@pytest.mark.parametrize(
    "arr",
    [
        np.array([b"a"], dtype=np.object_),
        np.array(["a", "bc"], dtype=np.object_),
        np.array([b"ab", b"c"]),
        np.array(["ab", "c"]),
        np.array([], dtype=np.object_),
    ],
)
def test_wire_dtype_of_string_arrays(arr):
    assert tensor._wire_dtype(arr) == "BYTES"


@pytest.mark.parametrize(
    "arr",
    [
        np.zeros(2, dtype=np.complex64),
        np.zeros(2, dtype="datetime64[s]"),
        np.zeros(2, dtype=">f4"),
    ],
)
def test_wire_dtype_of_unsupported_arrays(arr):
    with pytest.raises(TritonModelException, match="^NumPy dtype is not supported.$"):
        tensor._wire_dtype(arr)


# ---------------------------------------------------------------- bytes tensors


def encode(items):
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def test_serialize_exact_wire_format():
    arr = np.array([b"ab", b"", b"xyz"], dtype=np.object_)
    assert dtypes.serialize_byte_tensor(arr) == (b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz")


def test_serialize_str_objects_as_utf8_and_non_bytes_via_str():
    arr = np.array(["héllo", "日本", 12, 1.5], dtype=np.object_)
    expected = encode(["héllo".encode(), "日本".encode(), b"12", b"1.5"])
    assert dtypes.serialize_byte_tensor(arr) == expected


def test_serialize_c_order_for_2d_and_fortran_arrays():
    items = [[b"a", b"bb", b""], [b"ccc", "\u00e9", b"d"]]
    arr = np.empty((2, 3), dtype=np.object_)
    arr[:] = items
    expected = encode([b"a", b"bb", b"", b"ccc", "\u00e9".encode(), b"d"])
    assert dtypes.serialize_byte_tensor(arr) == expected
    assert dtypes.serialize_byte_tensor(np.asfortranarray(arr)) == expected
    assert dtypes.serialize_byte_tensor(arr.T) == encode([b"a", b"ccc", b"bb", "\u00e9".encode(), b"", b"d"])


def test_serialize_bytes_dtype_drops_trailing_nuls():
    arr = np.array([b"a\x00", b"bc"])
    assert arr.dtype.type is np.bytes_
    assert dtypes.serialize_byte_tensor(arr) == encode([b"a", b"bc"])


def test_serialize_keeps_inner_nuls_in_object_arrays():
    arr = np.array([b"a\x00", b"\x00b"], dtype=np.object_)
    assert dtypes.serialize_byte_tensor(arr) == encode([b"a\x00", b"\x00b"])


def test_serialize_scalar():
    arr = np.array(b"only", dtype=np.object_)
    assert arr.shape == ()
    assert dtypes.serialize_byte_tensor(arr) == encode([b"only"])


def test_serialize_empty_and_unsupported_match_triton():
    assert dtypes.serialize_byte_tensor(np.empty([0], dtype=np.object_)) == ()
    assert dtypes.serialize_byte_tensor(np.empty([2, 0], dtype=np.object_)) == ()
    assert dtypes.serialize_byte_tensor(np.array([1, 2], dtype=np.int32)) is None
    assert dtypes.serialize_byte_tensor(np.array(["a"])) is None


@pytest.mark.parametrize(
    "items,shape",
    [
        ([b"a", b"", b"\xff\x00\x01", "é😀".encode(), b"x" * 70000], [5]),
        ([b"1", b"22", b"", b"4444", "ü".encode(), b"666666"], [2, 3]),
        ([b""], []),
        ([b"", b""], [2]),
    ],
)
def test_round_trip(items, shape):
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = items
    arr = arr.reshape(shape)
    encoded = dtypes.serialize_byte_tensor(arr)
    assert isinstance(encoded, bytes)
    decoded = dtypes.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == np.object_
    assert decoded.shape == (len(items),)
    assert list(decoded) == items
    assert all(type(x) is bytes for x in decoded)
    assert np.array_equal(decoded.reshape(shape), arr)


def test_deserialize_accepts_buffers_and_empty():
    data = encode([b"ab", b"c"])
    for buf in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert list(dtypes.deserialize_bytes_tensor(buf)) == [b"ab", b"c"]
    empty = dtypes.deserialize_bytes_tensor(b"")
    assert empty.dtype == np.object_ and empty.shape == (0,)


def test_deserialize_equal_length_items_stay_1d_objects():
    decoded = dtypes.deserialize_bytes_tensor(encode([b"ab", b"cd"]))
    assert decoded.shape == (2,)
    assert decoded[0] == b"ab"


def test_deserialize_truncated_raises():
    with pytest.raises(struct.error):
        dtypes.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")
    with pytest.raises(struct.error):
        dtypes.deserialize_bytes_tensor(encode([b"ok"]) + b"\x01\x00")


# ---------------------------------------------------------------- lookups


class _Named:
    def __init__(self, name):
        self._n = name

    def name(self):
        return self._n


class _Request:
    def __init__(self, tensors):
        self._t = tensors

    def inputs(self):
        return self._t

    def output_tensors(self):
        return self._t


def test_tensor_lookups():
    a, b = _Named("A"), _Named("B")
    holder = _Request([a, b])
    assert dtypes.get_input_tensor_by_name(holder, "B") is b
    assert dtypes.get_input_tensor_by_name(holder, "C") is None
    assert dtypes.get_output_tensor_by_name(holder, "A") is a
    assert dtypes.get_output_tensor_by_name(holder, "Z") is None


def test_config_lookups():
    cfg = {
        "input": [{"name": "IN0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    }
    assert dtypes.get_input_config_by_name(cfg, "IN0") is cfg["input"][0]
    assert dtypes.get_input_config_by_name(cfg, "OUT0") is None
    assert dtypes.get_output_config_by_name(cfg, "OUT0") is cfg["output"][0]
    assert dtypes.get_output_config_by_name(cfg, "IN0") is None
    assert dtypes.get_input_config_by_name({}, "IN0") is None
    assert dtypes.get_output_config_by_name({}, "OUT0") is None


def test_decoupled_policy_helper():
    assert using_decoupled_model_transaction_policy({}) is False
    assert using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})
    assert not using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": False}})


# ---------------------------------------------------------------- errors


def test_error_codes_match_tritonserver_h():
    expected = {
        "UNKNOWN": 0,
        "INTERNAL": 1,
        "NOT_FOUND": 2,
        "INVALID_ARG": 3,
        "UNAVAILABLE": 4,
        "UNSUPPORTED": 5,
        "ALREADY_EXISTS": 6,
        "CANCELLED": 7,
    }
    for name, value in expected.items():
        assert getattr(TritonError, name) == value
        assert int(getattr(TritonError, name)) == value
    assert {c.name for c in errors.ErrorCode} == set(expected)


def test_triton_error_defaults_and_accessors():
    err = TritonError("boom")
    assert err.message() == "boom"
    assert err.code() == TritonError.INTERNAL
    assert str(err) == "boom"
    assert repr(err) == "TritonError('boom', TritonError.INTERNAL)"
    err = TritonError("gone", TritonError.NOT_FOUND)
    assert err.code() == TritonError.NOT_FOUND == 2
    assert TritonError(message="x", code=7).code() is TritonError.CANCELLED
    # Printed as pybind prints Triton's enum, and still an int for comparisons and the wire.
    assert str(err.code()) == f"{err.code()}" == "__ErrorCode.NOT_FOUND"
    assert repr(err.code()) == "<__ErrorCode.NOT_FOUND: 2>"
    assert int(err.code()) == 2


def test_triton_error_rejects_bad_arguments():
    with pytest.raises(TypeError):
        TritonError(None)
    with pytest.raises(TypeError, match="TritonError code must be one of"):
        TritonError("x", 42)


def test_triton_error_is_not_an_exception_but_model_exception_is():
    assert not issubclass(TritonError, BaseException)
    assert issubclass(TritonModelException, Exception)
    with pytest.raises(TritonModelException, match="bad"):
        raise TritonModelException("bad")


def test_flag_and_enum_constants():
    assert errors.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert errors.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert errors.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert errors.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert errors.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert errors.TRITONSERVER_MEMORY_GPU == 0
    assert errors.TRITONSERVER_MEMORY_CPU == 1
    assert [(m.name, m.value) for m in errors.LogLevel] == [
        ("INFO", 0),
        ("WARNING", 1),
        ("ERROR", 2),
        ("VERBOSE", 3),
    ]
    assert [(m.name, m.value) for m in errors.MetricKind] == [
        ("COUNTER", 0),
        ("GAUGE", 1),
        ("HISTOGRAM", 2),
    ]


def test_all_lists_exist():
    for module in (config, dtypes, errors):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)
            assert not name.startswith("_")


# ---------------------------------------------------------------- ModelConfig


def triton_json(**overrides):
    """A config as Triton passes it: JSON text with primitive fields printed."""
    cfg = {
        "name": "m",
        "platform": "",
        "backend": "python",
        "max_batch_size": 0,
        "input": [],
        "output": [],
        "instance_group": [],
    }
    cfg.update(overrides)
    return json.dumps(cfg)


def test_model_config_from_json_and_dict():
    mc = ModelConfig(triton_json(max_batch_size=4))
    assert mc.as_dict()["max_batch_size"] == 4
    assert mc.as_dict()["backend"] == "python"
    assert mc.as_dict() is mc._model_config
    d = {"name": "m"}
    mc = ModelConfig(d)
    assert mc.as_dict() is d
    assert d == {"name": "m", "max_batch_size": 0, "input": [], "output": []}


def test_set_max_batch_size():
    mc = ModelConfig(triton_json())
    mc.set_max_batch_size(8)
    assert mc.as_dict()["max_batch_size"] == 8
    mc.set_max_batch_size(8)
    mc.set_max_batch_size(16)
    assert mc.as_dict()["max_batch_size"] == 16
    with pytest.raises(ValueError) as e:
        mc.set_max_batch_size(4)
    assert str(e.value) == (
        "configuration specified max_batch_size 16, but in auto-complete-config "
        "function for model 'm' specified max_batch_size 4"
    )
    assert mc.as_dict()["max_batch_size"] == 16


def test_set_dynamic_batching():
    mc = ModelConfig(triton_json())
    mc.set_dynamic_batching()
    assert mc.as_dict()["dynamic_batching"] == {}
    mc = ModelConfig(triton_json(dynamic_batching={"max_queue_delay_microseconds": 5}))
    mc.set_dynamic_batching()
    assert mc.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}
    for scheduler in ("sequence_batching", "ensemble_scheduling"):
        mc = ModelConfig(triton_json(**{scheduler: {}}))
        with pytest.raises(ValueError) as e:
            mc.set_dynamic_batching()
        assert str(e.value) == (
            f"Configuration specified scheduling_choice as '{scheduler}', but "
            "auto-complete-config function for model 'm' tries to set "
            "scheduling_choice as 'dynamic_batching'"
        )
        assert "dynamic_batching" not in mc.as_dict()


def test_add_input_and_output_append():
    mc = ModelConfig(triton_json())
    inp = {"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True}
    out = {"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}
    mc.add_input(inp)
    mc.add_output(out)
    assert mc.as_dict()["input"] == [inp]
    assert mc.as_dict()["output"] == [out]


def test_add_input_completes_existing_entry():
    existing = {
        "name": "IN",
        "data_type": "TYPE_INVALID",
        "dims": [],
        "optional": False,
        "format": "FORMAT_NONE",
    }
    mc = ModelConfig(triton_json(input=[existing]))
    mc.add_input({"name": "IN", "data_type": "TYPE_INT64", "dims": [-1, 2]})
    assert mc.as_dict()["input"] == [
        {
            "name": "IN",
            "data_type": "TYPE_INT64",
            "dims": [-1, 2],
            "optional": False,
            "format": "FORMAT_NONE",
        }
    ]
    # Same properties again: accepted, nothing appended.
    mc.add_input({"name": "IN", "data_type": "TYPE_INT64", "dims": [-1, 2], "optional": False})
    assert len(mc.as_dict()["input"]) == 1


def test_add_output_completes_existing_entry():
    mc = ModelConfig(triton_json(output=[{"name": "OUT", "data_type": "TYPE_FP16", "dims": []}]))
    mc.add_output({"name": "OUT", "data_type": "TYPE_FP16", "dims": [3]})
    assert mc.as_dict()["output"] == [{"name": "OUT", "data_type": "TYPE_FP16", "dims": [3]}]


def _error(fn, arg):
    with pytest.raises(ValueError) as e:
        fn(arg)
    return str(e.value)


def test_add_input_errors():
    cfg = triton_json(input=[{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": False}])
    mc = ModelConfig(cfg)
    assert _error(mc.add_input, {"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1}) == (
        "input 'X' in auto-complete-config function for model 'm' contains property "
        "other than 'name', 'data_type', 'dims' and 'optional'."
    )
    assert _error(mc.add_input, {"data_type": "TYPE_FP32", "dims": [1]}) == (
        "input in auto-complete-config function for model 'm' is missing 'name' property."
    )
    assert _error(mc.add_input, {"name": "X", "dims": [1]}) == (
        "input 'X' in auto-complete-config function for model 'm' is missing 'data_type' property."
    )
    assert _error(mc.add_input, {"name": "X", "data_type": "TYPE_FP32"}) == (
        "input 'X' in auto-complete-config function for model 'm' is missing 'dims' property."
    )
    assert _error(mc.add_input, {"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'IN', model provides TYPE_INT32"
    )
    assert _error(mc.add_input, {"name": "IN", "data_type": "TYPE_FP32", "dims": [5]}) == (
        "model 'm', tensor 'IN': the model expects dims [5] but the model configuration specifies dims [4]"
    )
    assert _error(mc.add_input, {"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True}) == (
        "model 'm', tensor 'IN': the model expects optional True but the model configuration specifies optional False"
    )
    assert ModelConfig(cfg).as_dict() == mc.as_dict()


def test_add_output_errors():
    mc = ModelConfig(triton_json(output=[{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]))
    assert _error(mc.add_output, {"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "optional": True}) == (
        "output 'Y' in auto-complete-config function for model 'm' contains property "
        "other than 'name', 'data_type' and 'dims'."
    )
    assert _error(mc.add_output, {"dims": [1], "data_type": "TYPE_FP32"}) == (
        "output in auto-complete-config function for model 'm' is missing 'name' property."
    )
    assert _error(mc.add_output, {"name": "Y", "dims": [1]}) == (
        "output 'Y' in auto-complete-config function for model 'm' is missing 'data_type' property."
    )
    assert _error(mc.add_output, {"name": "Y", "data_type": "TYPE_FP32"}) == (
        "output 'Y' in auto-complete-config function for model 'm' is missing 'dims' property."
    )
    assert _error(mc.add_output, {"name": "OUT", "data_type": "TYPE_BOOL", "dims": [4]}) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for output 'OUT', model provides TYPE_BOOL"
    )
    assert _error(mc.add_output, {"name": "OUT", "data_type": "TYPE_FP32", "dims": [2, 2]}) == (
        "model 'm', tensor 'OUT': the model expects dims [2, 2] but the model configuration specifies dims [4]"
    )
    assert mc.as_dict()["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]


def test_set_model_transaction_policy():
    mc = ModelConfig(triton_json())
    mc.set_model_transaction_policy({})
    assert mc.as_dict()["model_transaction_policy"] == {}
    mc.set_model_transaction_policy({"decoupled": True})
    assert mc.as_dict()["model_transaction_policy"] == {"decoupled": True}
    assert using_decoupled_model_transaction_policy(mc.as_dict())
    mc.set_model_transaction_policy({"decoupled": True})
    assert _error(mc.set_model_transaction_policy, {"decoupled": False}) == (
        "trying to change decoupled property in auto-complete-config for model 'm', which is already set to 'True'."
    )
    assert _error(mc.set_model_transaction_policy, {"decoupled": True, "x": 1}) == (
        "model transaction property in auto-complete-config function for model 'm' "
        "contains property other than 'decoupled'."
    )
    assert mc.as_dict()["model_transaction_policy"] == {"decoupled": True}


def test_final_config_serializes_back_to_json():
    mc = ModelConfig(triton_json())
    mc.set_max_batch_size(2)
    mc.add_input({"name": "IN", "data_type": "TYPE_STRING", "dims": [1]})
    mc.set_dynamic_batching()
    back = json.loads(json.dumps(mc._model_config))
    assert back["max_batch_size"] == 2
    assert back["input"][0]["data_type"] == "TYPE_STRING"
    assert back["dynamic_batching"] == {}


def test_set_flags_sets_a_requests_flags_as_in_triton():
    # Triton's InferenceRequest has set_flags (a model reaching for it got an AttributeError).
    request = tensor.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    assert request.flags() == 0
    request.set_flags(3)
    assert request.flags() == 3
    for bad in (-1, 2**32, "1", 1.0):
        with pytest.raises(TypeError):
            request.set_flags(bad)
    assert request.flags() == 3


def test_the_module_models_import_carries_tritons_own_imports():
    # Triton's triton_python_backend_utils imports json, numpy (as np) and struct at its top, so
    # `pb_utils.np` works in model code written against it.
    import triton_python_backend_utils as pb_utils

    assert (pb_utils.np, pb_utils.json, pb_utils.struct) == (np, json, struct)
    assert pb_utils.InferenceRequest is tensor.InferenceRequest
