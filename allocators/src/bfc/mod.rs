//! [`BfcAllocator`]: TensorFlow's best-fit-with-coalescing allocator, with its figures exposed.

mod dump;
mod state;

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

pub use dump::{BinSummary, ChunkInfo, MemoryDump, RegionInfo};
use state::{AllocFailure, FreeError, State};
pub use state::{MIN_ALLOCATION_SIZE, NUM_BINS};

use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, BuildError, OsSubAllocator,
    SubAllocator, dangling,
};

/// The environment variable naming a file the memory dump is written to when an allocation fails.
pub const BFC_DUMP_ON_OOM_ENV: &str = "TENSORMEM_BFC_DUMP_ON_OOM";

/// TensorFlow's default cap on the bytes a chunk may waste by not being split: 128 MiB.
pub const DEFAULT_MAX_INTERNAL_FRAGMENTATION: u64 = 128 << 20;

/// Best-fit with coalescing, as TensorFlow's `BFCAllocator`: memory taken in regions from a
/// [`SubAllocator`] (by default the operating system) up to a limit, cut into chunks of
/// 256-byte multiples, kept in 21 size-ordered bins, split on allocation and merged with free
/// neighbours on free.
///
/// - Allocation takes the smallest free chunk that fits, the lowest address on a tie, and splits
///   it when it is at least twice the rounded request or would waste more than
///   `max_internal_fragmentation_bytes`.
/// - With `allow_growth` the first region is min(limit, 2 MiB) and each new one doubles;
///   otherwise one region of the whole limit is taken at the first allocation.
/// - Every chunk address is 256-byte aligned. Larger alignments, up to the sub-allocator's region
///   alignment (4096 for [`OsSubAllocator`]), are served by splitting the misaligned start of a
///   chunk off as a free chunk; larger ones are refused with
///   [`AllocErrorKind::UnsupportedLayout`].
/// - It tracks sizes: `requested_size`, `allocated_size` (the chunk size) and `allocation_id`
///   answer for live pointers; [`memory_dump`](Self::memory_dump) shows every chunk.
/// - A failed allocation's error names the request, its rounded size, the bytes in use, the
///   limit and the largest free block; with `TENSORMEM_BFC_DUMP_ON_OOM=<path>` the memory dump
///   is also written to `<path>` as JSON.
///
/// ```
/// use tensormem_allocators::{Allocator, AllocatorExt, BfcAllocator};
///
/// let bfc = BfcAllocator::builder().memory_limit(1 << 20).name("arena").build()?;
/// let a = bfc.allocate::<u8>(1000)?;
/// assert_eq!(bfc.allocated_size(a), Some(1024)); // rounded up to a multiple of 256
/// let s = bfc.stats().unwrap();
/// assert_eq!((s.bytes_in_use, s.bytes_reserved, s.bytes_limit), (1024, 1 << 20, Some(1 << 20)));
/// let err = bfc.allocate::<u8>(2 << 20).unwrap_err();
/// assert!(err.to_string().contains("1.0 KiB in use of a 1.0 MiB limit"), "{err}");
/// // SAFETY: `a` came from `allocate::<u8>(1000)` on `bfc`.
/// unsafe { bfc.deallocate(a, 1000) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BfcAllocator {
    name: String,
    state: Mutex<State>,
    sub: Arc<dyn SubAllocator>,
    /// The sub-allocator's region alignment: the largest alignment served.
    max_alignment: usize,
    garbage_collection: bool,
    dump_on_oom: Option<PathBuf>,
}

impl BfcAllocator {
    /// A builder; `memory_limit` is required.
    pub fn builder() -> BfcBuilder {
        BfcBuilder::default()
    }

    /// Everything the allocator knows about its memory now.
    pub fn memory_dump(&self) -> MemoryDump {
        self.state.lock().dump(&self.name)
    }

    /// Returns every region that holds no allocation to the sub-allocator; returns how many.
    pub fn release_unused_regions(&self) -> usize {
        self.state.lock().free_unused_regions(&*self.sub)
    }

