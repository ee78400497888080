//! Device memory for the BFC: [`CudaSubAllocator`] (regions from `cuMemAlloc`) and
//! [`CudaMemory`] (address space reserved with `cuMemAddressReserve`, backed on demand with
//! `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`).

use core::fmt;
use core::ptr::NonNull;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::{CudaDevice, CudaError};
use crate::{ExpandableMemory, MemorySpace, SubAllocator};

/// `cuMemAlloc` hands out memory aligned to at least this.
const CU_MEM_ALLOC_ALIGNMENT: usize = 256;

fn io_error(e: CudaError) -> io::Error {
    if e.is_out_of_memory() { io::Error::new(io::ErrorKind::OutOfMemory, e) } else { io::Error::other(e) }
}

/// The device's memory as an [`ExpandableMemory`]: what a [`BfcAllocator`](crate::BfcAllocator)
/// built on a [`CudaSubAllocator`] grows in (PyTorch's expandable segments). Each commit is one
/// physical allocation mapped at the end of the reservation; a decommit unmaps and releases
/// exactly one commit (a GPU mapping cannot be split), so [`decommits_partially`] is false.
///
/// [`decommits_partially`]: ExpandableMemory::decommits_partially
pub struct CudaMemory {
    device: Arc<CudaDevice>,
    granule: usize,
    name: String,
    /// Committed ranges: start address -> (physical handle, bytes).
    mapped: Mutex<HashMap<usize, (sys::CUmemGenericAllocationHandle, usize)>>,
}

