//! CUDA for model code: the stub's side of GPU tensors (`pb_utils.Tensor` in device memory).
//!
//! Everything goes through [`tritium_cuda`], which finds the driver at run time: where there is
//! none, [`cuda_unavailable_reason`] says why and every other call raises [`CudaError`] with
//! that reason. Nothing here panics on what model code passes in.
//!
//! - [`cuda_bind`] makes a device's primary context current on the calling thread (what
//!   `KIND_GPU` instances do at `initialize`, so torch and cupy default to that device).
//! - [`CudaBuffer`] is device memory of the stub's own (a BLS output placed on the GPU);
//!   [`CudaMemory`] is a range of device memory with the Python object that keeps it alive (a
//!   consumed DLPack capsule's owner, or a `CudaBuffer`), which is what a GPU `pb_utils.Tensor`
//!   holds: [`CudaMemory::to_dlpack`] exports it as a `kDLCUDA` capsule over the same memory,
//!   and the channel copies it to the host when it is an output ([`copy_to_host_raw`]).
//! - Copies between device memory and Python buffers (a numpy array, a `memoryview` of arena
//!   memory, a `bytearray`) release the GIL.
//!
//! Like Triton's `ScopedSetDevice`, every call here except [`cuda_bind`] leaves the calling
//! thread's current context as it found it ([`tritium_cuda::Cuda::keep_context`]): a copy of a tensor on device 1
//! does not move a model bound to device 0.

use std::ffi::{c_void, CStr};
use std::mem::ManuallyDrop;

use numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use tritium_cuda::{cuda, Cuda, DeviceBuffer, IpcMapping};
use tritium_sync::Locked;

create_exception!(_native, CudaError, PyException, "A CUDA call failed, or CUDA is not available in this stub.");

fn cuda_err(e: tritium_cuda::CudaError) -> PyErr {
    CudaError::new_err(e.to_string())
}

fn driver() -> PyResult<&'static Cuda> {
    cuda().map_err(cuda_err)
}

/// Checks that `ptr..ptr + len` starts and ends in device memory the driver knows (not a host
/// pointer, not a freed one), so that a copy from a bad pointer is an error and not a read of
/// whatever is there.
fn check_device_range(cuda: &Cuda, ptr: u64, len: u64) -> PyResult<()> {
    if len == 0 {
        return Ok(());
    }
    let last = ptr.checked_add(len - 1).ok_or_else(|| CudaError::new_err("the device range overflows"))?;
    for p in [ptr, last] {
        cuda.pointer_device(p)
            .map_err(|e| CudaError::new_err(format!("0x{p:x} is not CUDA device memory of this process ({e})")))?;
    }
    Ok(())
}

/// Copies `len` bytes of device memory at `src` on `device` to host memory at `dst`, after
/// waiting for the device's pending work (another library, torch or cupy, may still be writing
/// the tensor on a stream of its own). Releases the GIL.
///
/// # Safety
/// `dst..dst + len` must be writable host memory that stays alive and unaliased by Rust
/// references for the call.
pub(crate) unsafe fn copy_to_host_raw(py: Python<'_>, device: i32, src: u64, dst: usize, len: usize) -> PyResult<()> {
    let cuda = driver()?;
    if len == 0 {
        return Ok(());
    }
    py.detach(move || {
        let _keep = cuda.keep_context();
        // Binds `device` first: the pointer checks want a current context.
        cuda.synchronize(device).map_err(cuda_err)?;
        check_device_range(cuda, src, len as u64)?;
        // SAFETY: the caller vouches for the host range; the device range starts and ends in
        // live device memory (checked above) and its owner is kept alive by the caller.
        let host = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
        // SAFETY: as above.
        unsafe { cuda.copy_to_host(device, src, host) }.map_err(cuda_err)
    })
}

