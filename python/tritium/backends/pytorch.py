"""The built-in PyTorch backend: `platform: "pytorch_libtorch"` / `backend: "pytorch"` models, a
TorchScript `model.pt` run by `torch.jit.load`, or (tritium's extension, since TorchScript is
deprecated in current torch) a `model.pt2` saved by `torch.export.save` and run by
`torch.export.load(...).module()`.

As Triton's PyTorch backend:
- Inputs are passed to `forward()` by position: config names `<name>__<i>` (`INPUT__0`) give the
  position i; otherwise the names are `forward()`'s argument names.
- Outputs are what `forward()` returns (a tensor, or a tuple or list of them): config names
  `<name>__<i>` (`OUTPUT__0`) take the i-th, otherwise the config's outputs take them in order.
- `parameters`: `INFERENCE_MODE` (default true: torch.inference_mode, else torch.no_grad),
  `DISABLE_OPTIMIZED_EXECUTION`, `ENABLE_JIT_EXECUTOR`, `ENABLE_JIT_PROFILING`,
  `INTRA_OP_THREAD_COUNT`, `INTER_OP_THREAD_COUNT`; `DISABLE_CUDNN`, `ENABLE_NVFUSER`,
  `ENABLE_TENSOR_FUSER`, `ENABLE_WEIGHT_SHARING`, `ENABLE_CACHE_CLEANING` are accepted and logged
  (they concern GPUs or are not needed in a stub of its own).
- The config is not completed from the model: TorchScript records no shapes or data types.
"""

import re
import warnings

import numpy as np

from ..errors import LogLevel
from . import BackendError, FrameworkModel, default_threads, log, parameter_bool, parameter_int, require

_INDEXED = re.compile(r"^.+__(\d+)$")
# Parameters that are read here or that only matter on a GPU or to Triton's process layout.
_READ = {
    "INFERENCE_MODE",
    "DISABLE_OPTIMIZED_EXECUTION",
    "ENABLE_JIT_EXECUTOR",
    "ENABLE_JIT_PROFILING",
    "INTRA_OP_THREAD_COUNT",
    "INTER_OP_THREAD_COUNT",
}
_LOGGED_ONLY = {
    "DISABLE_CUDNN": "cuDNN is a GPU library",
    "ENABLE_NVFUSER": "NVFuser is a GPU fuser",
    "ENABLE_TENSOR_FUSER": "the tensor fuser is left as torch sets it",
    "ENABLE_WEIGHT_SHARING": "each instance is its own process, so weights are not shared between instances",
    "ENABLE_CACHE_CLEANING": "it empties the CUDA caching allocator, which a CPU instance does not use",
}


def _indices(names):
    """The positions `<name>__<i>` gives each name, or None unless every name has one."""
    found = [m for m in (_INDEXED.match(n) for n in names) if m is not None]
    if names and len(found) == len(names):
        return [int(m.group(1)) for m in found]
    return None


