//! [`TrackingAllocator`]: records every live pointer it hands out (TensorFlow's
//! `TrackingAllocator`), in a sharded map so that threads do not queue on one lock.

use core::alloc::Layout;
use core::fmt;
use core::hash::{BuildHasherDefault, Hasher};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use dashmap::DashMap;

use crate::allocators::{AllocError, AllocationAttributes, Allocator, AllocatorStats, StatsCounters, dangling};

/// What a [`TrackingAllocator`] knows of one live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Chunk {
    /// The size asked for.
    pub requested_size: usize,
    /// The size the inner allocator set aside (its tracked size, or its usable size such as
    /// jemalloc's size class; the requested size when it cannot say).
    pub allocated_size: usize,
    /// Unique within the tracker, increasing from 1 in allocation order.
    pub allocation_id: u64,
}

/// A live allocation and its address, as listed by [`TrackingAllocator::live_chunks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LiveChunk {
    /// The address handed out.
    pub address: usize,
    /// The size asked for.
    pub requested_size: usize,
    /// The size set aside.
    pub allocated_size: usize,
    /// Unique within the tracker, increasing from 1 in allocation order.
    pub allocation_id: u64,
}

/// TensorFlow's `GetSizes()`: byte totals of a [`TrackingAllocator`], in allocated bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrackingSizes {
    /// Bytes ever allocated through the tracker.
    pub total_bytes: u64,
    /// The most bytes live at once (restarted by `clear_stats`).
    pub high_watermark: u64,
    /// Bytes live now.
    pub live_bytes: u64,
}

#[derive(Clone, Copy)]
struct Tracked {
    chunk: Chunk,
    align: usize,
}

/// Hashes pointers with one multiply and a fold: pointers are already unique, and SipHash
/// would cost more than the map operation itself.
#[derive(Default)]
struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
}

/// Wraps an allocator and records, for every live pointer it handed out, a [`Chunk`]
/// (requested size, allocated size, allocation id).
///
/// It answers [`requested_size`](Allocator::requested_size),
/// [`allocated_size`](Allocator::allocated_size) and
/// [`allocation_id`](Allocator::allocation_id) for its pointers, gives TensorFlow's
/// [`sizes`](Self::sizes), and lists its [`live_chunks`](Self::live_chunks), which is what a
/// leak check needs. Its stats count allocated bytes; limits, reserved bytes, retries and OOMs
/// come from the inner allocator.
///
/// Freeing a pointer it never handed out, or freeing one twice, panics with a message naming the
/// allocator and the address, and does not reach the inner allocator.
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{Allocator, AllocatorExt, SystemAllocator, TrackingAllocator};
///
/// let tracker = TrackingAllocator::new(Arc::new(SystemAllocator::new()));
/// let p = tracker.allocate::<u32>(10)?;
/// assert_eq!(tracker.requested_size(p.cast()), Some(40));
/// assert_eq!(tracker.allocation_id(p.cast()), Some(1));
/// assert_eq!(tracker.sizes().live_bytes, 40);
/// // SAFETY: `p` came from `allocate::<u32>(10)` on `tracker`.
/// unsafe { tracker.deallocate(p, 10) };
/// assert!(tracker.live_chunks().is_empty());
/// # Ok::<(), tensormem::AllocError>(())
/// ```
pub struct TrackingAllocator {
    inner: Arc<dyn Allocator>,
    chunks: DashMap<usize, Tracked, BuildHasherDefault<PtrHasher>>,
    next_id: AtomicU64,
    counters: StatsCounters,
}

impl TrackingAllocator {
    /// Tracks every allocation made through it on `inner`.
    pub fn new(inner: Arc<dyn Allocator>) -> Self {
        Self { inner, chunks: DashMap::default(), next_id: AtomicU64::new(1), counters: StatsCounters::new(None) }
    }

    /// The allocator it tracks.
    pub fn wrapped(&self) -> &Arc<dyn Allocator> {
        &self.inner
    }

    /// Total, high-watermark and live bytes (TensorFlow's `GetSizes`).
    pub fn sizes(&self) -> TrackingSizes {
        let s = self.counters.snapshot();
        TrackingSizes {
            total_bytes: s.total_bytes_allocated,
            high_watermark: s.peak_bytes_in_use,
            live_bytes: s.bytes_in_use,
        }
    }