/// Copies `len` bytes of host memory at `src` to device memory at `dst` on `device`, and waits
/// until the device has them. Releases the GIL.
///
/// # Safety
/// `src..src + len` must be readable host memory that stays alive for the call.
unsafe fn copy_from_host_raw(py: Python<'_>, device: i32, dst: u64, src: usize, len: usize) -> PyResult<()> {
    let cuda = driver()?;
    if len == 0 {
        return Ok(());
    }
    py.detach(move || {
        let _keep = cuda.keep_context();
        cuda.bind(device).map_err(cuda_err)?;
        check_device_range(cuda, dst, len as u64)?;
        // SAFETY: the caller vouches for the host range.
        let host = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
        // SAFETY: the device range starts and ends in live device memory (checked above).
        unsafe { cuda.copy_from_host(device, dst, host) }.map_err(cuda_err)?;
        // A copy from pageable memory may return before the device has the bytes.
        cuda.synchronize(device).map_err(cuda_err)
    })
}

/// A Python object's bytes as one contiguous host range: a numpy array's (C-contiguous), or
/// anything numpy can view as bytes (`bytes`, `bytearray`, a `memoryview`). The Bound keeps
/// the object, and so its bytes, alive.
struct HostBuffer<'py> {
    _keep: Bound<'py, PyAny>,
    address: usize,
    len: usize,
}

fn host_buffer<'py>(obj: &Bound<'py, PyAny>, writable: bool, what: &str) -> PyResult<HostBuffer<'py>> {
    let py = obj.py();
    let keep = if obj.cast::<PyUntypedArray>().is_ok() {
        obj.clone()
    } else {
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", "u1")?;
        py.import("numpy")?.call_method("frombuffer", (obj,), Some(&kwargs)).map_err(|e| {
            PyValueError::new_err(format!(
                "the {what} must be a numpy array or an object with the buffer protocol, got {} ({e})",
                obj.get_type()
            ))
        })?
    };
    let array = keep.cast::<PyUntypedArray>()?;
    if !array.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("the {what} must be C-contiguous")));
    }
    // SAFETY: a live ndarray (checked by the cast); only its flags and data pointer are read.
    let (flags, data) = unsafe {
        let raw = array.as_array_ptr();
        ((*raw).flags, (*raw).data)
    };
    if writable && flags & NPY_ARRAY_WRITEABLE == 0 {
        return Err(PyValueError::new_err(format!("the {what} is read-only")));
    }
    let len = array.shape().iter().try_fold(array.dtype().itemsize(), |acc, &d| acc.checked_mul(d));
    let len = len.ok_or_else(|| PyValueError::new_err(format!("the {what} is too large")))?;
    Ok(HostBuffer { _keep: keep, address: data as usize, len })
}

/// Why CUDA cannot be used in this stub ("no CUDA driver library (libcuda.so.1) was found"), or
/// None when it can. The same answer every time.
#[pyfunction]
pub(crate) fn cuda_unavailable_reason() -> Option<String> {
    tritium_cuda::unavailable_reason()
}

/// How many CUDA devices this stub sees (after `CUDA_VISIBLE_DEVICES`); 0 without CUDA.
#[pyfunction]
pub(crate) fn cuda_device_count() -> usize {
    cuda().map_or(0, Cuda::device_count)
}

/// The name of CUDA device `device` ("NVIDIA H200").
#[pyfunction]
pub(crate) fn cuda_device_name(device: i32) -> PyResult<String> {
    driver()?.device_name(device).map_err(cuda_err)
}

/// Makes `device`'s primary context current on the calling thread, so that what runs on it
/// next (torch, cupy, the CUDA runtime) uses `device` by default.
#[pyfunction]
pub(crate) fn cuda_bind(device: i32) -> PyResult<()> {
    driver()?.bind(device).map_err(cuda_err)
}

/// The device of the context current on the calling thread, or None when none is (or CUDA is
/// not available).
#[pyfunction]
pub(crate) fn cuda_current_device() -> Option<i32> {
    cuda().ok()?.current_device()
}

/// Waits, without the GIL, until all work on `device` has finished.
#[pyfunction]
pub(crate) fn cuda_synchronize(py: Python<'_>, device: i32) -> PyResult<()> {
    let cuda = driver()?;
    py.detach(move || {
        let _keep = cuda.keep_context();
        cuda.synchronize(device).map_err(cuda_err)
    })
}