class TritonPythonModel(FrameworkModel):
    """A TorchScript or torch.export model."""

    backend = "pytorch"

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        require("torch", config.get("name", ""))
        if not config.get("input") or not config.get("output"):
            raise BackendError(
                f"model '{config.get('name', '')}' is a PyTorch model, whose file records no tensor shapes or data "
                "types: its config.pbtxt must list every input and output (names INPUT__<i> / OUTPUT__<i>, or "
                "forward()'s argument names)"
            )
        return auto_complete_model_config

    def _load(self, path):
        torch = require("torch", self.model_name)
        self.torch = torch
        config = self.config
        self._settings(torch, config)
        self.device = torch.device(f"cuda:{self.device_id}" if self.kind == "GPU" else "cpu")
        if self.kind == "GPU" and not torch.cuda.is_available():
            raise BackendError(
                f"instance '{self.instance_name}' of model '{self.model_name}' is KIND_GPU, but torch sees no CUDA "
                "device here; use KIND_CPU"
            )
        with warnings.catch_warnings():
            # torch.jit.load says TorchScript is deprecated; serving a TorchScript model is the point.
            warnings.simplefilter("ignore", FutureWarning)
            if path.endswith(".pt2"):
                program = torch.export.load(path)
                self.module = program.module().to(self.device)
                arg_names = list(program.graph_signature.user_inputs)
            else:
                self.module = torch.jit.load(path, map_location=self.device)
                self.module.eval()
                arg_names = [a.name for a in self.module.forward.schema.arguments[1:]]
        input_names = list(self.inputs)
        indices = _indices(input_names)
        if indices is not None:
            order = sorted(range(len(input_names)), key=lambda i: indices[i])
            self.arg_order = [input_names[i] for i in order]
        else:
            unknown = [n for n in input_names if n not in arg_names]
            if unknown:
                raise BackendError(
                    f"unable to load model '{self.model_name}': input '{unknown[0]}' is neither named "
                    f"<name>__<index> (INPUT__0) nor an argument of forward(), whose arguments are {arg_names}"
                )
            self.arg_order = [n for n in arg_names if n in self.inputs]
        output_indices = _indices(self.outputs)
        self.output_positions = output_indices if output_indices is not None else list(range(len(self.outputs)))
        self.inference_mode = parameter_bool(config, "INFERENCE_MODE", True)

    def _settings(self, torch, config):
        """Applies the documented parameters that mean something here; logs the rest."""
        intra = parameter_int(config, "INTRA_OP_THREAD_COUNT")
        choice = "from the config's parameters"
        if intra is None or intra <= 0:
            intra, why = default_threads(config)
            choice = f"chosen by tritium: {why}; set parameters INTRA_OP_THREAD_COUNT to change it"
        torch.set_num_threads(intra)
        inter = parameter_int(config, "INTER_OP_THREAD_COUNT")
        inter = inter if inter is not None and inter > 0 else 1
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError:
            # It can be set once per process, before any inter-op work; a stub serves one instance.
            pass
        # TorchScript executor switches (private torch functions, as Triton's C++ calls them).
        switches = (
            ("DISABLE_OPTIMIZED_EXECUTION", "_set_graph_executor_optimize", True),
            ("ENABLE_JIT_PROFILING", "_jit_set_profiling_executor", False),
            ("ENABLE_JIT_EXECUTOR", "_jit_set_profiling_mode", False),
        )
        for key, function, inverted in switches:
            value = parameter_bool(config, key, None)
            if value is None:
                continue
            setter = getattr(torch._C, function, None)  # noqa: SLF001 - torch keeps these switches only there
            if setter is None:
                log(LogLevel.WARNING, f"model '{self.model_name}': parameter {key} has no effect with this torch")
            else:
                setter(not value if inverted else value)
        log(
            LogLevel.INFO,
            f"torch {torch.__version__}: instance '{self.instance_name}' of model '{self.model_name}' uses "
            f"intra-op threads {intra} ({choice}), inter-op threads {inter}",
        )
        for key in config.get("parameters", {}):
            if key in _LOGGED_ONLY:
                log(LogLevel.INFO, f"model '{self.model_name}': parameter {key} is accepted; {_LOGGED_ONLY[key]}")
            elif key not in _READ and key != "EXECUTION_ENV_PATH":
                log(
                    LogLevel.WARNING,
                    f"model '{self.model_name}': parameter {key} is not read by tritium's pytorch backend",
                )

    def _run(self, feed):
        torch = self.torch
        missing = [n for n in self.arg_order if n not in feed]
        if missing:
            raise BackendError(f"model '{self.model_name}': the request has no input '{missing[0]}'")
        with warnings.catch_warnings():
            # Inputs over the server's shared memory are read-only; the model only reads them.
            warnings.simplefilter("ignore", UserWarning)
            args = [torch.from_numpy(np.asarray(feed[n])).to(self.device) for n in self.arg_order]
        context = torch.inference_mode() if self.inference_mode else torch.no_grad()
        with context:
            result = self.module(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if not isinstance(result, (tuple, list)):
            raise BackendError(
                f"model '{self.model_name}': forward() returned {type(result).__name__}; a tensor, or a tuple or list "
                "of tensors, is expected"
            )
        outputs = {}
        for name, position in zip(self.outputs, self.output_positions):
            if position >= len(result):
                raise BackendError(
                    f"model '{self.model_name}': output '{name}' is output {position} of forward(), which returned "
                    f"{len(result)}"
                )
            outputs[name] = result[position].detach().cpu().numpy()
        return outputs

    def finalize(self):
        super().finalize()
        self.module = None
