//! Outputs on their way to the server: each copied once, from the model's array (or `bytes`, or a
//! GPU tensor's memory) into the client's output region the request named for it, else into a
//! block of the stub's arena ([`Channel::respond`]); and a built-in backend's batch answered from
//! its joined outputs, each request's row range copied straight from the array
//! ([`Channel::respond_rows`], `Channel.send_rows` in Python).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tritium_ipc::{DataType, Descriptor, Param, Response, StubError, Tensor, TensorData, ToServer};
use tritium_sync::Locked;

use crate::arrays::{output_source, Source};
use crate::router::ClientRegions;
use crate::{dtype, ipc_err, Channel, ChannelError};

impl Channel {
    pub(crate) fn free_tensors(&self, tensors: &[Tensor]) {
        for t in tensors {
            if let TensorData::Shm { desc, .. } = t.data {
                let _ = self.inner.free_own(desc);
            }
        }
    }

    /// Writes an output straight into the client's region `dest` (system shared memory): one
    /// copy from the model's array, none in the server. `Ok(Err(text))` is Triton's error for
    /// an output larger than the region's range.
    fn tensor_into_region(&self, py: Python<'_>, out: Out, dest: Descriptor) -> PyResult<Result<Tensor, String>> {
        let nbytes = out.source.nbytes();
        if nbytes as u64 > dest.len {
            return Ok(Err(tritium_ipc::output_too_small(&out.name, dest.len, nbytes as u64)));
        }
        let desc = Descriptor { len: nbytes as u64, ..dest };
        let view = self.inner.view(desc).map_err(ipc_err)?;
        // SAFETY: the view was bounds-checked against the mapped region and covers `nbytes`.
        unsafe { out.source.copy_to(py, view.as_ptr() as usize) }?;
        Ok(Ok(Tensor {
            name: out.name,
            dtype: out.dtype,
            shape: out.shape,
            data: TensorData::Shm { desc, writable: false },
        }))
    }

    /// Copies an output into a block of the stub's arena.
    pub(crate) fn tensor_into_arena(&self, py: Python<'_>, out: Out) -> PyResult<Tensor> {
        let view = self.inner.alloc(out.source.nbytes() as u64).map_err(ipc_err)?;
        // SAFETY: the destination was just allocated with the source's length.
        if let Err(e) = unsafe { out.source.copy_to(py, view.as_ptr() as usize) } {
            let _ = self.inner.free_own(view.desc);
            return Err(e);
        }
        Ok(Tensor {
            name: out.name,
            dtype: out.dtype,
            shape: out.shape,
            data: TensorData::Shm { desc: view.desc, writable: true },
        })
    }

