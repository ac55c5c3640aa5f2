//! numpy at the boundary: dtypes, batch inputs joined without a copy, and where an output's
//! bytes are (host memory, or a GPU tensor's device memory).

use numpy::npyffi::{
    npy_intp, NpyTypes, PyArrayObject, PyArray_Descr, NPY_ARRAY_CARRAY, NPY_ARRAY_CARRAY_RO, NPY_TYPES, PY_ARRAY_API,
};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use tritium_ipc::DataType;

use crate::cuda;
use crate::messages::InBlock;
use crate::ChannelError;

/// numpy's type number and item size for a wire dtype. `BYTES` arrive as raw `uint8` (Python
/// deserializes them) and `BF16` as raw `uint16` (numpy has no bfloat16).
pub(crate) fn npy_type(d: DataType) -> (NPY_TYPES, usize) {
    match d {
        DataType::Bool => (NPY_TYPES::NPY_BOOL, 1),
        DataType::Uint8 | DataType::Bytes => (NPY_TYPES::NPY_UBYTE, 1),
        DataType::Uint16 | DataType::Bf16 => (NPY_TYPES::NPY_USHORT, 2),
        DataType::Uint32 => (NPY_TYPES::NPY_UINT, 4),
        DataType::Uint64 => (NPY_TYPES::NPY_ULONG, 8),
        DataType::Int8 => (NPY_TYPES::NPY_BYTE, 1),
        DataType::Int16 => (NPY_TYPES::NPY_SHORT, 2),
        DataType::Int32 => (NPY_TYPES::NPY_INT, 4),
        DataType::Int64 => (NPY_TYPES::NPY_LONG, 8),
        DataType::Fp16 => (NPY_TYPES::NPY_HALF, 2),
        DataType::Fp32 => (NPY_TYPES::NPY_FLOAT, 4),
        DataType::Fp64 => (NPY_TYPES::NPY_DOUBLE, 8),
    }
}

/// A numpy array over an input block, without a copy: the block is the array's base, so its
/// bytes stay mapped (and unreleased) while the array or any view of it lives.
pub(crate) fn array_over<'py>(
    py: Python<'py>,
    block: Py<InBlock>,
    dtype: DataType,
    shape: &[i64],
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let (typenum, size) = npy_type(dtype);
    let (ptr, nbytes, writable) = {
        let b = block.get();
        (b.view.as_ptr(), b.view.len(), b.writable)
    };
    let mut dims: Vec<npy_intp> = if dtype == DataType::Bytes {
        vec![nbytes as npy_intp]
    } else {
        shape.iter().map(|&d| d as npy_intp).collect()
    };
    let bytes = dims.iter().try_fold(size, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)));
    if bytes != Some(nbytes) {
        return Err(ChannelError::new_err(format!(
            "input '{name}' has shape {shape:?} of {dtype:?} but {nbytes} bytes"
        )));
    }
    let flags = if writable { NPY_ARRAY_CARRAY } else { NPY_ARRAY_CARRAY_RO };
    // SAFETY: numpy's C API is initialised by PY_ARRAY_API on first use (it imports numpy);
    // DescrFromType returns a new reference, which `array_with_base` takes over; the data pointer
    // covers `nbytes` bytes of a mapping that `block`, the array's base, keeps alive.
    unsafe {
        let descr = PY_ARRAY_API.PyArray_DescrFromType(py, typenum as std::os::raw::c_int);
        if descr.is_null() {
            return Err(PyErr::fetch(py));
        }
        array_with_base(py, descr, &mut dims, ptr, flags, block.into_bound(py).into_any())
    }
}

/// A C-contiguous numpy array of `descr` and `dims` over the bytes at `ptr`, with `base` as its
/// base object (what keeps the bytes mapped); `flags` says whether it is writable.
///
/// # Safety
/// `descr` is a new reference to a dtype descriptor, taken over here (NewFromDescr steals it,
/// also when it fails); `ptr` covers the bytes of `dims` elements of `descr` and stays valid
/// while `base` lives.
unsafe fn array_with_base<'py>(
    py: Python<'py>,
    descr: *mut PyArray_Descr,
    dims: &mut [npy_intp],
    ptr: *mut u8,
    flags: std::os::raw::c_int,
    base: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: as the caller promises (above); SetBaseObject steals the reference to `base` that
    // `into_ptr` hands over, and on its failure the new array is released.
    unsafe {
        let array = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            descr,
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            ptr.cast(),
            flags,
            std::ptr::null_mut(),
        );
        if array.is_null() {
            return Err(PyErr::fetch(py));
        }
        if PY_ARRAY_API.PyArray_SetBaseObject(py, array.cast::<PyArrayObject>(), base.into_ptr()) < 0 {
            pyo3::ffi::Py_DECREF(array);
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, array))
    }
}

