"""BLS calls as model code sees their results; MODE picks: 0 add_sub, 1 an unknown model, 2 a
missing input, 3 a wrong dtype, 4 one requested output, 5 a decoupled model with
decoupled=True, 6 a decoupled model without it, 7 a version that does not exist, 8 a wrong
shape, 9 an input the model does not have, 10 a sequence model without a correlation id, 11 a
sequence start, 12 an output name the model does not have."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(name, value):
    return pb_utils.Tensor(name, value)


def pair(a=None, b=None):
    a = np.arange(4, dtype=np.float32) if a is None else a
    b = np.ones(4, dtype=np.float32) if b is None else b
    return [tensor("INPUT0", a), tensor("INPUT1", b)]


def describe(response):
    error = response.error()
    out = {"has_error": response.has_error()}
    if error is not None:
        out["error"] = {"message": error.message(), "code": int(error.code())}
    out["outputs"] = {
        t.name(): {"dtype": str(t.as_numpy().dtype), "values": t.as_numpy().tolist()}
        for t in response.output_tensors()
        if t.as_numpy().dtype != np.object_
    } | {
        t.name(): [v.decode("utf-8", "replace") for v in t.as_numpy().reshape(-1)]
        for t in response.output_tensors()
        if t.as_numpy().dtype == np.object_
    }
    return out


def call(mode):
    words = tensor("TEXT", np.array([b"one two"], dtype=np.object_))
    seq = tensor("INPUT", np.array([[5]], dtype=np.int32))
    requests = {
        0: dict(model_name="add_sub", inputs=pair()),
        1: dict(model_name="nope", inputs=pair()),
        2: dict(model_name="add_sub", inputs=pair()[:1]),
        3: dict(model_name="add_sub", inputs=pair(a=np.arange(4, dtype=np.int32))),
        4: dict(model_name="add_sub", inputs=pair(), requested_output_names=["OUTPUT1"]),
        5: dict(model_name="stream_words", inputs=[words]),
        6: dict(model_name="stream_words", inputs=[words]),
        7: dict(model_name="add_sub", inputs=pair(), model_version=7),
        8: dict(model_name="add_sub", inputs=pair(a=np.arange(3, dtype=np.float32))),
        9: dict(model_name="add_sub", inputs=pair() + [tensor("EXTRA", np.zeros(1, np.float32))]),
        10: dict(model_name="sequence_accumulate", inputs=[seq]),
        11: dict(
            model_name="sequence_accumulate",
            inputs=[seq],
            correlation_id=77,
            flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
        ),
        12: dict(model_name="add_sub", inputs=pair(), requested_output_names=["NOPE"]),
    }
    # Triton 2.51 requires `requested_output_names` (empty: every output).
    kwargs = {"requested_output_names": [], **requests[mode]}
    try:
        request = pb_utils.InferenceRequest(**kwargs)
        if mode == 5:
            return [describe(r) for r in request.exec(decoupled=True)]
        return describe(request.exec())
    except Exception as e:  # noqa: BLE001 - the report says what raised
        return f"raised {type(e).__name__}: {e}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            report = json.dumps(call(mode), sort_keys=True)
            responses.append(pb_utils.InferenceResponse([tensor("REPORT", np.array([report], dtype=np.object_))]))
        return responses
