//! The CUDA driver, loaded at run time: [`CudaDevice`] (a device and its primary context) and
//! [`CudaError`].

use core::ffi::CStr;
use core::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult, cudaError_enum};

/// Why a CUDA call or constructor failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library (`libcuda.so`) could be loaded.
    #[error("no CUDA driver: libcuda could not be loaded (is the NVIDIA driver installed?)")]
    NoDriver,
    /// The device ordinal is not one of the machine's devices.
    #[error("no CUDA device cuda:{ordinal} (this machine has {count} device(s))")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// How many devices there are.
        count: u32,
    },
    /// A driver call failed.
    #[error("{call} failed on cuda:{ordinal}: {name} ({code})")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The device.
        ordinal: u32,
        /// The driver's error name (`CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
        /// The driver's error code.
        code: u32,
    },
}

impl CudaError {
    /// Whether the driver said it is out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, CudaError::Driver { code, .. } if *code == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as u32)
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the error with the driver's name for it.
pub(crate) fn check(call: &'static str, ordinal: u32, r: CUresult) -> Result<(), CudaError> {
    if r == cudaError_enum::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const core::ffi::c_char = core::ptr::null();
    // SAFETY: `cuGetErrorName` writes a pointer to a static string (or leaves null) for any code.
    let got = unsafe { sys::cuGetErrorName(r, &mut name) };
    let name = if got == cudaError_enum::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: the driver returned a pointer to a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    };
    Err(CudaError::Driver { call, ordinal, name, code: r as u32 })
}

/// Whether a CUDA driver library can be loaded on this machine (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// How many CUDA devices the driver sees; 0 without a driver.
pub fn device_count() -> u32 {
    if !driver_present() {
        return 0;
    }
    // SAFETY: the driver library is present (checked), so the symbols resolve; `cuInit(0)` may
    // be called any number of times.
    if unsafe { sys::cuInit(0) } != cudaError_enum::CUDA_SUCCESS {
        return 0;
    }
    let mut n = 0;
    // SAFETY: `n` is a valid place for the count; the driver is initialised.
    let r = unsafe { sys::cuDeviceGetCount(&mut n) };
    if r == cudaError_enum::CUDA_SUCCESS { n.max(0) as u32 } else { 0 }
}

/// A CUDA device with its primary context retained (released on drop).
pub struct CudaDevice {
    ordinal: u32,
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (made current per call); the device
// handle is a plain integer.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; nothing in the struct is mutated after construction.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Opens device `ordinal`: loads the driver, initialises it, retains the primary context.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] without a driver, [`CudaError::NoDevice`] for an ordinal out of
    /// range, [`CudaError::Driver`] when a driver call fails. Never panics.
    pub fn open(ordinal: u32) -> Result<Arc<CudaDevice>, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        // SAFETY: the library is present; `cuInit(0)` is idempotent.
        check("cuInit", ordinal, unsafe { sys::cuInit(0) })?;
        let count = device_count();
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let mut device = 0;
        // SAFETY: `device` is a valid place; the ordinal is below the device count.
        check("cuDeviceGet", ordinal, unsafe { sys::cuDeviceGet(&mut device, ordinal as i32) })?;
        let mut context = core::ptr::null_mut();
        // SAFETY: `context` is a valid place; `device` is a device handle from the driver.
        check("cuDevicePrimaryCtxRetain", ordinal, unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) })?;
        Ok(Arc::new(CudaDevice { ordinal, device, context }))
    }

    /// The device's ordinal (the N of `cuda:N`).
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Makes the device's context current on this thread (every call into the driver does this
    /// first; it is cheap when it is current already).
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: `context` is the retained primary context, alive until `self` drops.
        check("cuCtxSetCurrent", self.ordinal, unsafe { sys::cuCtxSetCurrent(self.context) })
    }

    /// The driver's free and total memory of the device, in bytes (`cuMemGetInfo`).
    ///
    /// # Errors
    /// The driver's error.
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid places; the context is current.
        check("cuMemGetInfo", self.ordinal, unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// Copies `bytes` from host memory at `src` to device memory at `dst` (`cuMemcpyHtoD`).
    ///
    /// # Errors
    /// The driver's error.
    ///
    /// # Safety
    /// `src` must be valid for host reads of `bytes`; `dst` must be device memory of this device
    /// valid for `bytes`.
    pub unsafe fn copy_to_device(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the caller's promise.
        check("cuMemcpyHtoD", self.ordinal, unsafe { sys::cuMemcpyHtoD_v2(dst as u64, src.cast(), bytes) })
    }

    /// Copies `bytes` from device memory at `src` to host memory at `dst` (`cuMemcpyDtoH`).
    ///
    /// # Errors
    /// The driver's error.
    ///
    /// # Safety
    /// `dst` must be valid for host writes of `bytes`; `src` must be device memory of this device
    /// valid for `bytes`.
    pub unsafe fn copy_to_host(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the caller's promise.
        check("cuMemcpyDtoH", self.ordinal, unsafe { sys::cuMemcpyDtoH_v2(dst.cast(), src as u64, bytes) })
    }

    /// Writes `bytes` zero bytes at device memory `dst` (`cuMemsetD8`).
    ///
    /// # Errors
    /// The driver's error.
    ///
    /// # Safety
    /// `dst` must be device memory of this device valid for writes of `bytes`.
    pub unsafe fn zero(&self, dst: *mut u8, bytes: usize) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the caller's promise.
        check("cuMemsetD8", self.ordinal, unsafe { sys::cuMemsetD8_v2(dst as u64, 0, bytes) })
    }

    pub(crate) fn raw(&self) -> sys::CUdevice {
        self.device
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // SAFETY: the primary context was retained once in `open`; this releases that reference.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaDevice(cuda:{})", self.ordinal)
    }
}