/// The arrays of one input of a batch's requests (each an [`InputMsg`](crate::messages::InputMsg)'s `array`, over its whole
/// block), joined along the first dimension without a copy: one array over their blocks, when the
/// blocks lie back to back in one segment in this order (as the server places the inputs a batch's
/// requests share) and the arrays agree in dtype and in every dimension after the first. Its base
/// is the tuple of the blocks, so it keeps every one of them; it is writable when they all are.
/// `None` when they cannot be joined so: the caller copies them instead.
#[pyfunction]
pub(crate) fn join_inputs<'py>(py: Python<'py>, arrays: Vec<Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mut blocks: Vec<Bound<'py, InBlock>> = Vec::with_capacity(arrays.len());
    let mut typed: Vec<Bound<'py, PyUntypedArray>> = Vec::with_capacity(arrays.len());
    for a in &arrays {
        let Ok(array) = a.cast::<PyUntypedArray>() else { return Ok(None) };
        let Ok(block) = a.getattr("base")?.cast_into::<InBlock>() else { return Ok(None) };
        let view = &block.get().view;
        // SAFETY: `array` is a live ndarray (checked by the cast); its data pointer is only read.
        let data = unsafe { (*array.as_array_ptr()).data } as usize;
        let nbytes = array.shape().iter().try_fold(array.dtype().itemsize(), |acc, &d| acc.checked_mul(d));
        if array.ndim() == 0 || !array.is_c_contiguous() || data != view.as_ptr() as usize || nbytes != Some(view.len())
        {
            return Ok(None);
        }
        typed.push(array.clone());
        blocks.push(block);
    }
    let (Some(first), Some(first_block)) = (typed.first(), blocks.first()) else { return Ok(None) };
    let mut rows = 0usize;
    for (i, (array, block)) in typed.iter().zip(&blocks).enumerate() {
        if !array.dtype().is_equiv_to(&first.dtype()) || array.shape()[1..] != first.shape()[1..] {
            return Ok(None);
        }
        if let Some(next) = blocks.get(i + 1) {
            let (here, there) = (&block.get().view, &next.get().view);
            let adjacent = here.desc.segment == there.desc.segment
                && here.desc.offset.checked_add(here.desc.len) == Some(there.desc.offset)
                && (here.as_ptr() as usize).checked_add(here.len()) == Some(there.as_ptr() as usize);
            if !adjacent {
                return Ok(None);
            }
        }
        rows += array.shape()[0];
    }
    let writable = blocks.iter().all(|b| b.get().writable);
    let flags = if writable { NPY_ARRAY_CARRAY } else { NPY_ARRAY_CARRAY_RO };
    let mut dims: Vec<npy_intp> =
        std::iter::once(rows).chain(first.shape()[1..].iter().copied()).map(|d| d as npy_intp).collect();
    let ptr = first_block.get().view.as_ptr();
    let base = PyTuple::new(py, &blocks)?;
    // SAFETY: the blocks are back to back in one mapping (checked above), so the data pointer
    // covers `rows` rows of the shared bytes, which `base` (the tuple of every block), the
    // array's base, keeps mapped; `into_ptr` hands over the descriptor reference it takes.
    unsafe { array_with_base(py, first.dtype().into_ptr().cast(), &mut dims, ptr, flags, base.into_any()).map(Some) }
}

/// Where an output's bytes are: host memory, or device memory (a GPU tensor's
/// [`cuda::CudaMemory`]), copied to the host on the way into shared memory.
pub(crate) enum Source {
    Host { address: usize, nbytes: usize },
    Cuda { device: i32, ptr: u64, nbytes: usize },
}

impl Source {
    pub(crate) fn nbytes(&self) -> usize {
        match *self {
            Source::Host { nbytes, .. } | Source::Cuda { nbytes, .. } => nbytes,
        }
    }

    /// Copies the bytes to `dst` (an arena block or a client's region: memory another process
    /// reads next, so a large copy streams), without the GIL; device memory after its device's
    /// pending work is done.
    ///
    /// # Safety
    /// `dst` must be writable host memory of [`Source::nbytes`] bytes, alive for the call; the
    /// caller's `Bound` of the source object must still be held.
    pub(crate) unsafe fn copy_to(&self, py: Python<'_>, dst: usize) -> PyResult<()> {
        match *self {
            Source::Host { nbytes: 0, .. } => Ok(()),
            Source::Host { address, nbytes } => {
                py.detach(move || {
                    // SAFETY: the source covers `nbytes` bytes of an object the caller's Bound
                    // keeps alive (see `output_source`); the caller vouches for `dst`.
                    unsafe { tritium_ipc::copy::copy_for_peer_raw(address as *const u8, dst as *mut u8, nbytes) }
                });
                Ok(())
            }
            // SAFETY: the caller vouches for `dst`; the CudaMemory's owner keeps the device
            // memory alive while the caller holds it.
            Source::Cuda { device, ptr, nbytes } => unsafe { cuda::copy_to_host_raw(py, device, ptr, dst, nbytes) },
        }
    }
}

/// Where an output's bytes are: a `bytes` object's, a C-contiguous numpy array's, or a GPU
/// tensor's `CudaMemory`. The caller's `Bound` keeps the object, and so the bytes, alive and
/// unchanged while it copies them (a `bytes` is immutable; model code has returned the array).
pub(crate) fn output_source(name: &str, data: &Bound<'_, PyAny>) -> PyResult<Source> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(Source::Host { address: bytes.as_bytes().as_ptr() as usize, nbytes: bytes.as_bytes().len() });
    }
    let Ok(array) = data.cast::<PyUntypedArray>() else {
        if let Ok(memory) = data.cast::<cuda::CudaMemory>() {
            let memory = memory.get();
            let nbytes = usize::try_from(memory.nbytes)
                .map_err(|_| PyValueError::new_err(format!("output '{name}' is too large")))?;
            return Ok(Source::Cuda { device: memory.device, ptr: memory.ptr, nbytes });
        }
        return Err(PyValueError::new_err(format!(
            "output '{name}' must be bytes or a numpy array, got {}",
            data.get_type()
        )));
    };
    if !array.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("output '{name}' must be C-contiguous")));
    }
    let nbytes = array.shape().iter().try_fold(array.dtype().itemsize(), |acc, &d| acc.checked_mul(d));
    let nbytes = nbytes.ok_or_else(|| PyValueError::new_err(format!("output '{name}' is too large")))?;
    // SAFETY: `array` is a live ndarray (checked by the cast); its data pointer is only read.
    Ok(Source::Host { address: unsafe { (*array.as_array_ptr()).data } as usize, nbytes })
}
