"""pb_utils takes its arguments the way Triton's pybind11 bindings do: bytes for str, numpy
integers for int, any sequence for a list; other types raise TypeError naming the argument."""

import numpy as np
import pytest
from tritium import args, bls, pb_utils
from tritium.errors import TritonModelException

# ---------------------------------------------------------------- the casters


@pytest.mark.parametrize(
    "value", ["add_sub", b"add_sub", bytearray(b"add_sub"), np.str_("add_sub"), np.bytes_(b"add_sub")]
)
def test_as_str_takes_str_and_utf8_bytes(value):
    assert args.as_str(value, "x") == "add_sub"
    assert type(args.as_str(value, "x")) is str


@pytest.mark.parametrize("value", [1, 1.0, None, ["a"]])
def test_as_str_refuses_other_types(value):
    with pytest.raises(TypeError, match=r"^m must be a str \(or UTF-8 bytes\), found type"):
        args.as_str(value, "m")


def test_as_str_refuses_bytes_that_are_not_utf8():
    with pytest.raises(TypeError, match="not valid UTF-8"):
        args.as_str(b"\xff\xfe", "m")


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint32(3), np.int8(3), True])
def test_as_int_takes_ints_and_numpy_integers(value):
    assert args.as_int(value, "x") == int(value)
    assert type(args.as_int(value, "x")) is int


@pytest.mark.parametrize("value", [3.0, np.float32(3), "3", b"3", None])
def test_as_int_refuses_floats_and_strings(value):
    with pytest.raises(TypeError, match="^n must be an int"):
        args.as_int(value, "n")


def test_as_int_checks_its_range():
    with pytest.raises(TypeError, match=r"must be an int in \[0, 4294967295\], found -1"):
        args.as_int(-1, "flags", 0, (1 << 32) - 1)


@pytest.mark.parametrize(
    "value",
    [["A", "B"], ("A", "B"), {"A", "B"}, np.array(["A", "B"]), np.array([b"A", b"B"], dtype=object), [b"A", "B"]],
)
def test_as_str_list_takes_any_sequence_of_strings(value):
    assert sorted(args.as_str_list(value, "names")) == ["A", "B"]


@pytest.mark.parametrize("value", ["AB", b"AB", {"A": 1}, 5])
def test_as_str_list_refuses_a_string_or_a_non_sequence(value):
    with pytest.raises(TypeError, match="^names must be a list"):
        args.as_str_list(value, "names")


def test_as_str_list_names_the_bad_element():
    with pytest.raises(TypeError, match="found type 'int' at index 1"):
        args.as_str_list(["A", 2], "names")


# ---------------------------------------------------------------- pb_utils entry points


def test_inference_request_takes_what_pybind11_takes():
    t = pb_utils.Tensor(b"INPUT0", np.zeros(2, np.float32))
    req = pb_utils.InferenceRequest(
        model_name=b"add_sub",
        inputs=(t,),
        requested_output_names=np.array([b"OUTPUT0", b"OUTPUT1"], dtype=object),
        request_id=b"r1",
        correlation_id=np.uint64(7),
        flags=np.int32(1),
        timeout=np.int64(1000),
        model_version=np.int64(2),
    )
    assert req.model_name() == "add_sub" and type(req.model_name()) is str
    assert req.inputs()[0].name() == "INPUT0"
    assert req.requested_output_names() == {"OUTPUT0", "OUTPUT1"}
    assert req.request_id() == "r1"
    assert req.correlation_id() == 7 and type(req.correlation_id()) is int
    assert req.flags() == 1 and req.timeout() == 1000 and req._model_version == 2
    req.set_flags(np.uint32(2))
    assert req.flags() == 2
    assert (
        pb_utils.InferenceRequest(
            model_name="m", inputs=[], requested_output_names=[], correlation_id=b"seq"
        ).correlation_id()
        == "seq"
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"model_name": 5}, "InferenceRequest model_name must be a str"),
        ({"requested_output_names": "OUTPUT0"}, "InferenceRequest requested_output_names must be a list"),
        ({"inputs": [np.zeros(2)]}, "InferenceRequest inputs must be pb_utils.Tensor objects"),
        ({"flags": 1.0}, "InferenceRequest flags must be an int"),
        ({"timeout": -1}, r"InferenceRequest timeout must be an int in \[0"),
        ({"correlation_id": 1.5}, "Correlation ID must be integer or string"),
        ({"model_version": "1"}, "InferenceRequest model_version must be an int"),
    ],
)
def test_inference_request_refuses_wrong_types_with_type_error(kwargs, match):
    full = {"model_name": "m", "inputs": [], "requested_output_names": []}
    full.update(kwargs)
    with pytest.raises(TypeError, match=match):
        pb_utils.InferenceRequest(**full)


