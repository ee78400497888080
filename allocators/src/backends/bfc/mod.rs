//! [`BfcAllocator`]: TensorFlow's best-fit-with-coalescing allocator, with PyTorch's expandable
//! segments, and its figures exposed.

mod dump;
mod split;
mod state;

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::observe::{self, Layer};
pub use dump::{BinSummary, ChunkInfo, ExpandableInfo, MemoryDump, RegionInfo};
pub use split::{ParseSplitPolicyError, SplitPolicy};
use state::{AllocFailure, FreeError, Growth, GrowthOptions, Options, State};
pub use state::{MIN_ALLOCATION_SIZE, NUM_BINS};

use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, BuildError, OsSubAllocator,
    SubAllocator, dangling,
};

/// The environment variable naming a file the memory dump is written to when an allocation fails.
pub const BFC_DUMP_ON_OOM_ENV: &str = "TENSORMEM_BFC_DUMP_ON_OOM";

/// TensorFlow's default cap on the bytes a chunk may waste by not being split: 128 MiB.
pub const DEFAULT_MAX_INTERNAL_FRAGMENTATION: u64 = 128 << 20;

/// The default growth step of an expandable BFC: requests are backed in multiples of 2 MiB.
pub const DEFAULT_GROWTH_GRANULE: u64 = 2 << 20;

/// The largest growth granule a builder accepts: 1 TiB, past any step a real machine can commit.
pub const MAX_GROWTH_GRANULE: u64 = 1 << 40;

/// By default, requests of at least this size take the lowest-address free chunk that fits
/// (address-ordered first fit); smaller ones the smallest (best fit).
pub const DEFAULT_FIRST_FIT_ABOVE: u64 = 64 << 10;

/// The peak headroom of a BFC whose [`peak_headroom`](BfcBuilder::peak_headroom) is not set,
/// over memory that moves pages (host memory on Linux): reserved stays within 4% above the peak
/// in use, which takes the recorded GPT-2 training stream under the 1.05 target (1.040).
pub const DEFAULT_PEAK_HEADROOM: f64 = 0.04;