/// The device that owns device pointer `ptr` of this process; a `CudaError` for a pointer the
/// driver does not know (host memory, freed memory).
#[pyfunction]
pub(crate) fn cuda_pointer_device(ptr: u64) -> PyResult<i32> {
    let cuda = driver()?;
    let _keep = cuda.keep_context();
    if cuda.current_device().is_none() {
        // The driver answers pointer queries within a context: any device's will do.
        cuda.bind(0).map_err(cuda_err)?;
    }
    cuda.pointer_device(ptr).map_err(cuda_err)
}

/// Copies device memory at `src` on `device` into `dst`, a writable host buffer (a numpy array,
/// a `memoryview` of shared memory): as many bytes as `dst` has, after the device's pending
/// work. The device range must lie in one allocation.
#[pyfunction]
pub(crate) fn cuda_copy_to_host(py: Python<'_>, device: i32, src: u64, dst: &Bound<'_, PyAny>) -> PyResult<()> {
    let host = host_buffer(dst, true, "destination")?;
    // SAFETY: `host` keeps the writable, contiguous buffer alive for the call.
    unsafe { copy_to_host_raw(py, device, src, host.address, host.len) }
}

/// Copies `src`, a host buffer (numpy array, bytes, memoryview), to device memory at `dst` on
/// `device`; returns once the device has the bytes. The device range must lie in one allocation.
#[pyfunction]
pub(crate) fn cuda_copy_from_host(py: Python<'_>, device: i32, dst: u64, src: &Bound<'_, PyAny>) -> PyResult<()> {
    let host = host_buffer(src, false, "source")?;
    // SAFETY: `host` keeps the contiguous buffer alive for the call.
    unsafe { copy_from_host_raw(py, device, dst, host.address, host.len) }
}

/// `CudaBuffer(device, nbytes)`: device memory of the stub's own, freed when collected.
#[pyclass(frozen, module = "tritium._native")]
pub(crate) struct CudaBuffer {
    buf: ManuallyDrop<DeviceBuffer>,
}

impl CudaBuffer {
    fn range(&self, offset: u64, len: usize) -> PyResult<u64> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > self.buf.len()) {
            return Err(CudaError::new_err(format!(
                "bytes {offset}..{} are outside the {} bytes of the CUDA buffer",
                offset.saturating_add(len as u64),
                self.buf.len()
            )));
        }
        Ok(self.buf.device_ptr() + offset)
    }
}

#[pymethods]
impl CudaBuffer {
    /// Allocates `nbytes` bytes on `device`.
    #[new]
    fn new(py: Python<'_>, device: i32, nbytes: u64) -> PyResult<Self> {
        let cuda = driver()?;
        let buf = py.detach(move || {
            let _keep = cuda.keep_context();
            cuda.alloc(device, nbytes)
        });
        Ok(Self { buf: ManuallyDrop::new(buf.map_err(cuda_err)?) })
    }

    /// `CudaBuffer.alloc(device, nbytes)`: the same as `CudaBuffer(device, nbytes)`.
    #[staticmethod]
    fn alloc(py: Python<'_>, device: i32, nbytes: u64) -> PyResult<Self> {
        Self::new(py, device, nbytes)
    }

