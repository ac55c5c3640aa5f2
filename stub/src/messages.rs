//! What the native module hands Python: input blocks over shared memory, one immutable class per
//! kind of server message, and request parameters and errors in both directions.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tritium_ipc::{Param, StubChannel, StubError, View};

/// Input tensor bytes in a server-owned segment. Its memory stays mapped while this object lives;
/// when it is garbage collected the server is told it may reuse the bytes.
#[pyclass(frozen, module = "tritium._native")]
pub(crate) struct InBlock {
    pub(crate) view: View,
    pub(crate) writable: bool,
    pub(crate) channel: Arc<StubChannel>,
}

#[pymethods]
impl InBlock {
    /// Address of the first byte.
    #[getter]
    pub(crate) fn address(&self) -> usize {
        self.view.as_ptr() as usize
    }

    /// Length in bytes.
    #[getter]
    pub(crate) fn nbytes(&self) -> usize {
        self.view.len()
    }

    /// Whether the model may write to the bytes.
    #[getter]
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// A copy of the bytes.
    pub(crate) fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.view.to_vec())
    }
}

impl Drop for InBlock {
    fn drop(&mut self) {
        // A client region's block is not sent back (`release` leaves it alone).
        self.channel.release(self.view.desc);
    }
}

/// `auto_complete_config`: run the model class's static method on a config, then exit.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct AutoCompleteMsg {
    /// Path of the model file.
    pub(crate) model_file: String,
    /// The config so far, as Triton's JSON model config.
    pub(crate) config_json: String,
}

/// `initialize`: import the model and call `initialize(args)`.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct InitializeMsg {
    /// Path of the model file.
    pub(crate) model_file: String,
    /// The `args` dict for `initialize`, with Triton's keys, in the server's order.
    pub(crate) args: Py<PyDict>,
}

/// `execute`: one batch of requests.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct ExecuteMsg {
    /// Batch id, echoed by `send_execute_done`.
    pub(crate) batch: u64,
    /// The [`RequestMsg`]s. The stub empties this list once it has built its own request
    /// objects, so that input blocks live exactly as long as model code holds their tensors.
    pub(crate) requests: Py<PyList>,
    /// Why an input of the batch could not be given to the model (client CUDA memory this stub
    /// cannot open), or None: the stub fails the whole batch with it instead of running it.
    pub(crate) input_error: Option<String>,
}

/// One request of an [`ExecuteMsg`].
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct RequestMsg {
    /// Server-assigned id, unique per stub: responses and cancellations refer to it.
    pub(crate) id: u64,
    /// The client's request id ("" when none was given).
    pub(crate) request_id: String,
    /// The sequence correlation id: an int (0 for none) or a str.
    pub(crate) correlation_id: Py<PyAny>,
    /// Triton request flags (sequence start/end).
    pub(crate) flags: u32,
    /// Timeout in microseconds, 0 for none.
    pub(crate) timeout_us: u64,
    /// Request parameters: a dict of str to bool, int, float or str, in the client's order.
    pub(crate) parameters: Py<PyDict>,
    /// The [`InputMsg`]s.
    pub(crate) inputs: Py<PyList>,
    /// Names of the outputs the client asked for (all outputs when empty).
    pub(crate) requested_outputs: Py<PyList>,
    /// Triton's trace context text when the request is traced, else "".
    pub(crate) trace: String,
}

/// One input tensor of a [`RequestMsg`].
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct InputMsg {
    /// Tensor name.
    pub(crate) name: String,
    /// KServe v2 dtype name (`"FP32"`, `"BYTES"`, ...).
    pub(crate) dtype: &'static str,
    /// Shape, as a tuple of ints.
    pub(crate) shape: Py<PyTuple>,
    /// A numpy array over the shared bytes: of the dtype and shape, except raw `uint8` for `BYTES`
    /// (serialized, one dimension) and raw `uint16` for `BF16`. Read-only unless the bytes belong
    /// to this request alone.
    pub(crate) array: Py<PyAny>,
}

/// `cancel`: the client gave up on a request.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct CancelMsg {
    /// The [`RequestMsg`] id.
    pub(crate) request: u64,
}

/// `ping`: answer with `send_pong(seq)`.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct PingMsg {
    /// Echoed.
    pub(crate) seq: u64,
}

/// `finalize`: call `finalize()`, report, and exit.
#[pyclass(frozen, module = "tritium._native")]
pub(crate) struct FinalizeMsg;

/// One response to a BLS call.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct BlsResponseMsg {
    /// The BLS call id.
    pub(crate) call: u64,
    /// The output tensors, as [`InputMsg`]s over the server's shared memory.
    pub(crate) outputs: Py<PyList>,
    /// `(message, code)` when the response is an error.
    pub(crate) error: Option<(String, u32)>,
    /// Response parameters: a dict of str to bool, int, float or str.
    pub(crate) parameters: Py<PyDict>,
    /// The call's last response.
    pub(crate) final_response: bool,
}

pub(crate) type PyStubError = (String, u32, Option<String>);

pub(crate) fn stub_error(e: Option<PyStubError>) -> Option<StubError> {
    e.map(|(message, code, traceback)| StubError { message, code, traceback })
}

pub(crate) fn params_to_py(py: Python<'_>, params: Vec<(String, Param)>) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    for (k, v) in params {
        let v = match v {
            Param::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
            Param::Int(i) => i.into_pyobject(py)?.into_any(),
            Param::Double(d) => d.into_pyobject(py)?.into_any(),
            Param::Str(s) => s.into_pyobject(py)?.into_any(),
        };
        dict.set_item(k, v)?;
    }
    Ok(dict)
}

pub(crate) fn params_from_py(items: Vec<(String, Bound<'_, PyAny>)>) -> PyResult<Vec<(String, Param)>> {
    items
        .into_iter()
        .map(|(k, v)| {
            // bool first: Python's bool is an int subclass.
            let p = if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
                Param::Bool(b.is_true())
            } else if let Ok(i) = v.extract::<i64>() {
                Param::Int(i)
            } else if let Ok(d) = v.extract::<f64>() {
                Param::Double(d)
            } else if let Ok(s) = v.extract::<String>() {
                Param::Str(s)
            } else {
                return Err(PyValueError::new_err(format!(
                    "Expect parameters values to have type bool/int/str, found type {}",
                    v.get_type().str()?
                )));
            };
            Ok((k, p))
        })
        .collect()
}
