//! The CUDA driver, found at run time.
//!
//! tritium is one binary for machines with and without GPUs: nothing here links against CUDA.
//! The first call to [`cuda`] looks for the driver library (`libcuda.so.1`, through cudarc's
//! dynamic loading), checks that it has every entry point used here, and initializes it. When
//! any of that fails, [`cuda`] returns [`CudaError::Unavailable`] with the reason, every time,
//! and nothing else in this crate can be reached: callers say so once and carry on without GPUs.
//!
//! What the server and the stubs need of CUDA, and nothing more:
//! - the devices ([`Cuda::devices`], [`Cuda::device_name`]), for `KIND_GPU` instance groups;
//! - CUDA IPC: a client's or another process's allocation opened from its 64-byte handle
//!   ([`Cuda::open_ipc`], an [`IpcMapping`] closed when dropped), and the handle of one of ours
//!   ([`Cuda::export_ipc`]);
//! - copies between host and device ([`IpcMapping::read`], [`IpcMapping::write`],
//!   [`Cuda::copy_to_host`], ...), and device memory of our own ([`Cuda::alloc`]).
//!
//! Every call runs in the device's primary context (the one the CUDA runtime, and so torch and
//! cupy, use), made current on the calling thread first, so any thread may call anything.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys;

/// The bytes of a CUDA IPC memory handle (`cudaIpcMemHandle_t`, `CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Why a CUDA call could not be made or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable driver: not installed, too old, or no device. Said once; nothing else works.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A driver call returned an error.
    #[error("{call} failed: {message} (CUresult {code})")]
    Driver {
        /// The driver entry point.
        call: &'static str,
        /// Its `CUresult`.
        code: u32,
        /// The driver's own text for it.
        message: String,
    },
    /// A device id that is not one of this machine's.
    #[error("CUDA device {device} does not exist: this machine has {count} CUDA device(s), ids 0 to {count} - 1")]
    NoSuchDevice {
        /// The id asked for.
        device: i32,
        /// How many devices there are.
        count: usize,
    },
    /// A handle that is not 64 bytes.
    #[error("a CUDA IPC memory handle has {IPC_HANDLE_BYTES} bytes, not {0}")]
    BadHandle(usize),
    /// A range outside an allocation.
    #[error("bytes {offset}..{end} are outside the {size} bytes of the CUDA allocation", end = offset.saturating_add(*len))]
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// The allocation's size.
        size: u64,
    },
}

/// Every driver entry point this crate calls: checked at start-up, so that a driver too old
/// for one of them makes CUDA unavailable instead of failing (cudarc panics on a missing symbol)
/// in the middle of a request.
const ENTRY_POINTS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuIpcGetMemHandle",
    "cuMemGetAddressRange_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoD_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuPointerGetAttribute",
];

/// A device's primary context, retained for the life of the process.
struct Context(sys::CUcontext);

// SAFETY: a CUcontext is a handle the driver lets any thread make current; it is never
// dereferenced here.
unsafe impl Send for Context {}
// SAFETY: as above; the driver synchronizes its own use of it.
unsafe impl Sync for Context {}

/// The initialized driver: proof that [`cuda`] succeeded.
pub struct Cuda {
    count: usize,
    contexts: Vec<OnceLock<Result<Context, CudaError>>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("devices", &self.count).finish()
    }
}

static CUDA: OnceLock<Result<Cuda, CudaError>> = OnceLock::new();

/// The driver, initialized on first use; the same answer every time.
///
/// `TRITIUM_CUDA=off` in the environment makes it unavailable without looking (for running a
/// GPU machine as a CPU one).
pub fn cuda() -> Result<&'static Cuda, CudaError> {
    CUDA.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// Whether [`cuda`] succeeds; the reason it does not, when it does not.
pub fn unavailable_reason() -> Option<String> {
    cuda().err().map(|e| match e {
        CudaError::Unavailable(why) => why,
        other => other.to_string(),
    })
}

fn init() -> Result<Cuda, CudaError> {
    if std::env::var("TRITIUM_CUDA").is_ok_and(|v| v.eq_ignore_ascii_case("off") || v == "0") {
        return Err(CudaError::Unavailable("turned off by TRITIUM_CUDA=off".into()));
    }
    // SAFETY: looks for the library by name; loading it runs the driver's initializers, which
    // is what loading a CUDA driver is for.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable("no CUDA driver library (libcuda.so.1) was found".into()));
    }
    // SAFETY: present, as just checked, so culib() does not panic.
    let lib = unsafe { sys::culib() };
    for name in ENTRY_POINTS {
        // SAFETY: only the symbol's presence is looked at; it is not called through this type.
        if unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err() {
            return Err(CudaError::Unavailable(format!(
                "the CUDA driver has no {name}: it is older than CUDA 11.0; update the NVIDIA driver"
            )));
        }
    }
    // SAFETY: every entry point exists (checked above); cuInit takes flags 0.
    check("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| CudaError::Unavailable(e.to_string()))?;
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })
        .map_err(|e| CudaError::Unavailable(e.to_string()))?;
    if count <= 0 {
        return Err(CudaError::Unavailable("the CUDA driver sees no device".into()));
    }
    let count = count as usize;
    Ok(Cuda { count, contexts: (0..count).map(|_| OnceLock::new()).collect() })
}