    /// The device pointer of its first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.buf.device_ptr()
    }

    /// The device it lives on.
    #[getter]
    fn device(&self) -> i32 {
        self.buf.device()
    }

    /// Its size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.buf.len()
    }

    /// Copies `src` (a host buffer) to byte `offset` of the buffer, bounds-checked.
    #[pyo3(signature = (src, offset = 0))]
    fn copy_from_host(&self, py: Python<'_>, src: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        let host = host_buffer(src, false, "source")?;
        let dst = self.range(offset, host.len)?;
        // SAFETY: `host` keeps the buffer alive; the range is inside this live allocation.
        unsafe { copy_from_host_raw(py, self.buf.device(), dst, host.address, host.len) }
    }

    /// Fills `dst` (a writable host buffer) from byte `offset` of the buffer, bounds-checked.
    #[pyo3(signature = (dst, offset = 0))]
    fn copy_to_host(&self, py: Python<'_>, dst: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        let host = host_buffer(dst, true, "destination")?;
        let src = self.range(offset, host.len)?;
        // SAFETY: `host` keeps the buffer alive; the range is inside this live allocation.
        unsafe { copy_to_host_raw(py, self.buf.device(), src, host.address, host.len) }
    }

    /// A `CudaMemory` over the whole buffer that keeps it alive.
    fn memory(slf: &Bound<'_, Self>) -> CudaMemory {
        let me = slf.get();
        CudaMemory {
            device: me.buf.device(),
            ptr: me.buf.device_ptr(),
            nbytes: me.buf.len(),
            owner: slf.clone().into_any().unbind(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "CudaBuffer(device={}, nbytes={}, ptr=0x{:x})",
            self.buf.device(),
            self.buf.len(),
            self.buf.device_ptr()
        )
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // Freeing binds the buffer's device: the thread that collects it keeps its own.
        let _keep = cuda().ok().map(Cuda::keep_context);
        // SAFETY: dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.buf) };
    }
}

/// `CudaMemory(device, ptr, nbytes, owner)`: `nbytes` bytes of device memory at `ptr` on
/// `device`, kept alive by `owner` (held as long as this object is). What a GPU
/// `pb_utils.Tensor` holds; as an output it is copied to the host by the channel.
#[pyclass(frozen, get_all, module = "tritium._native")]
pub(crate) struct CudaMemory {
    /// The CUDA device.
    pub(crate) device: i32,
    /// The device pointer of the first byte.
    pub(crate) ptr: u64,
    /// Its length in bytes.
    pub(crate) nbytes: u64,
    /// What keeps the memory alive (a consumed DLPack capsule's owner, a `CudaBuffer`).
    owner: Py<PyAny>,
}

#[pymethods]
impl CudaMemory {
    #[new]
    fn new(device: i32, ptr: u64, nbytes: u64, owner: Py<PyAny>) -> PyResult<Self> {
        if device < 0 {
            return Err(PyValueError::new_err(format!("a CUDA device id is not negative, got {device}")));
        }
        if ptr.checked_add(nbytes).is_none() {
            return Err(PyValueError::new_err("the device range overflows"));
        }
        Ok(Self { device, ptr, nbytes, owner })
    }

    /// Fills `dst` (a writable host buffer of at most `nbytes` bytes) from the start of the
    /// memory, after the device's pending work.
    fn copy_to_host(&self, py: Python<'_>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
        let host = host_buffer(dst, true, "destination")?;
        if host.len as u64 > self.nbytes {
            return Err(PyValueError::new_err(format!(
                "the destination has {} bytes, more than the {} bytes of the CUDA memory",
                host.len, self.nbytes
            )));
        }
        // SAFETY: `host` keeps the buffer alive; `owner` keeps the device memory alive.
        unsafe { copy_to_host_raw(py, self.device, self.ptr, host.address, host.len) }
    }

    /// A legacy DLPack capsule (`"dltensor"`, `kDLCUDA`) over the memory, of dtype
    /// `(code, bits)` (DLPack's DLDataTypeCode and bits, one lane) and C-contiguous `shape`.
    /// Whoever consumes it keeps this object alive until it calls the capsule's deleter; a
    /// capsule never consumed deletes itself when collected.
    fn to_dlpack<'py>(slf: &Bound<'py, Self>, code: u8, bits: u8, shape: Vec<i64>) -> PyResult<Bound<'py, PyAny>> {
        let me = slf.get();
        let count = shape.iter().try_fold(1u64, |acc, &d| u64::try_from(d).ok().and_then(|d| acc.checked_mul(d)));
        let nbytes = count.and_then(|c| c.checked_mul(u64::from(bits).div_ceil(8)));
        if nbytes.is_none_or(|n| n > me.nbytes) {
            return Err(PyValueError::new_err(format!(
                "shape {shape:?} of {bits}-bit elements does not fit the {} bytes of the CUDA memory",
                me.nbytes
            )));
        }
        dlpack_capsule(
            slf.py(),
            DLDevice { device_type: KDL_CUDA, device_id: me.device },
            me.ptr,
            DLDataType { code, bits, lanes: 1 },
            shape,
            slf.clone().into_any().unbind(),
        )
    }

    fn __repr__(&self) -> String {
        format!("CudaMemory(device={}, ptr=0x{:x}, nbytes={})", self.device, self.ptr, self.nbytes)
    }
}