/// Best-fit with coalescing, as TensorFlow's `BFCAllocator`, growing like PyTorch's expandable
/// segments: chunks of 256-byte multiples, split on allocation and merged with free neighbours on
/// free, carved from memory taken up to a limit. Free chunks are indexed by size below
/// [`first_fit_above`](BfcBuilder::first_fit_above) and by address above it; memory dumps still
/// report them in TensorFlow's 21 size bins.
///
/// - **Where memory comes from.** By default the allocator reserves its whole limit as address
///   space once, at construction (nothing is committed: the limit costs address space, not
///   memory), and commits at the end of the committed part as it grows, by what the request
///   needs rounded up to the growth granule (2 MiB by default, [`BfcBuilder::growth_granule`]).
///   Each piece is adjacent to the last, so chunks coalesce across growth steps and free memory
///   at the end is decommitted when asked ([`release_cached`](Allocator::release_cached), or a
///   [`release_threshold`](BfcBuilder::release_threshold)). This needs a sub-allocator that
///   offers [`ExpandableMemory`](crate::ExpandableMemory) (the default [`OsSubAllocator`] does
///   on Unix). Otherwise, or with [`expandable(false)`](BfcBuilder::expandable), it takes
///   TensorFlow's regions: with `allow_growth` the first is min(limit, 2 MiB) and each next one
///   doubles; without, one region of the whole limit at the first allocation.
/// - **Peak headroom.** Over memory that moves pages (host memory on Linux), reserved stays
///   within [`DEFAULT_PEAK_HEADROOM`] (4%) above the peak in use by default: when a block needs
///   memory committed past that, the pages of a large free chunk trapped between live blocks
///   move to it (`mremap`; nothing is faulted in again) instead of more being committed; pages
///   that were never touched are given back and fresh ones committed instead (moving them would
///   save no page faults). See [`BfcBuilder::peak_headroom`] for what it costs and how to turn
///   it off.
/// - **Allocation** takes, for a request below 64 KiB, the smallest free chunk that holds it at
///   its alignment (best fit, the lowest address on a tie, as TensorFlow), and for a larger one
///   the lowest-address free chunk that holds it (address-ordered first fit, which keeps large
///   free space together; see [`BfcBuilder::first_fit_above`]), and splits it by the
///   [`SplitPolicy`] (by default whenever at least 256 bytes remain).
/// - **Alignment.** Every chunk address is 256-byte aligned. Larger alignments, up to the
///   memory's granule or the sub-allocator's region alignment (4096 for the OS), are served by
///   splitting the misaligned start of a chunk off as a free chunk; larger ones are refused
///   with [`AllocErrorKind::UnsupportedLayout`].
/// - It tracks sizes: `requested_size`, `allocated_size` (the chunk size) and `allocation_id`
///   answer for live pointers; [`memory_dump`](Self::memory_dump) shows every chunk.
/// - A failed allocation's error names the request, its rounded size, the bytes in use, the
///   limit and the largest free block; with `TENSORMEM_BFC_DUMP_ON_OOM=<path>` the memory dump
///   is also written to `<path>` as JSON.
///
/// `bytes_reserved` in its stats is the memory taken from the backing memory now: committed
/// bytes when expandable, the regions' sizes otherwise.
///
/// ```
/// use tensormem_allocators::{Allocator, AllocatorExt, BfcAllocator};
///
/// let bfc = BfcAllocator::builder().memory_limit(1 << 30).name("arena").build()?;
/// assert_eq!(bfc.stats().unwrap().bytes_reserved, 0, "1 GiB of address space, no memory");
/// let a = bfc.allocate::<u8>(1000)?;
/// assert_eq!(bfc.allocated_size(a), Some(1024)); // rounded up to a multiple of 256
/// let s = bfc.stats().unwrap();
/// assert_eq!((s.bytes_in_use, s.bytes_reserved, s.bytes_limit), (1024, 2 << 20, Some(1 << 30)));
/// let err = bfc.allocate::<u8>(2 << 30).unwrap_err();
/// assert!(err.to_string().contains("1.0 KiB in use of a 1.0 GiB limit"), "{err}");
/// // SAFETY: `a` came from `allocate::<u8>(1000)` on `bfc`.
/// unsafe { bfc.deallocate(a, 1000) };
/// assert_eq!(bfc.release_cached(), 2 << 20, "the free 2 MiB are decommitted");
/// assert_eq!(bfc.stats().unwrap().bytes_reserved, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BfcAllocator {
    name: String,
    state: Mutex<State>,
    sub: Arc<dyn SubAllocator>,
    /// The largest alignment served: the memory's granule, or the sub-allocator's region
    /// alignment.
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
    /// An expandable allocator has one region, which goes (is decommitted) when nothing in it
    /// is live.
    pub fn release_unused_regions(&self) -> usize {
        let mut state = self.state.lock();
        if state.is_expandable() {
            let before = state.reserved();
            state.release(&*self.sub, 0, false);
            return usize::from(before > 0 && state.reserved() == 0);
        }
        state.free_unused_regions(&*self.sub, 0)
    }

    /// Whether the allocator grows one reserved region (see the type's docs) rather than
    /// taking regions.
    pub fn is_expandable(&self) -> bool {
        self.state.lock().is_expandable()
    }

    /// The peak headroom in effect (see [`BfcBuilder::peak_headroom`]): what was set, or by
    /// default [`DEFAULT_PEAK_HEADROOM`] over memory that moves pages and `None` elsewhere.
    ///
    /// ```
    /// use tensormem_allocators::BfcAllocator;
    /// let off = BfcAllocator::builder().memory_limit(1 << 30).peak_headroom(None).build()?;
    /// assert_eq!(off.peak_headroom(), None);
    /// let tf = BfcAllocator::builder().memory_limit(1 << 30).tensorflow_policies().build()?;
    /// assert_eq!(tf.peak_headroom(), None);
    /// # Ok::<(), tensormem_allocators::BuildError>(())
    /// ```
    pub fn peak_headroom(&self) -> Option<f64> {
        self.state.lock().peak_headroom()
    }

    /// Checks the allocator's internal invariants (chunk lists, handle maps, free-chunk indexes, totals, and
    /// that committed bytes are what the stats call reserved).
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
        let mut err = AllocError::new(kind, layout, &self.name)
            .with_rounded_size(rounded as u64)
            .with_usage(state.in_use() as u64, Some(state.memory_limit() as u64))
            .with_reserved(state.reserved() as u64)
            .with_largest_free_block(state.largest_free() as u64);
        if let (crate::MemorySpace::Device { ordinal }, Some((free, total))) =
            (self.sub.memory_space(), self.sub.device_memory_info())
        {
            err = err.with_device_memory(ordinal, free, total);
        }
        tracing::warn!(
            allocator = %self.name,
            requested = layout.size(),
            align = layout.align(),
            in_use = state.in_use(),
            reserved = state.reserved(),
            limit = state.memory_limit(),
            largest_free = state.largest_free(),
            "{err}"
        );
        (err, self.dump_on_oom.as_ref().map(|_| state.dump(&self.name)))
    }

    #[cold]
    #[track_caller]
    fn refuse_free(&self, ptr: NonNull<u8>, layout: Layout, why: FreeError) -> ! {
        let reason = match why {
            FreeError::Foreign => "no chunk of this allocator starts at that address (it is outside all its memory)",
            FreeError::NotAChunk => "no chunk of this allocator starts at that address (it is inside a block)",
            FreeError::AlreadyFree => "that block is already free (double free)",
        };
        panic!(
            "BfcAllocator '{}': refusing to free {ptr:p} ({} bytes, align {}): {reason}",
            self.name,
            layout.size(),
            layout.align()
        )
    }
}

