//! Device memory for the BFC: [`CudaSubAllocator`] (regions from `cuMemAlloc`) and
//! [`CudaMemory`] (address space reserved with `cuMemAddressReserve`, backed on demand in
//! granule-sized units, each `cuMemCreate` + `cuMemMap`, with `cuMemSetAccess` over each commit).

use core::fmt;
use core::ptr::NonNull;
use std::io;
use std::sync::Arc;

use cudarc::driver::sys;

use super::{CudaDevice, CudaError};
use crate::{ExpandableMemory, MemorySpace, SubAllocator, UnitDriver, UnitMemory};

/// `cuMemAlloc` hands out memory aligned to at least this.
const CU_MEM_ALLOC_ALIGNMENT: usize = 256;

fn io_error(e: CudaError) -> io::Error {
    if e.is_out_of_memory() { io::Error::new(io::ErrorKind::OutOfMemory, e) } else { io::Error::other(e) }
}

/// The device's memory as an [`ExpandableMemory`]: what a [`BfcAllocator`](crate::BfcAllocator)
/// built on a [`CudaSubAllocator`] grows in (PyTorch's expandable segments).
///
/// Each granule (2 MiB on current GPUs) of a commit is a physical allocation of its own, mapped
/// at its place in the reservation ([`UnitMemory`] over the driver's virtual memory calls), so
/// that any granule-aligned part can be given back and free granules can be moved to where a
/// block needs memory by mapping them again elsewhere, without copying: a BFC on the device
/// reserves what it reserves on host pages.
pub struct CudaMemory {
    units: UnitMemory<CudaVm>,
}

/// The driver's virtual memory calls for one device.
struct CudaVm {
    device: Arc<CudaDevice>,
    granule: usize,
    name: String,
}

impl CudaMemory {
    /// The virtual memory API of `device`, at its recommended allocation granularity.
    ///
    /// # Errors
    /// The driver's error when the device does not support virtual memory management.
    pub fn new(device: Arc<CudaDevice>) -> Result<CudaMemory, CudaError> {
        device.bind()?;
        let prop = CudaVm::prop(&device);
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
        Ok(CudaMemory { units: UnitMemory::new(CudaVm { device, granule: granule.max(1), name }) })
    }

    /// How many granules are mapped now.
    pub fn mapped_units(&self) -> usize {
        self.units.mapped_units()
    }
}

impl CudaVm {
    fn prop(device: &CudaDevice) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is valid (INVALID/NONE enum values, null
        // pointers); the fields that matter are set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { core::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device.raw();
        prop
    }

    fn check(&self, call: &'static str, r: sys::CUresult) -> io::Result<()> {
        super::driver::check(call, self.device.ordinal(), r).map_err(io_error)
    }

    /// Logs a failed call that has no caller to return to (unmap, release).
    fn log(&self, call: &'static str, r: sys::CUresult) {
        if let Err(e) = super::driver::check(call, self.device.ordinal(), r) {
            tracing::error!(memory = %self.name, %e, "cuda: {call} failed");
        }
    }
}

// SAFETY: `cuMemAddressReserve` returns a range aligned to the granule asked for, which the
// driver hands out to no one else until `cuMemAddressFree`; `cuMemMap` maps a whole physical
// allocation, and `cuMemSetAccess` makes wholly mapped ranges readable and writable by the
// device, so they are device memory holding the allocation's bytes until `cuMemUnmap`; mapping
// the same allocation at another address shows the same bytes there.
unsafe impl UnitDriver for CudaVm {
    type Handle = sys::CUmemGenericAllocationHandle;

    fn granule(&self) -> usize {
        self.granule
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        self.device.bind().map_err(io_error)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid place; a zero address hint lets the driver choose.
        self.check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, self.granule, 0, 0) })?;
        NonNull::new(ptr as *mut u8).ok_or_else(|| io::Error::other("cuMemAddressReserve returned 0"))
    }

    unsafe fn free_reservation(&self, ptr: NonNull<u8>, bytes: usize) {
        let _ = self.device.bind();
        // SAFETY: the caller gives back a reservation with nothing mapped in it.
        self.log("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr.as_ptr() as sys::CUdeviceptr, bytes) });
    }

    fn create(&self, bytes: usize) -> io::Result<Self::Handle> {
        self.device.bind().map_err(io_error)?;
        let prop = Self::prop(&self.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` and `prop` are valid; `bytes` is the granule.
        self.check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) })?;
        Ok(handle)
    }

    unsafe fn destroy(&self, handle: Self::Handle) {
        let _ = self.device.bind();
        // SAFETY: the caller's handle from `cuMemCreate`, released once; its memory is freed
        // when it is mapped nowhere.
        self.log("cuMemRelease", unsafe { sys::cuMemRelease(handle) });
    }

    unsafe fn map(&self, at: NonNull<u8>, bytes: usize, handle: Self::Handle) -> io::Result<()> {
        self.device.bind().map_err(io_error)?;
        // SAFETY: the caller promises the range is reserved, aligned and unmapped, and `bytes`
        // the handle's size.
        self.check("cuMemMap", unsafe { sys::cuMemMap(at.as_ptr() as sys::CUdeviceptr, bytes, 0, handle, 0) })
    }

    fn quiesce(&self) {
        if self.device.bind().is_ok() {
            // SAFETY: the context is current; waits for the work queued in it.
            self.log("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
        }
    }

    unsafe fn unmap(&self, at: NonNull<u8>, bytes: usize) {
        let _ = self.device.bind();
        // SAFETY: the caller gives back one whole mapping that nothing uses.
        self.log("cuMemUnmap", unsafe { sys::cuMemUnmap(at.as_ptr() as sys::CUdeviceptr, bytes) });
    }

    unsafe fn set_access(&self, at: NonNull<u8>, bytes: usize) -> io::Result<()> {
        self.device.bind().map_err(io_error)?;
        // SAFETY: all-zero is a valid access descriptor; the fields are set below.
        let mut access: sys::CUmemAccessDesc = unsafe { core::mem::zeroed() };
        access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = self.device.raw();
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the caller promises the range is wholly mapped; one descriptor is passed.
        self.check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(at.as_ptr() as sys::CUdeviceptr, bytes, &access, 1) })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Device { ordinal: self.device.ordinal() }
    }
}

impl fmt::Debug for CudaVm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaVm").field("device", &self.name).field("granule", &self.granule).finish()
    }
}

// SAFETY: every call goes to `UnitMemory`, which keeps the contract over the driver's calls
// (see `UnitDriver for CudaVm`).
unsafe impl ExpandableMemory for CudaMemory {
    fn granule(&self) -> usize {
        self.units.granule()
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        self.units.reserve(bytes)
    }

    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()> {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.units.commit(ptr, bytes) }
    }

    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.units.decommit(ptr, bytes) }
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.units.release(ptr, bytes) }
    }

    fn relocates(&self) -> bool {
        true
    }

    unsafe fn relocate(&self, from: NonNull<u8>, to: NonNull<u8>, bytes: usize) -> io::Result<()> {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.units.relocate(from, to, bytes) }
    }

    fn name(&self) -> &str {
        self.units.name()
    }

    fn memory_space(&self) -> MemorySpace {
        self.units.memory_space()
    }
}

impl fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaMemory").field("units", &self.units).finish()
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