/// DLPack's `kDLCUDA`.
const KDL_CUDA: i32 = 2;

/// The name of an unconsumed legacy DLPack capsule; static, as a capsule's name must outlive it.
const DLTENSOR: &CStr = c"dltensor";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// A DLManagedTensor (first, so a pointer to one is a pointer to the other) with the shape it
/// points to and the object that keeps its memory alive.
#[repr(C)]
struct Managed {
    tensor: DLManagedTensor,
    shape: Vec<i64>,
    owner: Option<Py<PyAny>>,
}

/// The deleter of our capsules' tensors: frees the shape and lets go of the owner.
///
/// A consumer may call it with or without the GIL, from any thread, and even from inside a
/// call that released the GIL under a pyo3 frame (ctypes does, when tritium's own
/// `dlpack._Owner` deletes a consumed capsule of ours while a `CudaMemory` is collected), where
/// pyo3 would wrongly believe the GIL held. So the GIL is taken with `PyGILState_Ensure`, which
/// is right in every one of those cases.
unsafe extern "C" fn delete_managed(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: our deleter is only set on tensors made by `dlpack_capsule` from a Box<Managed>,
    // and DLPack calls it once.
    let mut managed = unsafe { Box::from_raw(tensor.cast::<Managed>()) };
    let Some(owner) = managed.owner.take() else { return };
    let owner = owner.into_ptr();
    // SAFETY: Py_IsInitialized may be called at any time; without an interpreter the owner is
    // leaked (the process is ending). PyGILState_Ensure takes the GIL whether or not this
    // thread holds it, and the reference given up by `into_ptr` is released under it.
    unsafe {
        if pyo3::ffi::Py_IsInitialized() == 0 {
            return;
        }
        let state = pyo3::ffi::PyGILState_Ensure();
        pyo3::ffi::Py_DECREF(owner);
        pyo3::ffi::PyGILState_Release(state);
    }
}

/// The capsule's destructor: a capsule still named "dltensor" was never consumed, so its
/// tensor is still the capsule's to delete.
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed; IsValid and GetPointer only
    // read it (and set no error for a valid capsule).
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) != 1 {
            return;
        }
        let tensor = pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr()).cast::<DLManagedTensor>();
        if let Some(deleter) = tensor.as_ref().and_then(|t| t.deleter) {
            deleter(tensor);
        }
    }
}

