//! [`CudaHostAllocator`]: page-locked host memory (`cuMemHostAlloc`) for DMA.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys;

use super::CudaDevice;
use crate::observe::{self, Layer};
use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, MemorySpace, StatsCounters, dangling,
};

/// `cuMemHostAlloc` returns page-aligned memory.
const PINNED_ALIGNMENT: usize = 4096;

/// Pinned (page-locked) host memory, registered with the driver so devices reach it by DMA:
/// TensorFlow's `gpu_host_bfc` source, selected by `AllocatorAttributes { on_host: true,
/// gpu_compatible: true }` through the registry. The host may read and write it.
pub struct CudaHostAllocator {
    device: Arc<CudaDevice>,
    name: String,
    counters: StatsCounters,
}

impl CudaHostAllocator {
    /// Pinned memory through `device`'s context, named `cuda_host`.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self { device, name: "cuda_host".to_owned(), counters: StatsCounters::new(None) }
    }
}

// SAFETY: blocks come from `cuMemHostAlloc` (page-aligned, host-accessible, valid until
// `cuMemFreeHost`); alignments above a page are refused; the counters keep peak >= in use.
unsafe impl Allocator for CudaHostAllocator {
    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::HostPinned
    }

    fn allocate_raw(&self, layout: Layout, _attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        if layout.align() > PINNED_ALIGNMENT {
            return Err(AllocError::new(AllocErrorKind::UnsupportedLayout, layout, &self.name)
                .with_max_alignment(PINNED_ALIGNMENT as u64));
        }
        let oom = || {
            self.counters.record_oom();
            let err = AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.name);
            observe::refused(&self.name, &err, None);
            err
        };
        if self.device.bind().is_err() {
            return Err(oom());
        }
        let mut p: *mut core::ffi::c_void = core::ptr::null_mut();
        // SAFETY: `p` is a valid place; the context is current; flags 0 = plain pinned memory.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, layout.size(), 0) };
        let Some(ptr) = (r == sys::cudaError_enum::CUDA_SUCCESS).then_some(p).and_then(|p| NonNull::new(p.cast()))
        else {
            return Err(oom());
        };
        self.counters.record_alloc(layout.size());
        observe::allocated(Layer::Leaf, &self.name, ptr.as_ptr() as usize, layout.size(), layout.size());
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        observe::freed(Layer::Leaf, &self.name, ptr.as_ptr() as usize, layout.size());
        self.counters.record_free(layout.size());
        let _ = self.device.bind();
        // SAFETY: the caller promises `ptr` came from `allocate_raw` here (`cuMemHostAlloc`).
        unsafe { sys::cuMemFreeHost(ptr.as_ptr().cast()) };
    }

    fn stats(&self) -> Option<AllocatorStats> {
        Some(self.counters.stats())
    }

    fn clear_stats(&self) -> bool {
        self.counters.clear();
        true
    }
}

impl fmt::Debug for CudaHostAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaHostAllocator").field("device", &self.device).finish()
    }
}
