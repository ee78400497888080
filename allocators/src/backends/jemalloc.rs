//! [`JemallocAllocator`]: jemalloc (tikv-jemallocator) with the same statistics as the system
//! backend, plus jemalloc's own process-wide figures.

use core::alloc::{GlobalAlloc, Layout};
use core::fmt;
use core::ptr::NonNull;

use tikv_jemalloc_ctl::{epoch, stats};
use tikv_jemallocator::Jemalloc;

use crate::backend::Backend;
use crate::{
    AllocError, AllocationAttributes, Allocator, AllocatorBuilder, AllocatorStats, BackendOptions, Fill, FromOptions,
};

/// jemalloc, through tikv-jemallocator (sized frees, `MALLOCX_ALIGN` for over-aligned requests),
/// counting every allocation without a lock.
///
/// [`allocated_size_slow`](Allocator::allocated_size_slow) answers jemalloc's usable size of a
/// pointer, and [`jemalloc_stats`](Self::jemalloc_stats) reads jemalloc's arena statistics.
///
/// ```
/// use tensormem_allocators::{Allocator, AllocatorExt, JemallocAllocator};
///
/// let je = JemallocAllocator::new();
/// let p = je.allocate::<u8>(100)?;
/// assert_eq!(je.allocated_size_slow(p), Some(112)); // jemalloc's size class for 100 bytes
/// // SAFETY: `p` came from `allocate::<u8>(100)` on `je`.
/// unsafe { je.deallocate(p, 100) };
/// let js = JemallocAllocator::jemalloc_stats()?;
/// assert!(js.resident >= js.active && js.active >= js.allocated);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct JemallocAllocator {
    backend: Backend,
}

impl JemallocAllocator {
    /// A jemalloc allocator named `jemalloc`, with no limit and no fill.
    pub fn new() -> Self {
        Self::from_options(BackendOptions { name: Self::DEFAULT_NAME.to_owned(), bytes_limit: None, fill: Fill::None })
    }

    /// A builder for a named, limited or filling jemalloc allocator.
    pub fn builder() -> AllocatorBuilder<Self> {
        AllocatorBuilder::new()
    }

    /// The options it was built with.
    pub fn options(&self) -> &BackendOptions {
        &self.backend.options
    }

    /// jemalloc's process-wide statistics (all jemalloc arenas, so every `JemallocAllocator`
    /// together), refreshed by advancing jemalloc's epoch first.
    ///
    /// # Errors
    /// [`JemallocStatsError`] if jemalloc's `mallctl` interface refuses a read.
    pub fn jemalloc_stats() -> Result<JemallocStats, JemallocStatsError> {
        let err = |source| JemallocStatsError { source };
        epoch::advance().map_err(err)?;
        Ok(JemallocStats {
            allocated: stats::allocated::read().map_err(err)? as u64,
            active: stats::active::read().map_err(err)? as u64,
            metadata: stats::metadata::read().map_err(err)? as u64,
            resident: stats::resident::read().map_err(err)? as u64,
            mapped: stats::mapped::read().map_err(err)? as u64,
            retained: stats::retained::read().map_err(err)? as u64,
        })
    }
}

impl Default for JemallocAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl FromOptions for JemallocAllocator {
    const DEFAULT_NAME: &'static str = "jemalloc";

    fn from_options(options: BackendOptions) -> Self {
        Self { backend: Backend::new(options) }
    }
}

// SAFETY: blocks come from jemalloc, which returns memory valid for the layout and not handed out
// again until freed; the counters keep peak >= in use.
unsafe impl Allocator for JemallocAllocator {
    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    fn name(&self) -> &str {
        &self.backend.options.name
    }

    #[inline(always)]
    fn allocate_raw(&self, layout: Layout, _attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        self.backend.allocate::<true>(layout, |layout, zeroed| {
            // SAFETY: `Backend::allocate` only calls this with a non-zero size.
            unsafe { if zeroed { Jemalloc.alloc_zeroed(layout) } else { Jemalloc.alloc(layout) } }
        })
    }

    #[inline(always)]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller promises `ptr` is currently allocated here with `layout`, i.e. it
        // came from `Jemalloc.alloc(layout)` (non-zero size; zero sizes never reach `raw`).
        unsafe { self.backend.deallocate::<true>(ptr, layout, |p, l| Jemalloc.dealloc(p, l)) }
    }

    fn allocated_size_slow(&self, ptr: NonNull<u8>) -> Option<usize> {
        // SAFETY: the trait's contract for size queries is that `ptr` is a live block of this
        // allocator, which jemalloc allocated; `usable_size` only reads jemalloc's metadata.
        Some(unsafe { tikv_jemallocator::usable_size(ptr.as_ptr()) })
    }

    fn stats(&self) -> Option<AllocatorStats> {
        Some(self.backend.counters.stats())
    }

    fn clear_stats(&self) -> bool {
        self.backend.counters.clear();
        true
    }
}

/// jemalloc's process-wide byte counts (`stats.*` in jemalloc's mallctl namespace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct JemallocStats {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages (a multiple of the page size, at least `allocated`).
    pub active: u64,
    /// Bytes of jemalloc's own metadata.
    pub metadata: u64,
    /// Bytes in physically resident data pages (at least `active`).
    pub resident: u64,
    /// Bytes in active extents mapped by jemalloc.
    pub mapped: u64,
    /// Bytes in virtual memory mappings retained for reuse rather than returned to the OS.
    pub retained: u64,
}

/// Reading jemalloc's statistics failed.
#[derive(Debug)]
pub struct JemallocStatsError {
    source: tikv_jemalloc_ctl::Error,
}

impl fmt::Display for JemallocStatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reading jemalloc statistics failed: {}", self.source)
    }
}

impl std::error::Error for JemallocStatsError {}