// SAFETY: every chunk lies inside memory the sub-allocator gave us (a region, or a committed part
// of the reservation; memory is decommitted or returned only when no chunk in it is in use),
// starts at an address aligned as requested (256 always; larger alignments by splitting off the
// misaligned prefix; alignments above the region alignment or granule are refused), and is
// handed out only while marked in use; the chunk bookkeeping runs under one lock. Peak >= in use
// by construction of the stats.
unsafe impl Allocator for BfcAllocator {
    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> crate::MemorySpace {
        self.sub.memory_space()
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
            // The address lies inside memory the sub-allocator returned non-null.
            Ok(p) => {
                drop(state);
                observe::allocated(Layer::Caching, &self.name, p, layout.size(), rounded);
                Ok(NonNull::new(p as *mut u8).unwrap_or_else(|| dangling(layout)))
            }
            Err(failure) => {
                let (err, dump) = self.fail(&mut state, failure, layout, rounded);
                let largest = observe::reports_wanted().then(|| state.largest_live(observe::report_entries()));
                drop(state);
                observe::refused(&self.name, &err, largest.as_deref());
                if let (Some(path), Some(dump)) = (&self.dump_on_oom, dump) {
                    write_dump(&self.name, path, &dump);
                }
                Err(err)
            }
        }
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        observe::freed(Layer::Caching, &self.name, ptr.as_ptr() as usize, layout.size());
        let result = self.state.lock().deallocate(ptr.as_ptr() as usize, &*self.sub);
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

    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    /// Gives every byte of free memory back that can go: for an expandable region its free tail
    /// and, on host memory, every whole free page between live blocks (decommitted; the
    /// addresses stay reserved and are committed again when a block is placed there); for
    /// TensorFlow's regions, every region that holds no allocation. Live blocks are untouched.
    fn release_cached(&self) -> usize {
        self.state.lock().release_cached(&*self.sub)
    }
}

/// Writes a memory dump as JSON; a failure is reported as a `tracing` error, since the
/// allocation error it accompanies cannot carry it.
#[cold]
fn write_dump(allocator: &str, path: &std::path::Path, dump: &MemoryDump) {
    let written =
        serde_json::to_vec_pretty(dump).map_err(std::io::Error::other).and_then(|json| std::fs::write(path, json));
    match written {
        Ok(()) => tracing::info!(allocator, path = %path.display(), "bfc: memory dump written"),
        Err(error) => {
            tracing::error!(allocator, path = %path.display(), %error, "bfc: could not write the memory dump");
        }
    }
}

impl Drop for BfcAllocator {
    fn drop(&mut self) {
        self.state.get_mut().release_all(&*self.sub);
    }
}

impl fmt::Debug for BfcAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        let s = state.stats();
        f.debug_struct("BfcAllocator")
            .field("name", &self.name)
            .field("sub_allocator", &self.sub)
            .field("expandable", &state.is_expandable())
            .field("bytes_in_use", &s.bytes_in_use)
            .field("bytes_reserved", &s.bytes_reserved)
            .field("bytes_limit", &s.bytes_limit)
            .finish_non_exhaustive()
    }
}