fn dlpack_capsule(
    py: Python<'_>,
    device: DLDevice,
    data: u64,
    dtype: DLDataType,
    shape: Vec<i64>,
    owner: Py<PyAny>,
) -> PyResult<Bound<'_, PyAny>> {
    let ndim = i32::try_from(shape.len()).map_err(|_| PyValueError::new_err("too many dimensions"))?;
    let mut managed = Box::new(Managed {
        tensor: DLManagedTensor {
            dl_tensor: DLTensor {
                data: data as *mut c_void,
                device,
                ndim,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_managed),
        },
        shape,
        owner: Some(owner),
    });
    // The Vec's buffer does not move when the Box does.
    managed.tensor.dl_tensor.shape = managed.shape.as_mut_ptr();
    let raw = Box::into_raw(managed);
    // SAFETY: `raw` is a live Managed whose first field is the DLManagedTensor; the name is
    // static; the destructor deletes the tensor unless a consumer renamed the capsule.
    let capsule = unsafe { pyo3::ffi::PyCapsule_New(raw.cast(), DLTENSOR.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the tensor is still ours alone.
        unsafe { delete_managed(raw.cast()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference, owned from here on.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// A client's device allocation, opened in this stub from its CUDA IPC handle (an input in the
/// client's CUDA shared memory, for a model with `FORCE_CPU_ONLY_INPUT_TENSORS: "no"`): the
/// owner of the `CudaMemory` of every input over it. Closed when the last of them is gone.
#[pyclass(frozen, module = "tritium._native")]
pub(crate) struct IpcOpened {
    /// Held, never read: the mapping closes when the last input over it lets go.
    _mapping: Arc<IpcMapping>,
}

/// The allocations open in this process, by device and handle. CUDA opens a handle once per
/// process: a second input over the same allocation, while the first is alive, shares it.
static OPENED: Mutex<BTreeMap<OpenedKey, Weak<IpcMapping>>> = Mutex::new(BTreeMap::new());

/// A device and an IPC handle's bytes.
type OpenedKey = (i32, Vec<u8>);

/// The `CudaMemory` of an input the server sent as an IPC handle: `len` bytes from `offset` of
/// the allocation `handle` names on `device`, bounds-checked against the allocation.
pub(crate) fn ipc_input(py: Python<'_>, handle: &[u8], device: i32, offset: u64, len: u64) -> PyResult<Py<CudaMemory>> {
    let cuda = driver()?;
    let mapping = {
        let mut opened = OPENED.locked();
        opened.retain(|_, m| m.strong_count() > 0);
        let key = (device, handle.to_vec());
        match opened.get(&key).and_then(Weak::upgrade) {
            Some(m) => m,
            None => {
                let _keep = cuda.keep_context();
                let m = Arc::new(cuda.open_ipc(device, handle).map_err(|e| {
                    CudaError::new_err(format!("cannot open the client's CUDA memory on device {device}: {e}"))
                })?);
                opened.insert(key, Arc::downgrade(&m));
                m
            }
        }
    };
    if offset.checked_add(len).is_none_or(|end| end > mapping.size()) {
        return Err(CudaError::new_err(format!(
            "bytes {offset}..{} are outside the {} bytes of the client's CUDA allocation",
            offset.saturating_add(len),
            mapping.size()
        )));
    }
    let ptr = mapping.device_ptr() + offset;
    let owner = Py::new(py, IpcOpened { _mapping: mapping })?.into_any();
    Py::new(py, CudaMemory { device, ptr, nbytes: len, owner })
}

/// Adds the CUDA functions and classes to `_native`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cuda_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_name, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_bind, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_current_device, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_pointer_device, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_copy_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_copy_from_host, m)?)?;
    m.add_class::<CudaBuffer>()?;
    m.add_class::<CudaMemory>()?;
    m.add_class::<IpcOpened>()?;
    m.add("CudaError", m.py().get_type::<CudaError>())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DLPack ABI (v0.2 and later, 64-bit): what consumers read our capsules as.
    #[test]
    fn the_dlpack_structs_have_the_abis_layout() {
        assert_eq!(std::mem::size_of::<DLDevice>(), 8);
        assert_eq!(std::mem::size_of::<DLDataType>(), 4);
        assert_eq!(std::mem::size_of::<DLTensor>(), 48);
        assert_eq!(std::mem::offset_of!(DLTensor, device), 8);
        assert_eq!(std::mem::offset_of!(DLTensor, ndim), 16);
        assert_eq!(std::mem::offset_of!(DLTensor, dtype), 20);
        assert_eq!(std::mem::offset_of!(DLTensor, shape), 24);
        assert_eq!(std::mem::offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(std::mem::size_of::<DLManagedTensor>(), 64);
        assert_eq!(std::mem::offset_of!(DLManagedTensor, deleter), 56);
        // A pointer to a Managed is a pointer to its DLManagedTensor.
        assert_eq!(std::mem::offset_of!(Managed, tensor), 0);
    }
}
