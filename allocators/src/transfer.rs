//! Moving bytes between memory spaces: [`copy_bytes`] and [`fill_zero`], what moves a tensor
//! between host and device and zero-fills fresh device memory.
//!
//! Host to host is a `memcpy`. Anything that touches a [`MemorySpace::Device`] goes through the
//! device's driver (`cuMemcpyHtoD`, `cuMemcpyDtoH`, `cuMemsetD8`; feature `cuda`); without the
//! feature, or without a driver, the copy is refused with an error naming the device.

use crate::MemorySpace;

/// Why bytes could not be copied or filled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// A device space, but this build has no way to reach it.
    #[error("{space} memory cannot be reached: tensormem was built without the `cuda` feature")]
    Unsupported {
        /// The device space.
        space: MemorySpace,
    },
    /// The driver refused (no driver, no such device, a failed copy).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
}

/// Copies `bytes` bytes from `src`, in `src_space`, to `dst`, in `dst_space`.
///
/// # Errors
/// [`TransferError`] when a device side cannot be reached; nothing is written then.
///
/// # Safety
/// `src` must be valid for reads of `bytes` bytes in `src_space` and `dst` valid for writes of
/// `bytes` bytes in `dst_space` (memory of that device, for a device space), and the two ranges
/// must not overlap.
///
/// ```
/// use tensormem_allocators::{MemorySpace, transfer};
///
/// let src = [1u8, 2, 3];
/// let mut dst = [0u8; 3];
/// // SAFETY: both arrays are host memory of 3 bytes, distinct.
/// unsafe { transfer::copy_bytes(dst.as_mut_ptr(), MemorySpace::Host, src.as_ptr(), MemorySpace::Host, 3) }?;
/// assert_eq!(dst, src);
/// # Ok::<(), transfer::TransferError>(())
/// ```
pub unsafe fn copy_bytes(
    dst: *mut u8,
    dst_space: MemorySpace,
    src: *const u8,
    src_space: MemorySpace,
    bytes: usize,
) -> Result<(), TransferError> {
    if bytes == 0 {
        return Ok(());
    }
    if dst_space.is_host_accessible() && src_space.is_host_accessible() {
        // SAFETY: the caller's promise: host-readable `src`, host-writable `dst`, `bytes` each,
        // not overlapping.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, bytes) };
        return Ok(());
    }
    // SAFETY: forwarded.
    unsafe { device::copy(dst, dst_space, src, src_space, bytes) }
}

/// Writes `bytes` zero bytes at `dst`, in `space`.
///
/// # Errors
/// [`TransferError`] when a device cannot be reached; nothing is written then.
///
/// # Safety
/// `dst` must be valid for writes of `bytes` bytes in `space`.
pub unsafe fn fill_zero(dst: *mut u8, space: MemorySpace, bytes: usize) -> Result<(), TransferError> {
    if bytes == 0 {
        return Ok(());
    }
    if space.is_host_accessible() {
        // SAFETY: the caller's promise: host-writable for `bytes`.
        unsafe { dst.write_bytes(0, bytes) };
        return Ok(());
    }
    // SAFETY: forwarded.
    unsafe { device::zero(dst, space, bytes) }
}

#[cfg(feature = "cuda")]
mod device {
    use super::TransferError;
    use crate::MemorySpace;
    use crate::cuda::CudaDevice;

    fn ordinal(space: MemorySpace) -> Option<u32> {
        match space {
            MemorySpace::Device { ordinal } => Some(ordinal),
            _ => None,
        }
    }