/// Options of a [`BfcAllocator`]. A clone builds another allocator with the same options (and
/// the same sub-allocator).
#[derive(Clone, Debug)]
pub struct BfcBuilder {
    name: String,
    memory_limit: Option<u64>,
    allow_growth: bool,
    garbage_collection: bool,
    max_internal_fragmentation: u64,
    sub: Option<Arc<dyn SubAllocator>>,
    dump_on_oom: Option<PathBuf>,
    expandable: Option<bool>,
    growth_granule: u64,
    split: SplitPolicy,
    release_threshold: Option<u64>,
    first_fit_above: u64,
    /// `None`: unset (the default for the memory); `Some(None)`: off.
    peak_headroom: Option<Option<f64>>,
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
            expandable: None,
            growth_granule: DEFAULT_GROWTH_GRANULE,
            split: SplitPolicy::default(),
            release_threshold: None,
            first_fit_above: DEFAULT_FIRST_FIT_ABOVE,
            peak_headroom: None,
        }
    }
}

impl BfcBuilder {
    /// The most bytes the allocator takes from its memory (required; at least 256), as
    /// TensorFlow's `memory_limit`: the stats report it as given. Chunks are whole 256-byte
    /// units, so at most the limit rounded down to 256 is handed out; an expandable allocator
    /// commits whole granules (4 KiB pages for the OS), so it uses at most the limit rounded
    /// down to the granule. A sub-allocator that rounds regions up (the OS, to pages) may hand a
    /// region allocator up to one page more than asked; `bytes_reserved` shows it.
    #[must_use]
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// For regions (not expandable): take memory in growing regions (2 MiB first, doubling)
    /// instead of the whole limit at the first allocation. An expandable allocator always grows
    /// by what requests need and ignores this.
    #[must_use]
    pub fn allow_growth(mut self, on: bool) -> Self {
        self.allow_growth = on;
        self
    }

    /// Grow one reserved region (`true`) or take separate regions (`false`). Unset (the
    /// default): expandable when the sub-allocator offers it and the limit holds at least one
    /// of its granules. `true` makes building fail when it cannot be had.
    #[must_use]
    pub fn expandable(mut self, on: bool) -> Self {
        self.expandable = Some(on);
        self
    }

    /// The step an expandable allocator grows by: what a request needs is rounded up to a
    /// multiple of this (default 2 MiB; rounded up to the memory's granule). Near the limit it
    /// takes less, down to one granule. At most [`MAX_GROWTH_GRANULE`] ([`build`](Self::build)
    /// refuses more).
    #[must_use]
    pub fn growth_granule(mut self, bytes: u64) -> Self {
        self.growth_granule = bytes;
        self
    }

    /// When a free chunk larger than the request is split (default:
    /// [`SplitPolicy::Remainder(256)`](SplitPolicy::Remainder)).
    #[must_use]
    pub fn split(mut self, policy: SplitPolicy) -> Self {
        self.split = policy;
        self
    }

    /// TensorFlow's `BFCAllocator` policies exactly: regions doubling from 2 MiB instead of
    /// expandable memory, TensorFlow's split rule, best fit for every size. The baseline the
    /// defaults are measured against (`docs/free-chunk-index.md`).
    ///
    /// ```
    /// use tensormem_allocators::BfcAllocator;
    /// let tf = BfcAllocator::builder().memory_limit(1 << 30).allow_growth(true).tensorflow_policies().build()?;
    /// assert!(!tf.is_expandable());
    /// # Ok::<(), tensormem_allocators::BuildError>(())
    /// ```
    #[must_use]
    pub fn tensorflow_policies(self) -> Self {
        self.expandable(false).split(SplitPolicy::TensorFlow).first_fit_above(u64::MAX).peak_headroom(None)
    }

    /// Requests of at least this many bytes take the lowest-address free chunk that fits
    /// (address-ordered first fit); smaller ones the smallest (best fit). Default 64 KiB;
    /// `u64::MAX` gives TensorFlow's best fit for every request. On the recorded PyTorch streams
    /// first fit for large blocks leaves less memory stranded between them
    /// (`docs/free-chunk-index.md`).
    #[must_use]
    pub fn first_fit_above(mut self, bytes: u64) -> Self {
        self.first_fit_above = bytes;
        self
    }

