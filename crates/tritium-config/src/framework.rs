//! The frameworks tritium serves besides Python models: ONNX Runtime and PyTorch, each run by a
//! built-in backend module of the stub (`python/tritium/backends/`), and what tells them apart
//! in a config (Triton's platform and backend names) and in a version directory (file names).

/// What tritium serves, for error messages that refuse something else.
pub const SERVED: &str = "tritium serves the python backend (model.py), Python-based backends \
     (<backend-directory>/<name>/model.py), ensembles, ONNX Runtime models (platform \
     'onnxruntime_onnx' or backend 'onnxruntime', model.onnx) and PyTorch models (platform \
     'pytorch_libtorch' or backend 'pytorch', a TorchScript model.pt or a torch.export model.pt2)";

/// A framework whose models a built-in backend of the stub runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    /// `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"`.
    OnnxRuntime,
    /// `platform: "pytorch_libtorch"` / `backend: "pytorch"`.
    PyTorch,
}

impl Framework {
    /// Every framework, in the order files are looked for in a version directory.
    pub const ALL: [Framework; 2] = [Framework::OnnxRuntime, Framework::PyTorch];

    /// The framework a Triton platform names.
    pub fn of_platform(platform: &str) -> Option<Framework> {
        Self::ALL.into_iter().find(|f| f.platform() == platform)
    }

    /// The framework a Triton backend name names.
    pub fn of_backend(backend: &str) -> Option<Framework> {
        Self::ALL.into_iter().find(|f| f.backend() == backend)
    }

    /// Triton's backend name, which is also the stub's module `tritium.backends.<name>`.
    pub fn backend(self) -> &'static str {
        match self {
            Framework::OnnxRuntime => "onnxruntime",
            Framework::PyTorch => "pytorch",
        }
    }

    /// Triton's platform name.
    pub fn platform(self) -> &'static str {
        match self {
            Framework::OnnxRuntime => "onnxruntime_onnx",
            Framework::PyTorch => "pytorch_libtorch",
        }
    }

    /// The model file in a version directory when the config names none.
    pub fn default_filename(self) -> &'static str {
        match self {
            Framework::OnnxRuntime => "model.onnx",
            Framework::PyTorch => "model.pt",
        }
    }

    /// Other files that hold such a model when the default one is absent: a PyTorch model
    /// made with `torch.export` (tritium's extension).
    pub fn alternative_filenames(self) -> &'static [&'static str] {
        match self {
            Framework::OnnxRuntime => &[],
            Framework::PyTorch => &["model.pt2"],
        }
    }

    /// Whether the stub runs `auto_complete_config` for such a model even when it has a
    /// `config.pbtxt` (Triton's ONNX Runtime backend always completes; its PyTorch backend
    /// reads nothing from the model).
    pub fn completes_config(self) -> bool {
        matches!(self, Framework::OnnxRuntime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Framework::ALL {
            assert_eq!(Framework::of_platform(f.platform()), Some(f));
            assert_eq!(Framework::of_backend(f.backend()), Some(f));
        }
        assert_eq!(Framework::of_platform("tensorrt_plan"), None);
        assert_eq!(Framework::of_backend("python"), None);
    }
}