    /// Every live allocation, oldest first.
    pub fn live_chunks(&self) -> Vec<LiveChunk> {
        let mut live: Vec<LiveChunk> = self
            .chunks
            .iter()
            .map(|e| {
                let c = e.value().chunk;
                LiveChunk {
                    address: *e.key(),
                    requested_size: c.requested_size,
                    allocated_size: c.allocated_size,
                    allocation_id: c.allocation_id,
                }
            })
            .collect();
        live.sort_unstable_by_key(|c| c.allocation_id);
        live
    }

    /// The chunk recorded for `ptr`, if it is live here.
    pub fn chunk(&self, ptr: NonNull<u8>) -> Option<Chunk> {
        self.chunks.get(&(ptr.as_ptr() as usize)).map(|t| t.chunk)
    }

    #[cold]
    #[track_caller]
    fn refuse_free(&self, ptr: NonNull<u8>, layout: Layout, why: &str) -> ! {
        panic!(
            "TrackingAllocator over '{}': refusing to free {ptr:p} ({} bytes, align {}): {why}",
            self.inner.name(),
            layout.size(),
            layout.align()
        )
    }
}

// SAFETY: blocks come from `inner`, which keeps the memory contract; the tracker only records
// them, frees each once through `inner` with the layout it was allocated with, and its
// counters keep peak >= in use.
unsafe impl Allocator for TrackingAllocator {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        let ptr = self.inner.allocate_raw(layout, attrs)?;
        let allocated = if self.inner.tracks_allocation_sizes() {
            self.inner.allocated_size(ptr)
        } else {
            self.inner.allocated_size_slow(ptr)
        };
        let chunk = Chunk {
            requested_size: layout.size(),
            allocated_size: allocated.unwrap_or(0).max(layout.size()),
            allocation_id: self.next_id.fetch_add(1, Relaxed),
        };
        let align = layout.align();
        if self.chunks.insert(ptr.as_ptr() as usize, Tracked { chunk, align }).is_some() {
            panic!(
                "TrackingAllocator over '{}': the inner allocator returned {ptr:p}, which is still live",
                self.inner.name()
            );
        }
        self.counters.record_alloc(chunk.allocated_size);
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let Some((_, tracked)) = self.chunks.remove(&(ptr.as_ptr() as usize)) else {
            self.refuse_free(ptr, layout, "it was never handed out by this allocator, or was already freed");
        };
        let chunk = tracked.chunk;
        if chunk.requested_size != layout.size() {
            self.chunks.insert(ptr.as_ptr() as usize, tracked);
            self.refuse_free(
                ptr,
                layout,
                &format!("it was allocated with {} bytes (allocation #{})", chunk.requested_size, chunk.allocation_id),
            );
        }
        self.counters.record_free(chunk.allocated_size);
        // SAFETY: `ptr` was live in `chunks`, so `inner` allocated it with exactly this size and
        // alignment and it has not been freed; removing it from `chunks` makes this the only free.
        unsafe {
            let original = Layout::from_size_align_unchecked(chunk.requested_size, tracked.align);
            self.inner.deallocate_raw(ptr, original);
        }
    }

    fn tracks_allocation_sizes(&self) -> bool {
        true
    }

    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.chunk(ptr).map(|c| c.requested_size)
    }

    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.chunk(ptr).map(|c| c.allocated_size)
    }

    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        self.chunk(ptr).map(|c| c.allocation_id)
    }

    fn stats(&self) -> Option<AllocatorStats> {
        let mut s = self.counters.stats();
        if let Some(inner) = self.inner.stats() {
            s.bytes_limit = inner.bytes_limit;
            s.bytes_reserved = inner.bytes_reserved;
            s.peak_bytes_reserved = inner.peak_bytes_reserved;
            s.largest_free_block_bytes = inner.largest_free_block_bytes;
            s.fragmentation = inner.fragmentation;
            s.num_alloc_retries = inner.num_alloc_retries;
            s.num_ooms = inner.num_ooms;
        }
        Some(s)
    }

    fn clear_stats(&self) -> bool {
        self.counters.clear();
        self.inner.clear_stats();
        true
    }
}

impl fmt::Debug for TrackingAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingAllocator")
            .field("inner", &self.inner)
            .field("live_chunks", &self.chunks.len())
            .field("sizes", &self.sizes())
            .finish()
    }
}