    /// Keep at most this many free bytes committed: past it, frees give memory back at once
    /// (the free tail of an expandable region, or whole free regions), as a CUDA memory pool's
    /// release threshold. Unset (the default): keep everything until
    /// [`release_cached`](Allocator::release_cached).
    #[must_use]
    pub fn release_threshold(mut self, bytes: Option<u64>) -> Self {
        self.release_threshold = bytes;
        self
    }

    /// Keep reserved memory within this fraction above the peak of bytes in use (e.g. `0.04`):
    /// a commit that would lift reserved past both that and its earlier high-water mark first
    /// takes free memory from elsewhere: whole free pages inside free chunks of at least 64 MiB
    /// (or a sixteenth of the limit), highest addresses first, then the free tail. Such a chunk
    /// is typically trapped between live blocks while the region grows for a larger block.
    /// Memory that [relocates](crate::ExpandableMemory::relocates) (host memory on Linux:
    /// `mremap`) *moves* those pages to where the block needs them, so they stay faulted in and
    /// keep their frames, where enough of them are resident to be worth the system calls
    /// ([`ExpandableMemory::resident`](crate::ExpandableMemory::resident): at least 512 KiB of
    /// a piece, judged from its first 2 MiB); pages that were never touched, and those of other
    /// memory that decommits any page, are given back and fresh ones committed. Where a commit
    /// can only be unmapped whole it has no effect (GPU memory is mapped in units that move:
    /// [`UnitMemory`](crate::UnitMemory)). `None` turns it off:
    /// reserved follows the placement, as with PyTorch's expandable segments.
    ///
    /// Unset (the default): [`DEFAULT_PEAK_HEADROOM`] (4%) over memory that moves pages, none
    /// over other memory (there it would fault pages in again) or with TensorFlow's regions. It
    /// lowers peak reserved on streams whose large blocks strand free memory between live ones
    /// (PyTorch's recorded GPT-2 training stream) and changes nothing on the others. What it
    /// costs is system calls where a block needs pages from elsewhere. Pages that were written
    /// move (whole 16 MiB units first, a chunk's edges after them), so a workload that writes
    /// its blocks replays as fast as without a headroom; pages never touched are given back and
    /// fresh ones committed instead. Moved pages also cost the process memory mappings (a moved
    /// range cannot merge with its neighbours while it is committed), far below the system's
    /// limit of 65,530. Figures: `docs/peak-headroom.md`.
    ///
    /// ```
    /// use tensormem_allocators::{BfcAllocator, BuildError};
    /// let bfc = BfcAllocator::builder().memory_limit(1 << 30).peak_headroom(Some(0.04)).build()?;
    /// assert!(bfc.is_expandable());
    /// let bad = BfcAllocator::builder().memory_limit(1 << 30).peak_headroom(Some(-1.0)).build();
    /// assert!(matches!(bad, Err(BuildError::InvalidOption { option: "peak_headroom", .. })));
    /// # Ok::<(), BuildError>(())
    /// ```
    #[must_use]
    pub fn peak_headroom(mut self, fraction: Option<f64>) -> Self {
        self.peak_headroom = Some(fraction);
        self
    }

    /// Before failing an allocation, return wholly unused regions and try again.
    #[must_use]
    pub fn garbage_collection(mut self, on: bool) -> Self {
        self.garbage_collection = on;
        self
    }

    /// For [`SplitPolicy::TensorFlow`]: split a chunk whenever it would otherwise waste more
    /// than this (default 128 MiB).
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

    /// Where memory comes from (default: [`OsSubAllocator`]).
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