/// The driver's text for a `CUresult`.
fn error_text(code: sys::CUresult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: writes a pointer to a static string, or leaves it null for an unknown code.
    let known = unsafe { sys::cuGetErrorString(code, &mut text) } == sys::CUresult::CUDA_SUCCESS;
    if !known || text.is_null() {
        return format!("{code:?}");
    }
    // SAFETY: the driver returns a NUL-terminated static string.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

fn check(call: &'static str, code: sys::CUresult) -> Result<(), CudaError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError::Driver { call, code: code as u32, message: error_text(code) })
}

impl Cuda {
    /// How many devices the driver sees (after `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> usize {
        self.count
    }

    /// The device ids, `0..device_count`.
    pub fn devices(&self) -> Vec<i32> {
        (0..self.count as i32).collect()
    }

    /// The device's name ("NVIDIA H200").
    pub fn device_name(&self, device: i32) -> Result<String, CudaError> {
        let dev = self.device(device)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: writes at most 256 bytes, NUL-terminated.
        check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev) })?;
        // SAFETY: NUL-terminated by the driver, inside the buffer.
        Ok(unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn device(&self, device: i32) -> Result<sys::CUdevice, CudaError> {
        if device < 0 || device as usize >= self.count {
            return Err(CudaError::NoSuchDevice { device, count: self.count });
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: writes one device handle for an ordinal in range.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, device) })?;
        Ok(dev)
    }

    /// Makes `device`'s primary context current on this thread (retained once per process).
    /// After it, CUDA runtime users on this thread (torch, cupy) default to this device too.
    pub fn bind(&self, device: i32) -> Result<(), CudaError> {
        let slot =
            self.contexts.get(device.max(0) as usize).ok_or(CudaError::NoSuchDevice { device, count: self.count })?;
        let context = slot
            .get_or_init(|| {
                let dev = self.device(device)?;
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: writes one context handle.
                check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
                Ok(Context(ctx))
            })
            .as_ref()
            .map_err(Clone::clone)?;
        // SAFETY: a retained primary context, never released.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(context.0) })
    }

    /// The device of the context current on the calling thread; `None` when none is.
    pub fn current_device(&self) -> Option<i32> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle (null when no context is current).
        if unsafe { sys::cuCtxGetCurrent(&mut ctx) } != sys::CUresult::CUDA_SUCCESS || ctx.is_null() {
            return None;
        }
        let mut device: sys::CUdevice = 0;
        // SAFETY: writes one device ordinal, for the current context.
        (unsafe { sys::cuCtxGetDevice(&mut device) } == sys::CUresult::CUDA_SUCCESS).then_some(device)
    }

    /// Saves the calling thread's current context and puts it back when the guard is dropped
    /// (Triton's `ScopedSetDevice`): calls made in between may bind other devices without
    /// changing the device the model's own code (torch, cupy) sees as current.
    pub fn keep_context(&self) -> ContextGuard {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle (null when no context is current).
        let ok = unsafe { sys::cuCtxGetCurrent(&mut ctx) } == sys::CUresult::CUDA_SUCCESS;
        ContextGuard { saved: ok.then_some(ctx), _not_send: std::marker::PhantomData }
    }

    /// Waits for all work on `device` to finish (before reading memory another library wrote).
    pub fn synchronize(&self, device: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: no arguments; the current context is `device`'s.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Opens another process's allocation on `device` from its IPC handle (Triton's
    /// `cudaIpcOpenMemHandle` with lazy peer access). The mapping covers the whole allocation.
    pub fn open_ipc(&'static self, device: i32, handle: &[u8]) -> Result<IpcMapping, CudaError> {
        let raw: [u8; IPC_HANDLE_BYTES] = handle.try_into().map_err(|_| CudaError::BadHandle(handle.len()))?;
        self.bind(device)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        for (dst, src) in h.reserved.iter_mut().zip(raw) {
            *dst = src as c_char;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: writes one device pointer; the handle is 64 bytes by construction.
        check("cuIpcOpenMemHandle", unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) })?;
        // Closed on drop, also if the size cannot be read.
        let mut mapping = IpcMapping(Span { cuda: self, device, ptr, size: 0 });
        mapping.0.size = self.address_range(ptr)?.1;
        Ok(mapping)
    }

    /// The allocation that holds `ptr`: its start and size.
    fn address_range(&self, ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, u64), CudaError> {
        let mut base: sys::CUdeviceptr = 0;
        let mut size: usize = 0;
        // SAFETY: writes a pointer and a size; an unknown pointer is an error, not a fault.
        check("cuMemGetAddressRange", unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) })?;
        Ok((base, size as u64))
    }

    /// The device that owns `ptr`, a device pointer of this process.
    pub fn pointer_device(&self, ptr: u64) -> Result<i32, CudaError> {
        let mut ordinal: c_int = -1;
        let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
        // SAFETY: writes one int; an unknown pointer is an error, not a fault.
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute((&mut ordinal as *mut c_int).cast(), attribute, ptr)
        })?;
        Ok(ordinal)
    }

    /// The IPC handle of the allocation holding `ptr` on `device`, and `ptr`'s offset in it:
    /// what another process needs to open the same memory.
    pub fn export_ipc(&self, device: i32, ptr: u64) -> Result<Exported, CudaError> {
        self.bind(device)?;
        let (base, size) = self.address_range(ptr)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        // SAFETY: writes one handle for the start of a live allocation.
        check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut h, base) })?;
        let mut handle = [0u8; IPC_HANDLE_BYTES];
        for (dst, src) in handle.iter_mut().zip(h.reserved) {
            *dst = src as u8;
        }
        Ok(Exported { handle, offset: ptr - base, allocation_size: size })
    }

    /// Copies `dst.len()` bytes from device memory at `src` to the host.
    ///
    /// # Safety
    /// `src..src + dst.len()` must lie in one live allocation on `device`.
    pub unsafe fn copy_to_host(&self, device: i32, src: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: the caller vouches for the device range; `dst` is a valid host buffer.
        check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    /// Copies `src` from the host to device memory at `dst`.
    ///
    /// # Safety
    /// `dst..dst + src.len()` must lie in one live allocation on `device`.
    pub unsafe fn copy_from_host(&self, device: i32, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: the caller vouches for the device range; `src` is a valid host buffer.
        check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) })
    }

    /// Copies `len` bytes between two device ranges.
    ///
    /// # Safety
    /// Both ranges must lie in live allocations the current context of `device` can reach.
    pub unsafe fn copy_device(&self, device: i32, dst: u64, src: u64, len: u64) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: the caller vouches for both ranges.
        check("cuMemcpyDtoD", unsafe { sys::cuMemcpyDtoD_v2(dst, src, len as usize) })
    }

    /// `len` bytes of device memory on `device`, freed when dropped.
    pub fn alloc(&'static self, device: i32, len: u64) -> Result<DeviceBuffer, CudaError> {
        self.bind(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer; a zero size is an error from the driver, so ask for one byte.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1) as usize) })?;
        Ok(DeviceBuffer(Span { cuda: self, device, ptr, size: len }))
    }
}