def test_tensor_and_response_and_error_take_bytes_and_sequences():
    t = pb_utils.Tensor(b"OUT", np.ones(3, np.int32))
    assert t.name() == "OUT"
    resp = pb_utils.InferenceResponse(output_tensors=(t,))
    assert resp.output_tensors() == [t]
    err = pb_utils.TritonError(b"bad input", np.int64(3))
    assert err.message() == "bad input" and err.code() == pb_utils.TritonError.INVALID_ARG
    with pytest.raises(TypeError, match="Tensor name must be a str"):
        pb_utils.Tensor(1, np.ones(3))
    with pytest.raises(TypeError, match="InferenceResponse output_tensors must be a list"):
        pb_utils.InferenceResponse(output_tensors=b"x")


def test_logger_takes_bytes_messages_and_only_log_levels(monkeypatch):
    seen = []
    monkeypatch.setattr("tritium._runtime.log", lambda level, file, line, message: seen.append((level, message)))
    pb_utils.Logger.log(b"hello", pb_utils.Logger.ERROR)
    pb_utils.Logger.log_info(b"caf\xc3\xa9")
    pb_utils.Logger.log("default")
    assert seen == [(pb_utils.Logger.ERROR, "hello"), (pb_utils.Logger.INFO, "café"), (pb_utils.Logger.INFO, "default")]
    # Triton's level is a pybind11 enum: a number (or a string, or None) is a TypeError, as
    # Triton's argument_validation test checks.
    for level in ("INFO", 1, np.int32(2), None):
        with pytest.raises(TypeError, match="Logger.log level must be pb_utils.Logger.INFO"):
            pb_utils.Logger.log("x", level)


def test_model_control_takes_bytes_names(monkeypatch):
    calls = []

    class Channel:
        def model_ready(self, name, version):
            calls.append(("ready", name, version))
            return True

        def model_load(self, name, config, files):
            calls.append(("load", name, config, files))

        def model_unload(self, name, dependents):
            calls.append(("unload", name, dependents))

    monkeypatch.setattr("tritium._runtime.channel", Channel())
    assert bls.is_model_ready(b"add_sub", b"1")
    bls.load_model(b"add_sub", config=b"{}", files={b"file:1/model.py": b"x"})
    bls.unload_model(b"add_sub", unload_dependents=np.bool_(True))
    assert calls == [
        ("ready", "add_sub", "1"),
        ("load", "add_sub", "{}", [("file:1/model.py", b"x")]),
        ("unload", "add_sub", True),
    ]
    with pytest.raises(TypeError, match="is_model_ready model_name must be a str"):
        bls.is_model_ready(1)
    with pytest.raises(TritonModelException, match="files should be a dictionary"):
        bls.load_model("m", files=[("a", b"b")])


def test_preferred_memory_takes_numpy_ints():
    pm = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, np.int64(0))
    assert pm.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU and pm.preferred_device_id == 0
    with pytest.raises(TypeError, match="preferred_memory_type must be"):
        pb_utils.PreferredMemory(7)


def test_none_arguments_are_refused_as_triton_s_argument_validation_test_expects():
    """qa/L0_backend_python/argument_validation: which None arguments raise TypeError (pybind11
    refuses the conversion) and which TritonModelException (Triton's C++ side refuses them)."""
    a = np.asarray([1, 2], dtype=np.int32)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(inputs=[None], model_name="m", requested_output_names=["o"])
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(inputs=None, model_name="m", requested_output_names=["o"])
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(inputs=[], model_name="m", requested_output_names=None)
    assert pb_utils.InferenceRequest(model_name="m").inputs() == []
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    assert pb_utils.InferenceResponse().output_tensors() == []
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.Tensor("OUTPUT0", None)
    with pytest.raises(TypeError):
        pb_utils.Tensor("", None)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("", a)
    for log in (pb_utils.Logger.log_info, pb_utils.Logger.log_warn, pb_utils.Logger.log_error):
        with pytest.raises(TypeError):
            log(None)
    with pytest.raises(TypeError):
        pb_utils.Logger.log("Invalid Level", None)
