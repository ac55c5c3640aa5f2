"""The built-in ONNX Runtime backend: `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"` models,
run by an `onnxruntime.InferenceSession` in the stub.

As Triton's ONNX Runtime backend:
- `auto_complete_config` fills in the inputs, outputs, data types and dims the model declares; a
  model whose every input and output has a variable first dimension gets `max_batch_size` 4 (or
  `--backend-config=onnxruntime,default-max-batch-size=N`) when the config sets none, and then the
  dynamic batcher with its defaults.
- A config that contradicts the model (a tensor's name, data type or rank) fails the load, naming
  the tensor.
- `parameters`: `intra_op_thread_count`, `inter_op_thread_count`, `execution_mode` (0 sequential,
  1 parallel), `enable_mem_arena`, `enable_mem_pattern`, `memory.enable_memory_arena_shrinkage`,
  and any `session.*` key as a session config entry; `optimization { graph { level } }` (-1 basic,
  1 extended, 2 disabled, otherwise all). Without thread settings, the intra-op threads are the
  usable CPUs shared out among the model's instances, and the choice is logged.
- `KIND_GPU` instances use the CUDA execution provider (with the config's `cuda` accelerator
  parameters); that path has not been run on a GPU.
"""

import os

import numpy as np

from ..config import ModelConfig
from ..errors import LogLevel
from . import (
    BackendError,
    FrameworkModel,
    backend_setting,
    config_dims,
    default_threads,
    log,
    model_file,
    parameter,
    parameter_bool,
    parameter_int,
    require,
)

DEFAULT_MAX_BATCH_SIZE = 4

# ONNX element types (as onnxruntime names them) and Triton's config data types.
_ORT_TO_CONFIG = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
    "tensor(bfloat16)": "TYPE_BF16",
}

# Parameters this backend reads; others are logged as ignored.
_KNOWN_PARAMETERS = {
    "intra_op_thread_count",
    "inter_op_thread_count",
    "execution_mode",
    "enable_mem_arena",
    "enable_mem_pattern",
    "memory.enable_memory_arena_shrinkage",
    # Deprecated CUDA execution provider options (Triton still reads them as parameters).
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
    # Settings of the Python backend and of tritium's supervision, read by the server.
    "EXECUTION_ENV_PATH",
}
_CUDA_PARAMETERS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")


