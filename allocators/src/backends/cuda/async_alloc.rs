//! [`CudaAsyncAllocator`]: stream-ordered `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` from a
//! CUDA memory pool, CUDA's own recommendation and the baseline users compare caching
//! allocators with.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check;
use super::{CudaDevice, CudaError};
use crate::observe::{self, Layer};
use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, MemorySpace, StatsCounters, dangling,
};

/// Stream-ordered device memory from a CUDA memory pool of its own, on a stream of its own.
///
/// The pool keeps up to `release_threshold` bytes of freed memory cached (CUDA's
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`) instead of returning it to the driver at each
/// synchronisation. Blocks are 256-byte aligned.
///
/// Each allocation waits for its stream (`cuStreamSynchronize`), so the block it returns is
/// ready for any stream and for copies from the host, as the [`Allocator`] contract requires,
/// at the price of a synchronisation per operation (`benches/gpu_replay.rs`). Its stats report the pool's own reserved bytes (memory held, in use or
/// cached), and [`release_cached`](Allocator::release_cached) trims the pool to what is in use.
pub struct CudaAsyncAllocator {
    device: Arc<CudaDevice>,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
    name: String,
    counters: StatsCounters,
}

// SAFETY: the pool and stream handles may be used from any thread with the device's context
// current (every method binds it first).
unsafe impl Send for CudaAsyncAllocator {}
// SAFETY: as above; the driver synchronises its own pool and stream state.
unsafe impl Sync for CudaAsyncAllocator {}

impl CudaAsyncAllocator {
    /// A pool on `device` keeping up to `release_threshold` freed bytes, named `cuda_async:N`.
    ///
    /// # Errors
    /// The driver's error (e.g. a device without memory pool support).
    pub fn new(device: Arc<CudaDevice>, release_threshold: u64) -> Result<Self, CudaError> {
        let ordinal = device.ordinal();
        device.bind()?;
        // SAFETY: all-zero is valid for the C struct; the fields that matter are set below.
        let mut props: sys::CUmemPoolProps = unsafe { core::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = device.raw();
        let mut pool: sys::CUmemoryPool = core::ptr::null_mut();
        // SAFETY: valid places and properties; the context is current.
        check("cuMemPoolCreate", ordinal, unsafe { sys::cuMemPoolCreate(&mut pool, &props) })?;
        // SAFETY: the pool was created above; the release threshold is a u64 attribute.
        let r = unsafe {
            set_pool_u64(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, release_threshold)
        };
        let mut stream: sys::CUstream = core::ptr::null_mut();
        let made = check("cuMemPoolSetAttribute", ordinal, r).and_then(|()| {
            // SAFETY: `stream` is a valid place; flags 0 = default stream semantics.
            check("cuStreamCreate", ordinal, unsafe { sys::cuStreamCreate(&mut stream, 0) })
        });
        if let Err(e) = made {
            // SAFETY: the pool was created above and holds no allocation.
            unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(e);
        }
        Ok(Self { name: format!("cuda_async:{ordinal}"), device, pool, stream, counters: StatsCounters::new(None) })
    }
}

// SAFETY: blocks come from `cuMemAllocFromPoolAsync` on our stream (256-byte aligned device
// memory, valid in stream order until `cuMemFreeAsync`); the stream is synchronised before a
// block is returned, so it is valid for any later use; larger alignments are refused.
unsafe impl Allocator for CudaAsyncAllocator {
    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Device { ordinal: self.device.ordinal() }
    }

    fn allocate_raw(&self, layout: Layout, _attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        if layout.align() > 256 {
            return Err(AllocError::new(AllocErrorKind::UnsupportedLayout, layout, &self.name).with_max_alignment(256));
        }
        let fail = |why: Option<CudaError>| {
            self.counters.record_oom();
            if let Some(e) = why {
                tracing::warn!(allocator = %self.name, size = layout.size(), %e, "cuda: allocation failed");
            }
            let in_use = self.counters.snapshot().bytes_in_use;
            let err = AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.name).with_usage(in_use, None);
            let err = match self.device.memory_info() {
                Ok((free, total)) => err.with_device_memory(self.device.ordinal(), free, total),
                Err(_) => err,
            };
            observe::refused(&self.name, &err, None);
            err
        };
        self.device.bind().map_err(|e| fail(Some(e)))?;
        let mut p: sys::CUdeviceptr = 0;
        let ordinal = self.device.ordinal();
        // SAFETY: valid place; the pool and stream are ours and alive.
        let r = unsafe { sys::cuMemAllocFromPoolAsync(&mut p, layout.size(), self.pool, self.stream) };
        check("cuMemAllocFromPoolAsync", ordinal, r).map_err(|e| fail(Some(e)))?;
        // SAFETY: the stream is ours and alive.
        let r = unsafe { sys::cuStreamSynchronize(self.stream) };
        check("cuStreamSynchronize", ordinal, r).map_err(|e| fail(Some(e)))?;
        let ptr = NonNull::new(p as *mut u8).ok_or_else(|| fail(None))?;
        self.counters.record_alloc(layout.size());
        observe::allocated(Layer::Leaf, &self.name, p as usize, layout.size(), layout.size());
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        observe::freed(Layer::Leaf, &self.name, ptr.as_ptr() as usize, layout.size());
        self.counters.record_free(layout.size());
        let _ = self.device.bind();
        // SAFETY: the caller promises `ptr` came from `allocate_raw` here; freed in stream order.
        unsafe { sys::cuMemFreeAsync(ptr.as_ptr() as sys::CUdeviceptr, self.stream) };
    }

    /// The counters, with `bytes_reserved` and `peak_bytes_reserved` from the pool itself
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and `_HIGH`: device memory the pool holds, in use
    /// or cached under the release threshold).
    fn stats(&self) -> Option<AllocatorStats> {
        let mut s = self.counters.stats();
        let current = self.pool_bytes(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let high = self.pool_bytes(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
        if let (Some(current), Some(high)) = (current, high) {
            s.bytes_reserved = current;
            s.peak_bytes_reserved = high.max(current);
        }
        Some(s)
    }

    /// Waits for the frees queued on the allocator's stream, then trims the pool to what is in
    /// use (`cuMemPoolTrimTo(pool, 0)`: PyTorch's `empty_cache` on its `cudaMallocAsync`
    /// backend); returns the bytes the pool gave back to the driver.
    fn release_cached(&self) -> usize {
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
        let Some(before) = self.pool_bytes(attr) else { return 0 };
        // SAFETY: the stream and pool are ours and alive (`pool_bytes` made the context
        // current); trimming keeps every block still allocated.
        let trimmed = unsafe {
            sys::cuStreamSynchronize(self.stream) == sys::cudaError_enum::CUDA_SUCCESS
                && sys::cuMemPoolTrimTo(self.pool, 0) == sys::cudaError_enum::CUDA_SUCCESS
        };
        if !trimmed {
            return 0;
        }
        self.pool_bytes(attr).map_or(0, |after| before.saturating_sub(after) as usize)
    }

    /// Clears the counters and restarts the pool's reserved high-water mark from what it holds.
    fn clear_stats(&self) -> bool {
        self.counters.clear();
        if self.device.bind().is_ok() {
            // SAFETY: the pool is ours and alive; the high-water mark is a u64 attribute, and 0
            // (the only value allowed) resets it.
            unsafe { set_pool_u64(self.pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0) };
        }
        true
    }
}

impl CudaAsyncAllocator {
    /// A byte-valued attribute of the pool, `None` if the driver refuses it.
    fn pool_bytes(&self, attr: sys::CUmemPool_attribute) -> Option<u64> {
        self.device.bind().ok()?;
        let mut v = 0u64;
        // SAFETY: the pool is ours and alive; `v` is a valid place for the u64 that the
        // reserved-memory attributes (the only ones asked for) write.
        let r = unsafe { sys::cuMemPoolGetAttribute(self.pool, attr, (&mut v as *mut u64).cast()) };
        (r == sys::cudaError_enum::CUDA_SUCCESS).then_some(v)
    }
}

/// Sets a u64-valued attribute of `pool` (`cuMemPoolSetAttribute` takes it through a pointer).
///
/// # Safety
/// `pool` must be a live memory pool and `attr` one of its u64-valued attributes.
unsafe fn set_pool_u64(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute, value: u64) -> sys::CUresult {
    let mut v = value;
    // SAFETY: the caller's promise; `v` lives across the call.
    unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut v as *mut u64).cast()) }
}

impl Drop for CudaAsyncAllocator {
    fn drop(&mut self) {
        let _ = self.device.bind();
        // SAFETY: the stream and pool are ours; pending frees finish before the pool goes.
        unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamDestroy_v2(self.stream);
            sys::cuMemPoolDestroy(self.pool);
        }
    }
}

impl fmt::Debug for CudaAsyncAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaAsyncAllocator").field("name", &self.name).finish()
    }
}