    /// Checks the allocator's internal invariants (chunk lists, handle maps, bins, totals).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.state.lock().check()
    }

    /// The error for a failed allocation, and the memory dump to write if one is wanted.
    #[cold]
    fn fail(
        &self,
        state: &mut State,
        failure: AllocFailure,
        layout: Layout,
        rounded: usize,
    ) -> (AllocError, Option<MemoryDump>) {
        state.num_ooms += 1;
        let kind = match failure {
            AllocFailure::OverLimit => AllocErrorKind::LimitExceeded,
            AllocFailure::OutOfMemory => AllocErrorKind::OutOfMemory,
        };
        let err = AllocError::new(kind, layout, &self.name)
            .with_rounded_size(rounded as u64)
            .with_usage(state.in_use() as u64, Some(state.memory_limit() as u64))
            .with_largest_free_block(state.largest_free() as u64);
        (err, self.dump_on_oom.as_ref().map(|_| state.dump(&self.name)))
    }

    #[cold]
    #[track_caller]
    fn refuse_free(&self, ptr: NonNull<u8>, layout: Layout, why: FreeError) -> ! {
        let reason = match why {
            FreeError::Foreign => "no chunk of this allocator starts at that address",
            FreeError::AlreadyFree => "that chunk is already free (double free)",
        };
        panic!(
            "BfcAllocator '{}': refusing to free {ptr:p} ({} bytes, align {}): {reason}",
            self.name,
            layout.size(),
            layout.align()
        )
    }
}

// SAFETY: every chunk lies inside a region the sub-allocator gave us (valid for its size), starts
// at an address aligned as requested (256 always; larger alignments by splitting off the
// misaligned prefix; alignments above the region alignment are refused), and is handed out
// only while marked in use; the chunk bookkeeping runs under one lock. Peak >= in use by
// construction of the stats.
unsafe impl Allocator for BfcAllocator {
    fn name(&self) -> &str {
        &self.name
    }

    fn allocate_raw(&self, layout: Layout, _attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        if layout.align() > self.max_alignment {
            return Err(AllocError::new(AllocErrorKind::UnsupportedLayout, layout, &self.name)
                .with_max_alignment(self.max_alignment as u64));
        }
        // A `Layout`'s size is at most isize::MAX, so rounding up by 255 cannot overflow.
        let rounded = state::rounded_bytes(layout.size()).unwrap_or(usize::MAX);
        let mut state = self.state.lock();
        match state.allocate(layout.size(), rounded, layout.align(), &*self.sub, self.garbage_collection) {
            // The address lies inside a region the sub-allocator returned non-null.
            Ok(p) => Ok(NonNull::new(p as *mut u8).unwrap_or_else(|| dangling(layout))),
            Err(failure) => {
                let (err, dump) = self.fail(&mut state, failure, layout, rounded);
                drop(state);
                if let (Some(path), Some(dump)) = (&self.dump_on_oom, dump) {
                    write_dump(path, &dump);
                }
                Err(err)
            }
        }
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let result = self.state.lock().deallocate(ptr.as_ptr() as usize);
        if let Err(why) = result {
            self.refuse_free(ptr, layout, why);
        }
    }

    fn tracks_allocation_sizes(&self) -> bool {
        true
    }

    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.state.lock().live_chunk(ptr.as_ptr() as usize).map(|c| c.0)
    }

    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.state.lock().live_chunk(ptr.as_ptr() as usize).map(|c| c.1)
    }

    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        self.state.lock().live_chunk(ptr.as_ptr() as usize).map(|c| c.2)
    }

    fn stats(&self) -> Option<AllocatorStats> {
        Some(self.state.lock().stats())
    }

    fn clear_stats(&self) -> bool {
        self.state.lock().clear_stats();
        true
    }

    fn snapshot_memory_dump(&self) -> Option<MemoryDump> {
        Some(BfcAllocator::memory_dump(self))
    }
}

/// Writes a memory dump as JSON; a failure is reported on stderr, since the allocation error it
/// accompanies cannot carry it.
#[cold]
fn write_dump(path: &std::path::Path, dump: &MemoryDump) {
    let written =
        serde_json::to_vec_pretty(dump).map_err(std::io::Error::other).and_then(|json| std::fs::write(path, json));
    if let Err(e) = written {
        eprintln!("tensormem: could not write the BFC memory dump to {}: {e}", path.display());
    }
}

impl Drop for BfcAllocator {
    fn drop(&mut self) {
        self.state.get_mut().release_all(&*self.sub);
    }
}