def _dims(shape):
    """An ONNX shape as config dims: a symbolic or unknown dimension is -1."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in (shape or [])]


def _model_io(session):
    """(inputs, outputs): lists of (name, config data type, dims) the model declares."""

    def describe(args):
        return [(a.name, _ORT_TO_CONFIG.get(a.type, a.type), _dims(a.shape)) for a in args]

    return describe(session.get_inputs()), describe(session.get_outputs())


def onnx_path(path):
    """The .onnx file of a model file that may be a directory holding `model.onnx` and the files
    of its external data (Triton's layout for models over 2 GB)."""
    if os.path.isdir(path):
        inner = os.path.join(path, "model.onnx")
        if not os.path.isfile(inner):
            raise BackendError(f"the ONNX model directory {path} holds no model.onnx")
        return inner
    return path


def _inspection_session(ort, path):
    """A session that is only asked for the model's inputs and outputs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def _default_max_batch_size(model):
    raw = backend_setting("onnxruntime", "default-max-batch-size")
    if raw is None:
        return DEFAULT_MAX_BATCH_SIZE
    try:
        value = int(raw)
    except ValueError:
        raise BackendError(
            f"--backend-config=onnxruntime,default-max-batch-size={raw} is not an integer (model '{model}')"
        ) from None
    return max(value, 0)


def _shape_text(dims):
    return "[" + ",".join(str(d) for d in dims) + "]"


def check_config(config, inputs, outputs):
    """Raises a BackendError naming the tensor when `config` (a dict) contradicts the model's
    declared `inputs` and `outputs` (from `_model_io`)."""
    model = config.get("name", "")
    batching = int(config.get("max_batch_size", 0)) > 0
    for kind, declared, configured in (
        ("input", inputs, config.get("input", [])),
        ("output", outputs, config.get("output", [])),
    ):
        by_name = {name: (dtype, dims) for name, dtype, dims in declared}
        for tensor in configured:
            name = tensor["name"]
            if name not in by_name:
                allowed = ", ".join(f"'{n}'" for n, _, _ in declared)
                raise BackendError(
                    f"unable to load model '{model}': the configuration names {kind} '{name}', which the ONNX "
                    f"model does not have; its {kind}s are {allowed}"
                )
            dtype, model_dims = by_name[name]
            if tensor.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", dtype):
                raise BackendError(
                    f"unable to load model '{model}': unexpected datatype {tensor['data_type']} for {kind} "
                    f"'{name}', the ONNX model has {dtype}"
                )
            reshape = tensor.get("reshape")
            dims = [int(d) for d in reshape.get("shape", [])] if reshape else config_dims(tensor)
            full = ([-1] if batching else []) + dims
            if len(full) != len(model_dims):
                batch = "an initial batch dimension because max_batch_size > 0 followed by " if batching else ""
                raise BackendError(
                    f"unable to load model '{model}', {kind} '{name}': the ONNX model has {len(model_dims)} "
                    f"dimensions (shape {_shape_text(model_dims)}) but the model configuration specifies "
                    f"{len(full)} dimensions ({batch}dims {_shape_text(dims)}, making complete shape "
                    f"{_shape_text(full)})"
                )
            if batching and model_dims[0] != -1:
                raise BackendError(
                    f"unable to load model '{model}', {kind} '{name}': max_batch_size is {config['max_batch_size']} "
                    f"but the ONNX model's first dimension is fixed ({_shape_text(model_dims)}); set max_batch_size "
                    "to 0 and give the full shape in dims"
                )
            for config_dim, model_dim in zip(
                full[1:] if batching else full, model_dims[1:] if batching else model_dims
            ):
                if config_dim != -1 and model_dim != -1 and config_dim != model_dim:
                    raise BackendError(
                        f"unable to load model '{model}', {kind} '{name}': the model configuration's dims "
                        f"{_shape_text(dims)} do not match the ONNX model's shape {_shape_text(model_dims)}"
                    )
        if kind == "input":
            named = {t["name"] for t in configured}
            missing = [n for n, _, _ in declared if n not in named]
            if configured and missing:
                raise BackendError(
                    f"unable to load model '{model}': the ONNX model's input '{missing[0]}' is not in the "
                    "configuration; add it (or remove the inputs so that auto-complete lists them)"
                )


class TritonPythonModel(FrameworkModel):
    """An ONNX model served by an onnxruntime.InferenceSession."""

    backend = "onnxruntime"

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        model = config.get("name", "")
        ort = require("onnxruntime", model)
        inputs, outputs = _model_io(_inspection_session(ort, onnx_path(model_file())))
        configured_batch = int(config.get("max_batch_size", 0))
        # The model batches when every tensor has a variable first dimension, unless the config
        # already gives a tensor's full shape with max_batch_size 0.
        can_batch = all(dims and dims[0] == -1 for _, _, dims in inputs + outputs)
        for kind, declared in (("input", inputs), ("output", outputs)):
            rank = {name: len(dims) for name, _, dims in declared}
            for tensor in config.get(kind, []):
                if configured_batch == 0 and tensor.get("dims") and len(tensor["dims"]) == rank.get(tensor["name"]):
                    can_batch = False
        max_batch_size = configured_batch
        if can_batch and configured_batch == 0:
            max_batch_size = _default_max_batch_size(model)
            auto_complete_model_config.set_max_batch_size(max_batch_size)
            if max_batch_size > 1 and "sequence_batching" not in config and "dynamic_batching" not in config:
                auto_complete_model_config.set_dynamic_batching()
        skip = 1 if max_batch_size > 0 else 0
        configured = {(kind, t["name"]) for kind in ("input", "output") for t in config.get(kind, [])}
        if not config.get("input"):
            for name, dtype, dims in inputs:
                auto_complete_model_config.add_input({"name": name, "data_type": dtype, "dims": dims[skip:]})
        if not config.get("output"):
            for name, dtype, dims in outputs:
                auto_complete_model_config.add_output({"name": name, "data_type": dtype, "dims": dims[skip:]})
        # Configured tensors without a data type or dims get the model's.
        for kind, declared in (("input", inputs), ("output", outputs)):
            by_name = {name: (dtype, dims) for name, dtype, dims in declared}
            for tensor in config.get(kind, []):
                if (kind, tensor["name"]) in configured and tensor["name"] in by_name:
                    dtype, dims = by_name[tensor["name"]]
                    if tensor.get("data_type", "TYPE_INVALID") == "TYPE_INVALID":
                        tensor["data_type"] = dtype
                    if not tensor.get("dims") and not tensor.get("reshape"):
                        tensor["dims"] = dims[skip:]
        check_config(config, inputs, outputs)
        return ModelConfig(config)

    def _load(self, path):
        path = onnx_path(path)
        ort = require("onnxruntime", self.model_name)
        self.ort = ort
        options = ort.SessionOptions()
        config = self.config
        intra = parameter_int(config, "intra_op_thread_count")
        inter = parameter_int(config, "inter_op_thread_count")
        choice = "from the config's parameters"
        if intra is None:
            intra, why = default_threads(config)
            choice = f"chosen by tritium: {why}; set parameters intra_op_thread_count to change it"
        options.intra_op_num_threads = intra
        options.inter_op_num_threads = inter if inter is not None else 1
        mode = parameter_int(config, "execution_mode") or 0
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
        level = int((config.get("optimization") or {}).get("graph", {}).get("level", 0) or 0)
        options.graph_optimization_level = {
            -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        arena = parameter_bool(config, "enable_mem_arena", None)
        if arena is not None:
            options.enable_cpu_mem_arena = arena
        pattern = parameter_bool(config, "enable_mem_pattern", None)
        if pattern is not None:
            options.enable_mem_pattern = pattern
        ignored = []
        for key in config.get("parameters", {}):
            if key.startswith("session."):
                options.add_session_config_entry(key, parameter(config, key))
            elif key not in _KNOWN_PARAMETERS:
                ignored.append(key)
        self.run_options = None
        shrinkage = parameter(config, "memory.enable_memory_arena_shrinkage")
        if shrinkage:
            self.run_options = ort.RunOptions()
            self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrinkage)
        providers = self._providers(ort, config)
        log(
            LogLevel.INFO,
            f"onnxruntime {ort.__version__}: instance '{self.instance_name}' of model '{self.model_name}' runs "
            f"{path} on {', '.join(p if isinstance(p, str) else p[0] for p in providers)} with intra_op_num_threads="
            f"{intra} ({choice}), inter_op_num_threads={options.inter_op_num_threads}, execution_mode="
            f"{'parallel' if mode == 1 else 'sequential'}, graph optimization {options.graph_optimization_level.name}",
        )
        if ignored:
            log(LogLevel.WARNING, f"model '{self.model_name}': parameters not read by onnxruntime: {sorted(ignored)}")
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        inputs, outputs = _model_io(self.session)
        check_config(config, inputs, outputs)

    def _providers(self, ort, config):
        """The execution providers: CUDA for a KIND_GPU instance (unverified without a GPU)."""
        accelerators = (config.get("optimization") or {}).get("execution_accelerators", {})
        for accelerator in accelerators.get("cpu_execution_accelerator", []) + accelerators.get(
            "gpu_execution_accelerator", []
        ):
            if accelerator.get("name") not in ("cuda",):
                log(
                    LogLevel.WARNING,
                    f"model '{self.model_name}': execution accelerator '{accelerator.get('name')}' is not used by "
                    "tritium's onnxruntime backend (only 'cuda' options are read)",
                )
        if self.kind != "GPU":
            return ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendError(
                f"instance '{self.instance_name}' of model '{self.model_name}' is KIND_GPU, but this onnxruntime "
                f"has no CUDAExecutionProvider (it has {ort.get_available_providers()}); install onnxruntime-gpu "
                "in the model's Python environment, or use KIND_CPU"
            )
        options = {"device_id": str(self.device_id)}
        for key in _CUDA_PARAMETERS:
            if parameter(config, key):
                options[key] = parameter(config, key)
        for accelerator in accelerators.get("gpu_execution_accelerator", []):
            if accelerator.get("name") == "cuda":
                options.update({k: str(v) for k, v in accelerator.get("parameters", {}).items()})
        return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]

    def _bytes_input(self, array):
        # onnxruntime takes string tensors as str.
        return np.vectorize(lambda b: b.decode("utf-8") if isinstance(b, bytes) else str(b), otypes=[object])(array)

    def _run(self, feed):
        names = self.outputs
        results = self.session.run(names, feed, self.run_options)
        return dict(zip(names, results))

    def finalize(self):
        super().finalize()
        self.session = None