    /// # Safety
    /// As [`super::copy_bytes`], with at least one side a device.
    pub(super) unsafe fn copy(
        dst: *mut u8,
        dst_space: MemorySpace,
        src: *const u8,
        src_space: MemorySpace,
        bytes: usize,
    ) -> Result<(), TransferError> {
        match (ordinal(dst_space), ordinal(src_space)) {
            (Some(d), None) => {
                // SAFETY: `src` is host-readable, `dst` memory of device `d` (the caller's promise).
                unsafe { CudaDevice::open(d)?.copy_to_device(dst, src, bytes) }?;
            }
            (None, Some(s)) => {
                // SAFETY: `dst` is host-writable, `src` memory of device `s`.
                unsafe { CudaDevice::open(s)?.copy_to_host(dst, src, bytes) }?;
            }
            (Some(d), Some(s)) => {
                // Through the host, which works between any two devices.
                let mut staging = vec![0u8; bytes];
                // SAFETY: `staging` holds `bytes` host bytes; `src` is memory of device `s`,
                // `dst` of device `d`.
                unsafe {
                    CudaDevice::open(s)?.copy_to_host(staging.as_mut_ptr(), src, bytes)?;
                    CudaDevice::open(d)?.copy_to_device(dst, staging.as_ptr(), bytes)?;
                }
            }
            (None, None) => {
                // SAFETY: both host (the caller checked one side is a device; kept total).
                unsafe { core::ptr::copy_nonoverlapping(src, dst, bytes) };
            }
        }
        Ok(())
    }

    /// # Safety
    /// As [`super::fill_zero`], `space` a device.
    pub(super) unsafe fn zero(dst: *mut u8, space: MemorySpace, bytes: usize) -> Result<(), TransferError> {
        let Some(o) = ordinal(space) else {
            // SAFETY: a host space: host-writable for `bytes` (the caller's promise).
            unsafe { dst.write_bytes(0, bytes) };
            return Ok(());
        };
        // SAFETY: `dst` is memory of device `o`, writable for `bytes`.
        unsafe { CudaDevice::open(o)?.zero(dst, bytes) }?;
        Ok(())
    }
}

#[cfg(not(feature = "cuda"))]
mod device {
    use super::TransferError;
    use crate::MemorySpace;

    /// # Safety
    /// Nothing is dereferenced: a build without CUDA cannot reach a device.
    pub(super) unsafe fn copy(
        _dst: *mut u8,
        dst_space: MemorySpace,
        _src: *const u8,
        src_space: MemorySpace,
        _bytes: usize,
    ) -> Result<(), TransferError> {
        let space = if dst_space.is_host_accessible() { src_space } else { dst_space };
        Err(TransferError::Unsupported { space })
    }

    /// # Safety
    /// Nothing is dereferenced.
    pub(super) unsafe fn zero(_dst: *mut u8, space: MemorySpace, _bytes: usize) -> Result<(), TransferError> {
        Err(TransferError::Unsupported { space })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_copies_and_zero_fills_and_device_spaces_need_a_device() {
        let src: Vec<u8> = (0..100).collect();
        let mut dst = vec![7u8; 100];
        // SAFETY: host buffers of 100 bytes, distinct.
        unsafe { copy_bytes(dst.as_mut_ptr(), MemorySpace::HostPinned, src.as_ptr(), MemorySpace::Host, 100) }.unwrap();
        assert_eq!(dst, src);
        // SAFETY: host buffer of 100 bytes; 10..60 inside it.
        unsafe { fill_zero(dst.as_mut_ptr().add(10), MemorySpace::Host, 50) }.unwrap();
        assert!(dst[10..60].iter().all(|&b| b == 0) && dst[60] == 60 && dst[9] == 9);
        let gpu = MemorySpace::Device { ordinal: 3 };
        // With no device 3 (or no feature), a clear refusal and nothing written.
        if no_device(3) {
            // SAFETY: device 3 does not exist, so the copy is refused before the device side
            // is used; `dst` is host memory of 100 bytes.
            let e =
                unsafe { copy_bytes(dst.as_mut_ptr(), MemorySpace::Host, 0x1000 as *const u8, gpu, 8) }.unwrap_err();
            assert!(e.to_string().contains("cuda"), "{e}");
            assert_eq!(dst[0..8], src[0..8]);
            // SAFETY: as above, refused before anything is written.
            let e = unsafe { fill_zero(0x1000 as *mut u8, gpu, 8) }.unwrap_err();
            assert!(e.to_string().contains("cuda"), "{e}");
        }
    }

    fn no_device(ordinal: u32) -> bool {
        #[cfg(feature = "cuda")]
        return crate::cuda::device_count() <= ordinal;
        #[cfg(not(feature = "cuda"))]
        return {
            let _ = ordinal;
            true
        };
    }
}