/// The context a thread had current, put back when dropped ([`Cuda::keep_context`]). Tied to
/// its thread: contexts are current per thread.
pub struct ContextGuard {
    saved: Option<sys::CUcontext>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(ctx) = self.saved {
            // SAFETY: a context that was current on this thread when the guard was made (or
            // null, which leaves none current).
            let _ = unsafe { sys::cuCtxSetCurrent(ctx) };
        }
    }
}

/// An allocation's IPC handle and where a pointer lies in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// The allocation's handle.
    pub handle: [u8; IPC_HANDLE_BYTES],
    /// The pointer's offset from the allocation's start.
    pub offset: u64,
    /// The allocation's size.
    pub allocation_size: u64,
}

fn check_range(offset: u64, len: u64, size: u64) -> Result<(), CudaError> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(CudaError::OutOfBounds { offset, len, size });
    }
    Ok(())
}

/// A range of device memory this process reaches (what [`IpcMapping`] and [`DeviceBuffer`]
/// are): its bounds-checked copies, and running the call that gives it back.
struct Span {
    cuda: &'static Cuda,
    device: i32,
    ptr: u64,
    size: u64,
}

impl Span {
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        check_range(offset, dst.len() as u64, self.size)?;
        // SAFETY: in bounds of the live allocation (checked above).
        unsafe { self.cuda.copy_to_host(self.device, self.ptr + offset, dst) }
    }

    fn write(&self, offset: u64, src: &[u8]) -> Result<(), CudaError> {
        check_range(offset, src.len() as u64, self.size)?;
        // SAFETY: in bounds of the live allocation (checked above).
        unsafe { self.cuda.copy_from_host(self.device, self.ptr + offset, src) }
    }

    /// Calls `release` (the driver call that gives the memory back) in the device's context.
    /// Dropped on whatever thread let go of it last (a model's): that thread's context is left
    /// as it was.
    fn release(&self, release: impl FnOnce(u64) -> sys::CUresult) {
        let _keep = self.cuda.keep_context();
        if self.cuda.bind(self.device).is_ok() {
            // Nothing to do about a failure while the memory is being let go of.
            let _ = release(self.ptr);
        }
    }
}

