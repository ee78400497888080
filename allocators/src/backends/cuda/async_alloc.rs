//! [`CudaAsyncAllocator`]: stream-ordered `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` from a
//! CUDA memory pool, CUDA's own recommendation and the baseline users compare caching
//! allocators with.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::driver::check;
use super::{CudaDevice, CudaError};
use crate::observe::{self, Layer};
use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, MemorySpace, StatsCounters,
    StreamError, StreamId, StreamOrdered, dangling,
};

/// Stream-ordered device memory from a CUDA memory pool of its own.
///
/// The pool keeps up to `release_threshold` bytes of freed memory cached (CUDA's
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`) instead of returning it to the driver at each
/// synchronisation. Blocks are 256-byte aligned.
///
/// A block is allocated (`cuMemAllocFromPoolAsync`) and freed (`cuMemFreeAsync`) in the order of
/// the stream named in [`AllocationAttributes::stream`] (the legacy stream by default, with
/// which the host's synchronous copies and every blocking stream order themselves), without
/// waiting: work on that stream may use it, work on another stream first waits for it (an
/// event). A use on another stream recorded with [`StreamOrdered::record_stream`] makes the free
/// wait for that stream's work on the device (`cuStreamWaitEvent`), so the pool reuses the block
/// only after it. Its stats report the pool's own reserved bytes (memory held, in use or
/// cached), and [`release_cached`](Allocator::release_cached) trims the pool to what is in use.
pub struct CudaAsyncAllocator {
    device: Arc<CudaDevice>,
    pool: sys::CUmemoryPool,
    name: String,
    counters: StatsCounters,
    /// Live blocks: address -> (stream, streams of recorded uses).
    live: Mutex<HashMap<usize, (StreamId, Vec<StreamId>)>>,
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
        if let Err(e) = check("cuMemPoolSetAttribute", ordinal, r) {
            // SAFETY: the pool was created above and holds no allocation.
            unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(e);
        }
        Ok(Self {
            name: format!("cuda_async:{ordinal}"),
            device,
            pool,
            counters: StatsCounters::new(None),
            live: Mutex::new(HashMap::new()),
        })
    }
}

// SAFETY: blocks come from `cuMemAllocFromPoolAsync` on the caller's stream (256-byte aligned
// device memory, valid in that stream's order until `cuMemFreeAsync` on the same stream, which
// first waits for the recorded uses of other streams); larger alignments are refused.
unsafe impl Allocator for CudaAsyncAllocator {
    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Device { ordinal: self.device.ordinal() }
    }

    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
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
        let stream = attrs.stream.raw() as sys::CUstream;
        // SAFETY: valid place; the pool is ours and alive; the stream is the caller's.
        let r = unsafe { sys::cuMemAllocFromPoolAsync(&mut p, layout.size(), self.pool, stream) };
        check("cuMemAllocFromPoolAsync", ordinal, r).map_err(|e| fail(Some(e)))?;
        let ptr = NonNull::new(p as *mut u8).ok_or_else(|| fail(None))?;
        self.live.lock().insert(p as usize, (attrs.stream, Vec::new()));
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
        let (stream, uses) = self.live.lock().remove(&(ptr.as_ptr() as usize)).unwrap_or_default();
        let _ = self.device.bind();
        let own = stream.raw() as sys::CUstream;
        for used_on in uses {
            // The pool reuses the block in `own`'s order: make that order wait for the work
            // queued on the other stream so far.
            if let Err(e) = self.wait_for(own, used_on) {
                // Nothing can order the free after that work: keep the block (lost, not
                // corrupted).
                tracing::error!(allocator = %self.name, stream = ?used_on, %e, "cuda: block kept, its free cannot be ordered");
                return;
            }
        }
        // SAFETY: the caller promises `ptr` came from `allocate_raw` here; freed in the order of
        // the stream it was allocated on, after the recorded uses.
        unsafe { sys::cuMemFreeAsync(ptr.as_ptr() as sys::CUdeviceptr, own) };
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

    /// Waits for the device's queued work (frees included), then trims the pool to what is in
    /// use (`cuMemPoolTrimTo(pool, 0)`: PyTorch's `empty_cache` on its `cudaMallocAsync`
    /// backend); returns the bytes the pool gave back to the driver.
    fn release_cached(&self) -> usize {
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
        let Some(before) = self.pool_bytes(attr) else { return 0 };
        // SAFETY: the pool is ours and alive (`pool_bytes` made the context current); trimming
        // keeps every block still allocated.
        let trimmed = unsafe {
            sys::cuCtxSynchronize() == sys::cudaError_enum::CUDA_SUCCESS
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
    /// Makes `stream` wait for the work queued on `other` so far (an event, released at once).
    fn wait_for(&self, stream: sys::CUstream, other: StreamId) -> Result<(), CudaError> {
        let ordinal = self.device.ordinal();
        let mut event: sys::CUevent = core::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a valid place; the context is current (the caller bound it).
        check("cuEventCreate", ordinal, unsafe { sys::cuEventCreate(&mut event, flags) })?;
        // SAFETY: the event was created above; both streams belong to this device; an event may
        // be destroyed once the wait on it is queued.
        unsafe {
            let r = check("cuEventRecord", ordinal, sys::cuEventRecord(event, other.raw() as sys::CUstream))
                .and_then(|()| check("cuStreamWaitEvent", ordinal, sys::cuStreamWaitEvent(stream, event, 0)));
            sys::cuEventDestroy_v2(event);
            r
        }
    }

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
        // SAFETY: the pool is ours; the device's queued frees finish before the pool goes.
        unsafe {
            sys::cuCtxSynchronize();
            sys::cuMemPoolDestroy(self.pool);
        }
    }
}

impl StreamOrdered for CudaAsyncAllocator {
    /// Records that work on `stream` uses the block: its free waits for that work on the
    /// device (no polling: the pool orders reuse itself).
    fn record_stream(&self, ptr: NonNull<u8>, stream: StreamId) -> Result<(), StreamError> {
        let address = ptr.as_ptr() as usize;
        let mut live = self.live.lock();
        let Some((own, uses)) = live.get_mut(&address) else {
            return Err(StreamError::NotLive { allocator: self.name.clone(), address });
        };
        if *own != stream && !uses.contains(&stream) {
            uses.push(stream);
        }
        Ok(())
    }

    fn block_stream(&self, ptr: NonNull<u8>) -> Option<StreamId> {
        self.live.lock().get(&(ptr.as_ptr() as usize)).map(|(s, _)| *s)
    }

    /// None: frees are queued on the device, ordered after recorded uses.
    fn pending_frees(&self) -> usize {
        0
    }

    fn process_events(&self) -> usize {
        0
    }

    fn synchronize(&self) -> usize {
        0
    }
}

impl fmt::Debug for CudaAsyncAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaAsyncAllocator").field("name", &self.name).finish()
    }
}