    /// Checks the options and builds the allocator. An expandable allocator reserves its
    /// address space now; no memory is committed until the first allocation.
    ///
    /// # Errors
    /// [`BuildError::MissingOption`] without a `memory_limit`; [`BuildError::ZeroLimit`] for a
    /// limit of 0; [`BuildError::LimitTooSmall`] for a limit below one 256-byte chunk (or, with
    /// `expandable(true)`, below one granule); [`BuildError::EmptyName`];
    /// [`BuildError::InvalidOption`] for `expandable(true)` over a sub-allocator without
    /// expandable memory or a growth granule of 0; [`BuildError::Reserve`] when the address
    /// space cannot be reserved (e.g. under `RLIMIT_AS`); [`BuildError::UnsupportedSubAllocator`]
    /// when the sub-allocator cannot align regions to 256 bytes.
    pub fn build(self) -> Result<BfcAllocator, BuildError> {
        if self.name.is_empty() {
            return Err(BuildError::EmptyName);
        }
        let name = self.name;
        let limit = self
            .memory_limit
            .ok_or_else(|| BuildError::MissingOption { allocator: name.clone(), option: "memory_limit" })?;
        if limit == 0 {
            return Err(BuildError::ZeroLimit { allocator: name });
        }
        if limit < MIN_ALLOCATION_SIZE as u64 {
            return Err(BuildError::LimitTooSmall { allocator: name, limit, minimum: MIN_ALLOCATION_SIZE as u64 });
        }
        if self.growth_granule == 0 || self.growth_granule > MAX_GROWTH_GRANULE {
            return Err(BuildError::InvalidOption {
                allocator: name,
                option: "growth_granule",
                reason: format!(
                    "a growth granule of {} bytes; use from one page to {} ({MAX_GROWTH_GRANULE} bytes)",
                    self.growth_granule,
                    crate::ByteSize(MAX_GROWTH_GRANULE)
                ),
            });
        }
        if let Some(Some(f)) = self.peak_headroom
            && !(f.is_finite() && f >= 0.0)
        {
            return Err(BuildError::InvalidOption {
                allocator: name,
                option: "peak_headroom",
                reason: format!("a headroom of {f}; use a fraction of at least 0, such as 0.04"),
            });
        }
        let sub = self.sub.unwrap_or_else(|| Arc::new(OsSubAllocator));
        let memory_limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let growth_options = GrowthOptions {
            memory_limit,
            allow_growth: self.allow_growth,
            growth_granule: usize::try_from(self.growth_granule).unwrap_or(usize::MAX),
        };
        let memory = match (self.expandable, sub.expandable()) {
            (Some(false), _) => None,
            (Some(true), None) => {
                return Err(BuildError::InvalidOption {
                    allocator: name,
                    option: "expandable",
                    reason: format!("its sub-allocator {sub:?} cannot reserve address space; use expandable(false)"),
                });
            }
            (Some(true), Some(m)) if memory_limit < m.granule() => {
                return Err(BuildError::LimitTooSmall { allocator: name, limit, minimum: m.granule() as u64 });
            }
            // Unset: a limit below one granule keeps TensorFlow's regions.
            (None, Some(m)) if memory_limit < m.granule() => None,
            (_, m) => m,
        };
        let options = Options {
            memory_limit,
            split: self.split,
            max_internal_fragmentation: usize::try_from(self.max_internal_fragmentation).unwrap_or(usize::MAX),
            release_threshold: self.release_threshold.map(|t| usize::try_from(t).unwrap_or(usize::MAX)),
            first_fit_above: usize::try_from(self.first_fit_above).unwrap_or(usize::MAX).max(MIN_ALLOCATION_SIZE),
            // Unset: the default headroom where pages move (so nothing is faulted in again),
            // none where the memory could only give pages back.
            peak_headroom: match self.peak_headroom {
                Some(set) => set,
                None => memory.filter(|m| State::moves_pages(*m)).map(|_| DEFAULT_PEAK_HEADROOM),
            },
        };
        let (growth, max_alignment) = match memory {
            Some(m) => {
                let granule = m.granule();
                let reserved = memory_limit / granule * granule;
                let base = m.reserve(reserved).map_err(|e| BuildError::Reserve {
                    allocator: name.clone(),
                    bytes: reserved as u64,
                    memory: m.name().to_owned(),
                    reason: e.to_string(),
                })?;
                tracing::debug!(allocator = %name, reserved, granule, "bfc: reserved address space");
                (Growth::expandable(growth_options, base, reserved, m), granule)
            }
            None => {
                if sub.max_alignment() < state::REGION_ALIGNMENT {
                    return Err(BuildError::UnsupportedSubAllocator {
                        allocator: name,
                        alignment: sub.max_alignment() as u64,
                        required: state::REGION_ALIGNMENT as u64,
                    });
                }
                (Growth::regions(growth_options), sub.max_alignment())
            }
        };
        Ok(BfcAllocator {
            state: Mutex::new(State::new(&name, options, growth)),
            name,
            max_alignment,
            sub,
            garbage_collection: self.garbage_collection,
            dump_on_oom: self.dump_on_oom,
        })
    }
}
