//! [`SystemAllocator`]: the operating system's allocator, with exact always-on statistics.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::alloc::System;

use crate::backend::Backend;
use crate::{
    AllocError, AllocationAttributes, Allocator, AllocatorBuilder, AllocatorStats, BackendOptions, FromOptions,
};

/// The system allocator (`malloc`, or `posix_memalign` for alignments above 16), counting every
/// allocation without a lock (see [`StatsCounters`](crate::StatsCounters)).
///
/// Any power-of-two alignment is honoured. Options: a name (default `cpu`), a byte limit, and
/// zero or junk fill of fresh memory. Bytes are counted as requested.
///
/// ```
/// use tensormem_allocators::{Allocator, AllocatorExt, AllocErrorKind, SystemAllocator};
///
/// let cpu = SystemAllocator::builder().bytes_limit(1024).build()?;
/// let p = cpu.allocate::<u8>(1000).unwrap();
/// let err = cpu.allocate::<u8>(100).unwrap_err();
/// assert_eq!(err.kind(), AllocErrorKind::LimitExceeded);
/// assert!(err.to_string().contains("1000 B in use of a 1.0 KiB limit"));
/// // SAFETY: `p` came from `allocate::<u8>(1000)` on `cpu`.
/// unsafe { cpu.deallocate(p, 1000) };
/// # Ok::<(), tensormem_allocators::BuildError>(())
/// ```
#[derive(Debug)]
pub struct SystemAllocator {
    backend: Backend,
}

impl SystemAllocator {
    /// A system allocator named `cpu`, with no limit and no fill.
    pub fn new() -> Self {
        Self::from_options(BackendOptions {
            name: Self::DEFAULT_NAME.to_owned(),
            bytes_limit: None,
            fill: crate::Fill::None,
        })
    }

    /// A builder for a named, limited or filling system allocator.
    pub fn builder() -> AllocatorBuilder<Self> {
        AllocatorBuilder::new()
    }

    /// The options it was built with.
    pub fn options(&self) -> &BackendOptions {
        &self.backend.options
    }

    /// The allocation path without the observation hook: the baseline of the `observe` bench,
    /// not for use (leak checks and history do not see it).
    #[doc(hidden)]
    pub fn allocate_unobserved(&self, layout: Layout) -> Result<NonNull<u8>, AllocError> {
        self.backend.allocate::<false>(layout, |layout, zeroed| {
            // SAFETY: `Backend::allocate` only calls this with a non-zero size.
            unsafe { if zeroed { System.alloc_zeroed(layout) } else { System.alloc(layout) } }
        })
    }

    /// Frees a block from [`allocate_unobserved`](Self::allocate_unobserved).
    ///
    /// # Safety
    /// As [`Allocator::deallocate_raw`], for a block from `allocate_unobserved`.
    #[doc(hidden)]
    pub unsafe fn deallocate_unobserved(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller promises `ptr` came from `System.alloc(layout)` via this backend.
        unsafe { self.backend.deallocate::<false>(ptr, layout, |p, l| System.dealloc(p, l)) }
    }
}

impl Default for SystemAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl FromOptions for SystemAllocator {
    const DEFAULT_NAME: &'static str = "cpu";

    fn from_options(options: BackendOptions) -> Self {
        Self { backend: Backend::new(options) }
    }
}

// SAFETY: blocks come from `System`, which returns memory valid for the layout and not handed
// out again until freed; the counters keep peak >= in use.
unsafe impl Allocator for SystemAllocator {
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
            unsafe { if zeroed { System.alloc_zeroed(layout) } else { System.alloc(layout) } }
        })
    }

    #[inline(always)]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller promises `ptr` is currently allocated here with `layout`, i.e. it
        // came from `System.alloc(layout)` (non-zero size; zero sizes never reach `raw`).
        unsafe { self.backend.deallocate::<true>(ptr, layout, |p, l| System.dealloc(p, l)) }
    }

    fn stats(&self) -> Option<AllocatorStats> {
        Some(self.backend.counters.stats())
    }

    fn clear_stats(&self) -> bool {
        self.backend.counters.clear();
        true
    }
}
