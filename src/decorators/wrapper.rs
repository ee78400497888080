//! [`AllocatorWrapper`]: forwards every call to an inner allocator; the base for decorators.

/// Implements the queries of [`Allocator`] a decorator does not change (`tracks_allocation_sizes`,
/// `requested_size`, `allocated_size`, `allocation_id`, `allocated_size_slow`,
/// `snapshot_live_chunks`, `backend`, `release_cached`) by forwarding them to the
/// field `$inner`, for decorators that do not track allocations themselves.
macro_rules! forward_size_queries {
    ($inner:ident) => {
        fn tracks_allocation_sizes(&self) -> bool {
            self.$inner.tracks_allocation_sizes()
        }

        fn requested_size(&self, ptr: core::ptr::NonNull<u8>) -> Option<usize> {
            self.$inner.requested_size(ptr)
        }

        fn allocated_size(&self, ptr: core::ptr::NonNull<u8>) -> Option<usize> {
            self.$inner.allocated_size(ptr)
        }

        fn allocation_id(&self, ptr: core::ptr::NonNull<u8>) -> Option<u64> {
            self.$inner.allocation_id(ptr)
        }

        fn allocated_size_slow(&self, ptr: core::ptr::NonNull<u8>) -> Option<usize> {
            self.$inner.allocated_size_slow(ptr)
        }

        fn snapshot_live_chunks(&self) -> Option<Vec<$crate::allocators::LiveChunk>> {
            self.$inner.snapshot_live_chunks()
        }

        fn backend(&self) -> Option<&dyn core::any::Any> {
            self.$inner.backend()
        }

        fn stream_ordered(&self) -> Option<&dyn $crate::allocators::StreamOrdered> {
            self.$inner.stream_ordered()
        }

        fn release_cached(&self) -> usize {
            self.$inner.release_cached()
        }
    };
}
pub(crate) use forward_size_queries;

use core::alloc::Layout;
use core::ptr::NonNull;
use std::sync::Arc;

use crate::allocators::{AllocError, AllocationAttributes, Allocator, AllocatorStats};

/// Forwards every [`Allocator`] call to an inner `Arc<dyn Allocator>`, optionally under another
/// name (TensorFlow's `AllocatorWrapper`). Decorators hold one and override what they change.
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{Allocator, AllocatorExt, AllocatorWrapper, SystemAllocator};
///
/// let cpu: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
/// let w = AllocatorWrapper::named("weights", Arc::clone(&cpu));
/// let p = w.allocate::<u8>(100)?;
/// assert_eq!(w.name(), "weights");
/// assert_eq!(cpu.stats().unwrap().bytes_in_use, 100); // the inner allocator did the work
/// // SAFETY: `p` came from `allocate::<u8>(100)` on `w`.
/// unsafe { w.deallocate(p, 100) };
/// # Ok::<(), tensormem::AllocError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AllocatorWrapper {
    inner: Arc<dyn Allocator>,
    name: Option<String>,
}

impl AllocatorWrapper {
    /// Wraps `inner`, keeping its name.
    pub fn new(inner: Arc<dyn Allocator>) -> Self {
        Self { inner, name: None }
    }

    /// Wraps `inner` under `name`.
    pub fn named(name: impl Into<String>, inner: Arc<dyn Allocator>) -> Self {
        Self { inner, name: Some(name.into()) }
    }

    /// The wrapped allocator.
    pub fn wrapped(&self) -> &Arc<dyn Allocator> {
        &self.inner
    }
}

// SAFETY: every call is forwarded unchanged to `inner`, which keeps the contract itself.
unsafe impl Allocator for AllocatorWrapper {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_else(|| self.inner.name())
    }

    fn memory_space(&self) -> crate::allocators::MemorySpace {
        self.inner.memory_space()
    }

    #[inline]
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        self.inner.allocate_raw(layout, attrs)
    }

    #[inline]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: blocks of this wrapper are blocks of `inner`; the caller's promise carries over.
        unsafe { self.inner.deallocate_raw(ptr, layout) }
    }

    forward_size_queries!(inner);

    fn stats(&self) -> Option<AllocatorStats> {
        self.inner.stats()
    }

    fn clear_stats(&self) -> bool {
        self.inner.clear_stats()
    }
}