    /// Sends one response of `request` whose outputs are `outputs` (each copied into the
    /// client's region the request named for it, else into the arena); the caller holds the
    /// objects their sources point into. The server is woken unless `wake` is false.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn respond(
        &self,
        py: Python<'_>,
        request: u64,
        outputs: Vec<Out>,
        error: Option<StubError>,
        parameters: Vec<(String, Param)>,
        final_response: bool,
        wake: bool,
    ) -> PyResult<()> {
        let regions = self.router.client_regions.locked().get(&request).cloned().unwrap_or_default();
        let mut tensors = Vec::with_capacity(outputs.len());
        let mut region_error = None;
        for out in outputs {
            let made = match regions.outputs.iter().find(|(name, _)| *name == out.name) {
                Some((_, dest)) => match self.tensor_into_region(py, out, *dest) {
                    Ok(Ok(t)) => Ok(t),
                    Ok(Err(too_small)) => {
                        region_error = Some(too_small);
                        break;
                    }
                    Err(e) => Err(e),
                },
                None => self.tensor_into_arena(py, out),
            };
            match made {
                Ok(t) => tensors.push(t),
                Err(e) => {
                    self.free_tensors(&tensors);
                    return Err(e);
                }
            }
        }
        let mut error = error;
        // Triton fails the response (INTERNAL) when an output does not fit its region; tritium
        // also when the client shrank a region of the request under the model.
        if let Some(message) = region_error.or_else(|| self.region_fault(&regions)) {
            self.free_tensors(&tensors);
            tensors = Vec::new();
            error = Some(StubError { message, code: 1, traceback: None });
        }
        let response = Response { request, outputs: tensors, error, parameters, final_response, flag_only: false };
        self.send_waking(py, ToServer::Response(response), wake)?;
        if final_response {
            self.ended(request);
        }
        Ok(())
    }

    /// [`Channel::send_rows`]: `outputs` (each `(name, wire dtype, C-contiguous numpy array)`) are
    /// held by the caller while their rows are copied.
    pub(crate) fn respond_rows(
        &self,
        py: Python<'_>,
        requests: Vec<(u64, Vec<String>)>,
        outputs: &[(String, String, Bound<'_, PyAny>)],
        rows: Option<Vec<usize>>,
    ) -> PyResult<()> {
        // Each output's dtype, shape, address and bytes per row (first dimension).
        let mut arrays = Vec::with_capacity(outputs.len());
        for (name, dtype_name, data) in outputs {
            let dtype = dtype(dtype_name)?;
            let Source::Host { address, nbytes } = output_source(name, data)? else {
                return Err(PyValueError::new_err(format!("output '{name}' is not in host memory")));
            };
            let shape: Vec<i64> = data.getattr("shape")?.extract()?;
            let row_bytes = match (&rows, shape.first()) {
                (None, _) => 0,
                (Some(rows), Some(&first)) if usize::try_from(first).ok() == Some(rows.iter().sum()) && first > 0 => {
                    nbytes / first as usize
                }
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "output '{name}' has shape {shape:?}, not the batch's {} rows",
                        rows.as_ref().map_or(0, |r| r.iter().sum::<usize>())
                    )))
                }
            };
            arrays.push((name.as_str(), dtype, shape, address, nbytes, row_bytes));
        }
        if rows.as_ref().is_some_and(|r| r.len() != requests.len()) {
            return Err(PyValueError::new_err("send_rows: one row count per request"));
        }
        let mut start = 0usize;
        for (i, (request, requested)) in requests.into_iter().enumerate() {
            let count = rows.as_ref().map(|r| r[i]);
            let outs = arrays
                .iter()
                .filter(|a| requested.is_empty() || requested.iter().any(|n| n == a.0))
                .map(|&(name, dtype, ref shape, address, nbytes, row_bytes)| {
                    let (shape, source) = match count {
                        None => (shape.clone(), Source::Host { address, nbytes }),
                        Some(n) => {
                            let mut part = shape.clone();
                            part[0] = n as i64;
                            (part, Source::Host { address: address + start * row_bytes, nbytes: n * row_bytes })
                        }
                    };
                    Out { name: name.to_string(), dtype, shape, source }
                })
                .collect();
            start += count.unwrap_or(0);
            if let Err(e) = self.respond(py, request, outs, None, Vec::new(), true, false) {
                if e.is_instance_of::<ChannelError>(py) {
                    return Err(e);
                }
                let message = format!("Failed to send the response: {}", e.value(py));
                let error = StubError { message, code: 1, traceback: None };
                self.respond(py, request, Vec::new(), Some(error), Vec::new(), true, false)?;
            }
        }
        Ok(())
    }

    /// The error for a response of `request` when a client region its inputs or outputs lie in
    /// was shrunk by its client under the model ([`tritium_ipc::fault`]): what the model read
    /// there were zeros, and what it wrote there is lost.
    fn region_fault(&self, regions: &ClientRegions) -> Option<String> {
        regions.ids().any(|id| self.inner.region_faulted(id)).then(|| {
            "the client shrank a system shared memory region this request reads or writes while the model was \
             running (its file is smaller than the registered range), so the request's data there is lost; keep a \
             region's file at its registered size while requests use it, and register the region again"
                .to_string()
        })
    }
}

/// An output to send: its bytes are at `source`, in an object the caller holds.
pub(crate) struct Out {
    name: String,
    dtype: DataType,
    shape: Vec<i64>,
    source: Source,
}

impl Out {
    /// The output Python gives as `(name, wire dtype, shape, data)`; the caller keeps `data`.
    pub(crate) fn from_py(
        (name, dtype_name, shape, data): &(String, String, Vec<i64>, Bound<'_, PyAny>),
    ) -> PyResult<Self> {
        Ok(Out {
            name: name.clone(),
            dtype: dtype(dtype_name)?,
            shape: shape.clone(),
            source: output_source(name, data)?,
        })
    }
}
