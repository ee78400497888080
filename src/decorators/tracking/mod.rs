//! [`TrackingAllocator`]: records every live pointer it hands out (TensorFlow's
//! `TrackingAllocator`), in per-thread tables so that threads neither queue on one lock nor pay a
//! locked instruction per allocation (see [`chunk_table`](crate::chunk_table)).

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::Ordering::Relaxed;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::allocators::observe::{self, Tag};
use crate::allocators::primitives::AtomicU64;
use crate::allocators::{
    AllocError, AllocationAttributes, Allocator, AllocatorStats, LiveChunk, PerThread, StatsCounters, dangling,
};
use chunk_table::{ChunkTable, Record};

mod chunk_table;

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

/// Wraps an allocator and records, for every live pointer it handed out, a [`LiveChunk`]
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
/// Allocation ids are unique within the tracker and start at 1. They increase in allocation
/// order within each thread (a single-threaded program sees 1, 2, 3, ...); threads take ids in
/// blocks of 64, so ids of different threads interleave by block rather than by time. A global
/// counter would cost a locked instruction on every allocation.
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
    /// `inner.tracks_allocation_sizes()`, asked once.
    inner_tracks_sizes: bool,
    /// Live pointers, in the table of the thread that allocated them.
    tables: PerThread<ChunkTable>,
    /// Live pointers allocated by threads whose thread-locals were already destroyed.
    orphans: Mutex<HashMap<usize, Record>>,
    next_id: AtomicU64,
    counters: StatsCounters,
}

impl TrackingAllocator {
    /// Tracks every allocation made through it on `inner`.
    pub fn new(inner: Arc<dyn Allocator>) -> Self {
        Self {
            inner_tracks_sizes: inner.tracks_allocation_sizes(),
            inner,
            tables: PerThread::new(()),
            orphans: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            counters: StatsCounters::new(None),
        }
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
        let mut live = Vec::new();
        let mut push = |address: usize, r: Record| {
            live.push(LiveChunk {
                address,
                requested_size: r.requested,
                allocated_size: r.allocated,
                allocation_id: r.id,
                tag: Tag::from_raw(r.tag),
            })
        };
        self.tables.for_each(|t| t.for_each_live(&mut push));
        for (&address, &r) in self.orphans.lock().iter() {
            push(address, r);
        }
        live.sort_unstable_by_key(|c| c.allocation_id);
        live
    }

    /// The chunk recorded for `ptr`, if it is live here.
    pub fn chunk(&self, ptr: NonNull<u8>) -> Option<LiveChunk> {
        let address = ptr.as_ptr() as usize;
        self.find(address).map(|r| LiveChunk {
            address,
            requested_size: r.requested,
            allocated_size: r.allocated,
            allocation_id: r.id,
            tag: Tag::from_raw(r.tag),
        })
    }

    fn find(&self, key: usize) -> Option<Record> {
        if let Some(Some(r)) = self.tables.with(|t, _| t.get(key)) {
            return Some(r);
        }
        let mut found = None;
        self.tables.for_each(|t| found = found.or_else(|| t.get(key)));
        found.or_else(|| self.orphans.lock().get(&key).copied())
    }

    /// Puts a record back (after a refused free).
    fn record(&self, key: usize, record: Record) {
        // SAFETY: `with` runs the closure on this thread's own table, as its owner; `key` was
        // just taken out of the tables, so it is live in no table.
        let done = self.tables.with(|t, _| unsafe { t.insert_owned(key, record) });
        if done.is_none() {
            self.orphans.lock().insert(key, record);
        }
    }

    /// Removes `key` from whichever table holds it (any thread's, or the orphans).
    fn forget_anywhere(&self, key: usize) -> Option<Record> {
        let mut found = None;
        self.tables.for_each(|t| found = found.or_else(|| t.remove_remote(key)));
        found.or_else(|| self.orphans.lock().remove(&key))
    }

    /// A free the owner thread's table could not settle: a pointer of another thread, one
    /// allocated by a thread without thread-locals, a wrong size, or a bad free.
    #[cold]
    #[inline(never)]
    fn deallocate_slow(&self, ptr: NonNull<u8>, layout: Layout) {
        let key = ptr.as_ptr() as usize;
        let Some(record) = self.forget_anywhere(key) else {
            self.refuse_free(ptr, layout, "it was never handed out by this allocator, or was already freed");
        };
        if record.requested != layout.size() {
            self.record(key, record);
            self.refuse_free(
                ptr,
                layout,
                &format!("it was allocated with {} bytes (allocation #{})", record.requested, record.id),
            );
        }
        self.counters.record_free(record.allocated);
        // SAFETY: `ptr` was live in our tables, so `inner` allocated it with exactly this size and
        // alignment and it has not been freed; removing it from the tables makes this the only free.
        unsafe {
            let original = Layout::from_size_align_unchecked(record.requested, record.align);
            self.inner.deallocate_raw(ptr, original);
        }
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

    fn memory_space(&self) -> crate::allocators::MemorySpace {
        self.inner.memory_space()
    }

    #[inline]
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        let ptr = self.inner.allocate_raw(layout, attrs)?;
        let allocated =
            if self.inner_tracks_sizes { self.inner.allocated_size(ptr) } else { self.inner.allocated_size_slow(ptr) };
        let allocated = allocated.unwrap_or(0).max(layout.size());
        let tag = observe::scope_tag().map_or(0, Tag::to_raw);
        let key = ptr.as_ptr() as usize;
        // SAFETY: `with` runs the closure on this thread's own table, as its owner; `key` was
        // just returned by the inner allocator, so it is live in no table.
        let recorded = self.tables.with(|t, _| unsafe {
            let record = Record {
                requested: layout.size(),
                allocated,
                id: t.next_id(&self.next_id),
                align: layout.align(),
                tag,
            };
            t.insert_owned(key, record);
        });
        if recorded.is_none() {
            let id = self.next_id.fetch_add(1, Relaxed);
            let record = Record { requested: layout.size(), allocated, id, align: layout.align(), tag };
            self.orphans.lock().insert(key, record);
        }
        self.counters.record_alloc(allocated);
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let key = ptr.as_ptr() as usize;
        // SAFETY: `with_or` runs the closure on this thread's own table, as its owner.
        let (allocated, align) = self.tables.with_or(|| (0, 0), |t, _| unsafe { t.remove_owned(key, layout.size()) });
        if allocated == 0 {
            return self.deallocate_slow(ptr, layout);
        }
        self.counters.record_free(allocated);
        // SAFETY: `ptr` was live in this thread's table with this size and `align`, so `inner`
        // allocated it with exactly that layout; removing it from the table makes this the only free.
        unsafe { self.inner.deallocate_raw(ptr, Layout::from_size_align_unchecked(layout.size(), align)) }
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

    fn snapshot_live_chunks(&self) -> Option<Vec<LiveChunk>> {
        Some(TrackingAllocator::live_chunks(self))
    }

    fn backend(&self) -> Option<&dyn std::any::Any> {
        self.inner.backend()
    }

    fn stream_ordered(&self) -> Option<&dyn crate::allocators::StreamOrdered> {
        self.inner.stream_ordered()
    }

    fn release_cached(&self) -> usize {
        self.inner.release_cached()
    }
}

impl fmt::Debug for TrackingAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingAllocator")
            .field("inner", &self.inner)
            .field("threads", &self.tables.len())
            .field("sizes", &self.sizes())
            .finish()
    }
}
