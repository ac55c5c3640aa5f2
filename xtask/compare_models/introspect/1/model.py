"""What model code sees, as JSON in REPORT (one per request); ECHO_S returns S unchanged."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def plain(value):
    """A JSON-able form of what numpy and pb_utils hand out."""
    if isinstance(value, np.ndarray):
        return {"dtype": str(value.dtype), "shape": list(value.shape), "values": plain(value.tolist())}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return "bytes:" + value.decode("utf-8", "replace")
    if isinstance(value, (np.generic,)):
        return plain(value.item())
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__name__}>"


def attempt(call):
    try:
        return plain(call())
    except Exception as e:  # noqa: BLE001 - the report says what raised
        return f"raised {type(e).__name__}: {e}"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.init = {
            "arg_keys": sorted(args),
            "args": {k: v for k, v in args.items() if k not in ("model_config", "model_repository")},
            "config": config,
            "output_config": attempt(lambda: pb_utils.get_output_config_by_name(config, "REPORT")),
            "input_config": attempt(lambda: pb_utils.get_input_config_by_name(config, "OPT")),
            "missing_config": attempt(lambda: pb_utils.get_output_config_by_name(config, "NOPE")),
            "string_to_numpy": attempt(lambda: str(pb_utils.triton_string_to_numpy("TYPE_FP16"))),
            "string_to_numpy_string": attempt(lambda: str(pb_utils.triton_string_to_numpy("TYPE_STRING"))),
            "decoupled": attempt(lambda: pb_utils.using_decoupled_model_transaction_policy(config)),
            "constants": {
                name: attempt(lambda name=name: getattr(pb_utils, name))
                for name in (
                    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
                    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
                    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
                    "TRITONSERVER_REQUEST_RELEASE_ALL",
                    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
                )
            },
            "error_codes": attempt(
                lambda: {
                    c: int(getattr(pb_utils.TritonError, c))
                    for c in (
                        "UNKNOWN",
                        "INTERNAL",
                        "NOT_FOUND",
                        "INVALID_ARG",
                        "UNAVAILABLE",
                        "UNSUPPORTED",
                        "ALREADY_EXISTS",
                        "CANCELLED",
                    )
                }
            ),
        }
        # The public API model code can reach, name by name (a name only one server has shows
        # up as a difference).
        self.init["api"] = {
            owner: {name: True for name in dir(obj) if not name.startswith("_")}
            for owner, obj in (
                ("pb_utils", pb_utils),
                ("Tensor", pb_utils.Tensor),
                ("InferenceRequest", pb_utils.InferenceRequest),
                ("InferenceResponse", pb_utils.InferenceResponse),
                ("TritonError", pb_utils.TritonError),
                ("Logger", pb_utils.Logger),
                ("MetricFamily", pb_utils.MetricFamily),
                ("ModelConfig", getattr(pb_utils, "ModelConfig", object)),
            )
        }
        self.reported = False

    def execute(self, requests):
        responses = []
        for request in requests:
            report = {
                "batch": len(requests),
                "request_id": attempt(request.request_id),
                "correlation_id": attempt(request.correlation_id),
                "flags": attempt(request.flags),
                "parameters": attempt(lambda request=request: json.loads(request.parameters())),
                "requested": attempt(lambda request=request: sorted(request.requested_output_names())),
                "timeout": attempt(request.timeout),
                "cancelled": attempt(request.is_cancelled),
                "inputs": {
                    # Not `triton_dtype()`: Triton 2.51's raises TypeError (its enum is not bound).
                    t.name(): {"numpy": plain(t.as_numpy()), "shape": attempt(t.shape), "is_cpu": attempt(t.is_cpu)}
                    for t in request.inputs()
                },
                "missing_input": attempt(lambda request=request: pb_utils.get_input_tensor_by_name(request, "OPT")),
            }
            if not self.reported:
                family = pb_utils.MetricFamily("introspect_probe", "a probe", pb_utils.MetricFamily.COUNTER)
                report["api"] = {
                    owner: {name: True for name in dir(obj) if not name.startswith("_")}
                    for owner, obj in (
                        ("request", request),
                        ("response sender", request.get_response_sender()),
                        ("input tensor", request.inputs()[0]),
                        ("metric family", family),
                        ("metric", family.Metric(labels={"a": "b"})),
                    )
                }
                report["init"] = self.init
                self.reported = True
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("REPORT", np.array([[json.dumps(report, sort_keys=True)]], dtype=np.object_)),
                        pb_utils.Tensor("ECHO_S", s),
                    ]
                )
            )
        return responses