impl CudaMemory {
    /// The virtual memory API of `device`, at its recommended allocation granularity.
    ///
    /// # Errors
    /// The driver's error when the device does not support virtual memory management.
    pub fn new(device: Arc<CudaDevice>) -> Result<CudaMemory, CudaError> {
        device.bind()?;
        let prop = Self::prop(&device);
        let mut granule = 0usize;
        // SAFETY: `granule` and `prop` are valid; the context is current.
        super::driver::check("cuMemGetAllocationGranularity", device.ordinal(), unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granule,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        let name = format!("cuda:{}", device.ordinal());
        Ok(CudaMemory { device, granule: granule.max(1), name, mapped: Mutex::new(HashMap::new()) })
    }

    fn prop(device: &CudaDevice) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is valid (INVALID/NONE enum values, null
        // pointers); the fields that matter are set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { core::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device.raw();
        prop
    }
}

// SAFETY: `reserve` returns a `cuMemAddressReserve` range aligned to the granule; `commit` maps
// physical memory with read/write access for the device over exactly the range asked, which
// stays valid (for the device) until `decommit` unmaps it; a reservation is freed only by
// `release`.
unsafe impl ExpandableMemory for CudaMemory {
    fn granule(&self) -> usize {
        self.granule
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        self.device.bind().map_err(io_error)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid place; a zero address hint lets the driver choose.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, self.granule, 0, 0) };
        super::driver::check("cuMemAddressReserve", self.device.ordinal(), r).map_err(io_error)?;
        NonNull::new(ptr as *mut u8).ok_or_else(|| io::Error::other("cuMemAddressReserve returned 0"))
    }

    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()> {
        let ordinal = self.device.ordinal();
        self.device.bind().map_err(io_error)?;
        let prop = Self::prop(&self.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` and `prop` are valid; `bytes` is a multiple of the granule.
        let r = unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) };
        super::driver::check("cuMemCreate", ordinal, r).map_err(io_error)?;
        let at = ptr.as_ptr() as sys::CUdeviceptr;
        // SAFETY: the caller promises `ptr..ptr + bytes` is reserved here and not mapped.
        let mapped = super::driver::check("cuMemMap", ordinal, unsafe { sys::cuMemMap(at, bytes, 0, handle, 0) });
        if let Err(e) = mapped {
            // SAFETY: `handle` was created above and is mapped nowhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(io_error(e));
        }
        // SAFETY: all-zero is a valid access descriptor; the fields are set below.
        let mut access: sys::CUmemAccessDesc = unsafe { core::mem::zeroed() };
        access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = self.device.raw();
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the range was mapped just above; one descriptor is passed.
        let r = unsafe { sys::cuMemSetAccess(at, bytes, &access, 1) };
        if let Err(e) = super::driver::check("cuMemSetAccess", ordinal, r) {
            // SAFETY: the range was mapped above with `handle`; nothing uses it yet.
            unsafe {
                sys::cuMemUnmap(at, bytes);
                sys::cuMemRelease(handle);
            }
            return Err(io_error(e));
        }
        self.mapped.lock().insert(ptr.as_ptr() as usize, (handle, bytes));
        Ok(())
    }

    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize) {
        let Some((handle, size)) = self.mapped.lock().remove(&(ptr.as_ptr() as usize)) else {
            tracing::error!(memory = %self.name, at = ptr.as_ptr() as usize, bytes, "cuda: decommit of a range not committed");
            return;
        };
        debug_assert_eq!(size, bytes, "a GPU mapping is unmapped whole");
        let _ = self.device.bind();
        // SAFETY: the range was mapped by `commit` with `handle` and the caller promises nothing
        // uses it; unmapping then releasing frees the physical memory.
        unsafe {
            sys::cuMemUnmap(ptr.as_ptr() as sys::CUdeviceptr, size);
            sys::cuMemRelease(handle);
        }
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        let start = ptr.as_ptr() as usize;
        let inside: Vec<(usize, (sys::CUmemGenericAllocationHandle, usize))> = {
            let mut mapped = self.mapped.lock();
            let keys: Vec<usize> = mapped.keys().copied().filter(|&a| a >= start && a < start + bytes).collect();
            keys.into_iter().filter_map(|k| mapped.remove(&k).map(|v| (k, v))).collect()
        };
        let _ = self.device.bind();
        for (at, (handle, size)) in inside {
            // SAFETY: each range was mapped by `commit` inside this reservation; the caller
            // promises nothing uses the reservation any more.
            unsafe {
                sys::cuMemUnmap(at as sys::CUdeviceptr, size);
                sys::cuMemRelease(handle);
            }
        }
        // SAFETY: `ptr`/`bytes` is a reservation made by `reserve`, now with nothing mapped.
        unsafe { sys::cuMemAddressFree(start as sys::CUdeviceptr, bytes) };
    }

    fn decommits_partially(&self) -> bool {
        false
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Device { ordinal: self.device.ordinal() }
    }
}

impl fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaMemory").field("device", &self.name).field("granule", &self.granule).finish()
    }
}

/// Where a [`BfcAllocator`](crate::BfcAllocator) takes device memory from: regions from
/// `cuMemAlloc` and, when the device supports virtual memory management, [`CudaMemory`] for
/// expandable growth (the BFC's default then).
///
/// ```no_run
/// use std::sync::Arc;
/// use tensormem_allocators::cuda::{CudaDevice, CudaSubAllocator};
/// use tensormem_allocators::{Allocator, BfcAllocator, MemorySpace};
///
/// let device = CudaDevice::open(0)?;
/// let bfc = BfcAllocator::builder()
///     .name("cuda:0")
///     .memory_limit(8 << 30)
///     .sub_allocator(Arc::new(CudaSubAllocator::new(device)))
///     .build()?;
/// assert_eq!(bfc.memory_space(), MemorySpace::Device { ordinal: 0 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CudaSubAllocator {
    device: Arc<CudaDevice>,
    expandable: Option<CudaMemory>,
}

impl CudaSubAllocator {
    /// Device memory of `device`, expandable when the device supports virtual memory
    /// management.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        let expandable = CudaMemory::new(device.clone()).ok();
        Self { device, expandable }
    }

    /// Plain `cuMemAlloc` regions only (TensorFlow's GPU sub-allocator).
    pub fn regions_only(device: Arc<CudaDevice>) -> Self {
        Self { device, expandable: None }
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

// SAFETY: regions come from `cuMemAlloc` (at least 256-byte aligned, valid on the device for the
// size asked until `cuMemFree`); alignments above 256 are refused (`None`).
unsafe impl SubAllocator for CudaSubAllocator {
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)> {
        if alignment > CU_MEM_ALLOC_ALIGNMENT || self.device.bind().is_err() {
            return None;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid place; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, min_bytes) };
        if let Err(e) = super::driver::check("cuMemAlloc", self.device.ordinal(), r) {
            tracing::debug!(%e, bytes = min_bytes, "cuda: region refused");
            return None;
        }
        NonNull::new(ptr as *mut u8).map(|p| (p, min_bytes))
    }

    unsafe fn free_region(&self, ptr: NonNull<u8>, _bytes: usize) {
        let _ = self.device.bind();
        // SAFETY: the caller gives back a region from `alloc_region` (a `cuMemAlloc` pointer).
        unsafe { sys::cuMemFree_v2(ptr.as_ptr() as sys::CUdeviceptr) };
    }

    fn max_alignment(&self) -> usize {
        CU_MEM_ALLOC_ALIGNMENT
    }

    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        self.expandable.as_ref().map(|m| m as &dyn ExpandableMemory)
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Device { ordinal: self.device.ordinal() }
    }

    fn device_memory_info(&self) -> Option<(u64, u64)> {
        self.device.memory_info().ok()
    }
}

impl fmt::Debug for CudaSubAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaSubAllocator")
            .field("device", &self.device)
            .field("expandable", &self.expandable.is_some())
            .finish()
    }
}