/// Another process's device allocation, opened in this one; closed when dropped.
pub struct IpcMapping(Span);

impl std::fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMapping").field("device", &self.0.device).field("size", &self.0.size).finish()
    }
}

impl IpcMapping {
    /// The device pointer of the allocation's start, in this process.
    pub fn device_ptr(&self) -> u64 {
        self.0.ptr
    }

    /// The allocation's size.
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// The device it lives on.
    pub fn device(&self) -> i32 {
        self.0.device
    }

    /// Copies `dst.len()` bytes from `offset` to the host, bounds-checked.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        self.0.read(offset, dst)
    }

    /// Copies `src` from the host to `offset`, bounds-checked.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), CudaError> {
        self.0.write(offset, src)
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: a pointer cuIpcOpenMemHandle returned, closed once.
        self.0.release(|ptr| unsafe { sys::cuIpcCloseMemHandle(ptr) });
    }
}

/// Device memory of this process, freed when dropped.
pub struct DeviceBuffer(Span);

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer").field("device", &self.0.device).field("len", &self.0.size).finish()
    }
}

impl DeviceBuffer {
    /// Its device pointer.
    pub fn device_ptr(&self) -> u64 {
        self.0.ptr
    }

    /// Its length.
    pub fn len(&self) -> u64 {
        self.0.size
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> i32 {
        self.0.device
    }

    /// Copies `src` to `offset`, bounds-checked.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), CudaError> {
        self.0.write(offset, src)
    }

    /// Copies `dst.len()` bytes from `offset`, bounds-checked.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        self.0.read(offset, dst)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: a pointer cuMemAlloc returned, freed once.
        self.0.release(|ptr| unsafe { sys::cuMemFree_v2(ptr) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 64, 64).is_ok());
        assert!(check_range(64, 0, 64).is_ok());
        assert_eq!(check_range(1, 64, 64), Err(CudaError::OutOfBounds { offset: 1, len: 64, size: 64 }));
        assert!(check_range(u64::MAX, 2, 64).is_err());
        assert_eq!(
            CudaError::OutOfBounds { offset: 8, len: 64, size: 64 }.to_string(),
            "bytes 8..72 are outside the 64 bytes of the CUDA allocation"
        );
    }

    /// Without a GPU (CI), the driver is unavailable with a reason, the same one every time;
    /// with one, devices are listed and memory round-trips through an IPC handle's export.
    #[test]
    fn the_driver_is_either_unavailable_with_a_reason_or_works() {
        match cuda() {
            Err(CudaError::Unavailable(why)) => {
                assert!(!why.is_empty());
                assert_eq!(unavailable_reason(), Some(why));
            }
            Err(other) => panic!("only Unavailable comes out of cuda(): {other}"),
            Ok(cuda) => {
                assert!(cuda.device_count() >= 1);
                assert!(!cuda.device_name(0).expect("name").is_empty());
                assert!(matches!(cuda.device_name(cuda.device_count() as i32), Err(CudaError::NoSuchDevice { .. })));
                let buf = cuda.alloc(0, 4096).expect("alloc");
                buf.write(100, b"tritium").expect("write");
                let mut back = [0u8; 7];
                buf.read(100, &mut back).expect("read");
                assert_eq!(&back, b"tritium");
                assert_eq!(cuda.pointer_device(buf.device_ptr() + 100), Ok(0));
                let exported = cuda.export_ipc(0, buf.device_ptr() + 100).expect("export");
                assert_eq!(exported.offset, 100);
                assert!(exported.allocation_size >= 4096);
                assert!(buf.write(4090, b"tritium").is_err());
                // A process cannot open its own handle; that it fails cleanly is the point.
                assert!(cuda.open_ipc(0, &exported.handle).is_err());
                assert_eq!(cuda.open_ipc(0, &[0u8; 3]).err(), Some(CudaError::BadHandle(3)));
            }
        }
    }
}