impl fmt::Debug for BfcAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock().stats();
        f.debug_struct("BfcAllocator")
            .field("name", &self.name)
            .field("sub_allocator", &self.sub)
            .field("bytes_in_use", &s.bytes_in_use)
            .field("bytes_reserved", &s.bytes_reserved)
            .field("bytes_limit", &s.bytes_limit)
            .finish_non_exhaustive()
    }
}

/// Options of a [`BfcAllocator`].
#[derive(Debug)]
pub struct BfcBuilder {
    name: String,
    memory_limit: Option<u64>,
    allow_growth: bool,
    garbage_collection: bool,
    max_internal_fragmentation: u64,
    sub: Option<Arc<dyn SubAllocator>>,
    dump_on_oom: Option<PathBuf>,
}

impl Default for BfcBuilder {
    fn default() -> Self {
        Self {
            name: "bfc".to_owned(),
            memory_limit: None,
            allow_growth: false,
            garbage_collection: false,
            max_internal_fragmentation: DEFAULT_MAX_INTERNAL_FRAGMENTATION,
            sub: None,
            dump_on_oom: std::env::var_os(BFC_DUMP_ON_OOM_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }
}

impl BfcBuilder {
    /// The most bytes the allocator may take from its sub-allocator (required; at least 256).
    #[must_use]
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Take memory in growing regions (2 MiB first, doubling) instead of all at once.
    #[must_use]
    pub fn allow_growth(mut self, on: bool) -> Self {
        self.allow_growth = on;
        self
    }

    /// Before failing an allocation, return wholly unused regions and try again.
    #[must_use]
    pub fn garbage_collection(mut self, on: bool) -> Self {
        self.garbage_collection = on;
        self
    }

    /// Split a chunk whenever it would otherwise waste more than this (default 128 MiB).
    #[must_use]
    pub fn max_internal_fragmentation_bytes(mut self, bytes: u64) -> Self {
        self.max_internal_fragmentation = bytes;
        self
    }

    /// The allocator's name (default `bfc`).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where regions come from (default: [`OsSubAllocator`]).
    #[must_use]
    pub fn sub_allocator(mut self, sub: Arc<dyn SubAllocator>) -> Self {
        self.sub = Some(sub);
        self
    }

    /// Write the memory dump as JSON to `path` when an allocation fails (default: the value of
    /// `TENSORMEM_BFC_DUMP_ON_OOM` when the builder was made); `None` turns it off.
    #[must_use]
    pub fn dump_on_oom(mut self, path: Option<PathBuf>) -> Self {
        self.dump_on_oom = path;
        self
    }

    /// Checks the options and builds the allocator. No memory is taken until the first
    /// allocation.
    ///
    /// # Errors
    /// [`BuildError::MissingOption`] without a `memory_limit`; [`BuildError::ZeroLimit`] for a
    /// limit of 0; [`BuildError::LimitTooSmall`] for a limit below one 256-byte chunk;
    /// [`BuildError::EmptyName`]; [`BuildError::UnsupportedSubAllocator`] when the
    /// sub-allocator cannot align regions to 256 bytes.
    pub fn build(self) -> Result<BfcAllocator, BuildError> {
        if self.name.is_empty() {
            return Err(BuildError::EmptyName);
        }
        let limit = self
            .memory_limit
            .ok_or_else(|| BuildError::MissingOption { allocator: self.name.clone(), option: "memory_limit" })?;
        if limit == 0 {
            return Err(BuildError::ZeroLimit { allocator: self.name });
        }
        if limit < MIN_ALLOCATION_SIZE as u64 {
            return Err(BuildError::LimitTooSmall { allocator: self.name, limit, minimum: MIN_ALLOCATION_SIZE as u64 });
        }
        let sub = self.sub.unwrap_or_else(|| Arc::new(OsSubAllocator));
        if sub.max_alignment() < state::REGION_ALIGNMENT {
            return Err(BuildError::UnsupportedSubAllocator {
                allocator: self.name,
                alignment: sub.max_alignment() as u64,
                required: state::REGION_ALIGNMENT as u64,
            });
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let frag = usize::try_from(self.max_internal_fragmentation).unwrap_or(usize::MAX);
        Ok(BfcAllocator {
            name: self.name,
            state: Mutex::new(State::new(limit, self.allow_growth, frag)),
            max_alignment: sub.max_alignment(),
            sub,
            garbage_collection: self.garbage_collection,
            dump_on_oom: self.dump_on_oom,
        })
    }
}
