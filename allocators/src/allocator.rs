//! The [`Allocator`] trait and its typed extension [`AllocatorExt`].

use core::alloc::Layout;
use core::any::Any;
use core::fmt;
use core::ptr::{self, NonNull};

use crate::{AllocError, AllocationAttributes, AllocatorStats, MemorySpace, StreamOrdered};

/// A live allocation and its address, as listed by allocators that track every pointer (see
/// [`Allocator::snapshot_live_chunks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LiveChunk {
    /// The address handed out.
    pub address: usize,
    /// The size asked for.
    pub requested_size: usize,
    /// The size set aside.
    pub allocated_size: usize,
    /// The allocation's id (unique within the allocator, from 1).
    pub allocation_id: u64,
    /// The scope (`tensormem::scope`) it was allocated in, if the allocator records it.
    #[serde(default)]
    pub tag: Option<crate::observe::Tag>,
}

/// A source of raw memory with statistics: TensorFlow's `Allocator`, in Rust.
///
/// Every backend (system, jemalloc, BFC, pool) and every decorator (tracking, retry, ...)
/// implements it; users pick one at startup through the registry and allocate through
/// `Arc<dyn Allocator>` without knowing which.
///
/// Zero-size requests never reach a backend: they return a dangling pointer aligned to the
/// layout (see [`dangling`]), count nothing, and freeing one does nothing.
///
/// # Safety
/// Implementors promise that a pointer returned by `allocate_raw(layout, ..)` is aligned to
/// `layout.align()`, valid for reads and writes of `layout.size()` bytes *in its
/// [`memory_space`](Self::memory_space)* (by host code only for host spaces; device memory is
/// valid for the device and must never be dereferenced on the host), and not handed out again
/// until it has been passed to `deallocate_raw`; that `memory_space` never changes; and that
/// the statistics methods never report `peak_bytes_in_use < bytes_in_use`.
///
/// Callers of [`deallocate_raw`](Self::deallocate_raw) promise that `ptr` denotes a block
/// *currently allocated* by this allocator (returned by `allocate_raw` of this same allocator
/// and not freed since) and that `layout` *fits* it: it is the layout the block was allocated
/// with.
///
/// # Examples
/// ```
/// use core::alloc::Layout;
/// use tensormem_allocators::{AllocationAttributes, Allocator, SystemAllocator};
///
/// let cpu = SystemAllocator::new();
/// let layout = Layout::from_size_align(4096, 64)?;
/// let p = cpu.allocate_raw(layout, &AllocationAttributes::default())?;
/// assert_eq!(p.as_ptr() as usize % 64, 0);
/// assert_eq!(cpu.stats().unwrap().bytes_in_use, 4096);
/// // SAFETY: `p` was allocated by `cpu` with `layout` and is freed once.
/// unsafe { cpu.deallocate_raw(p, layout) };
/// assert_eq!(cpu.stats().unwrap().bytes_in_use, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe trait Allocator: Send + Sync + fmt::Debug {
    /// A short name for messages and metrics (e.g. `cpu`, `jemalloc`, `bfc`).
    fn name(&self) -> &str;

    /// Where the blocks live: [`MemorySpace::Host`] unless the allocator says otherwise.
    /// Decorators forward their inner allocator's.
    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Host
    }

    /// Allocates a block of `layout.size()` bytes aligned to `layout.align()`.
    ///
    /// # Errors
    /// An [`AllocError`] saying why: out of memory, over the limit, or a layout the backend
    /// cannot honour.
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError>;

    /// Returns a block to the allocator.
    ///
    /// # Safety
    /// `ptr` must denote a block currently allocated by this allocator, and `layout` must be the
    /// layout it was allocated with.
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout);

    /// Whether [`requested_size`](Self::requested_size), [`allocated_size`](Self::allocated_size)
    /// and [`allocation_id`](Self::allocation_id) answer for this allocator's live pointers.
    fn tracks_allocation_sizes(&self) -> bool {
        false
    }

    /// The size that was asked for when `ptr` was allocated, if this allocator tracks it.
    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        let _ = ptr;
        None
    }

    /// The size actually set aside for `ptr` (at least the requested size), if tracked.
    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        let _ = ptr;
        None
    }

    /// A unique, increasing id of the allocation at `ptr`, starting from 1, if tracked.
    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        let _ = ptr;
        None
    }

    /// Like [`allocated_size`](Self::allocated_size), but may ask the backend (e.g. jemalloc's
    /// usable size) at some cost when nothing is tracked.
    fn allocated_size_slow(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.allocated_size(ptr)
    }

    /// A snapshot of the allocator's statistics, if it keeps any.
    fn stats(&self) -> Option<AllocatorStats> {
        None
    }

    /// Restarts the windowed statistics as TensorFlow does (peak := in use, allocation count
    /// := 0, largest := 0). Returns `false` if the allocator keeps no statistics.
    fn clear_stats(&self) -> bool {
        false
    }

    /// For snapshots: every live allocation, oldest first, if the allocator records them (a
    /// tracking allocator does); `None` otherwise.
    fn snapshot_live_chunks(&self) -> Option<Vec<LiveChunk>> {
        None
    }

    /// The backend at the bottom of this allocator, for what only one kind of backend knows (a
    /// BFC's [memory dump](crate::BfcAllocator::memory_dump), a pool's
    /// [statistics](crate::PoolAllocator::pool_stats)): a backend returns itself, a decorator
    /// returns the backend of the allocator it wraps, and `None` (the default) means the
    /// allocator shows none. [`AllocatorExt::backend_as`] downcasts it.
    fn backend(&self) -> Option<&dyn Any> {
        None
    }

    /// The stream-ordered extension ([`StreamOrdered`]: recording uses of a block on other
    /// device streams) of an allocator that ties blocks to streams; decorators forward their
    /// inner allocator's, and `None` (the default) means blocks are not tied to streams.
    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        None
    }

    /// Gives cached free memory back to where it came from and returns how many bytes went
    /// (TensorFlow's `ClearCache`, PyTorch's `empty_cache`). Live blocks are untouched. A caching
    /// allocator (BFC, pool) releases what it holds beyond what is in use; decorators forward
    /// it; allocators that cache nothing return 0 (the default).
    fn release_cached(&self) -> usize {
        0
    }
}

/// Typed allocation on every [`Allocator`], `dyn Allocator` included.
///
/// ```
/// use tensormem_allocators::{AllocErrorKind, AllocatorExt, SystemAllocator};
///
/// let cpu = SystemAllocator::new();
/// let p = cpu.allocate::<f32>(1024)?;
/// // SAFETY: `p` is valid for 1024 f32s.
/// unsafe { p.as_ptr().write_bytes(0, 1024) };
/// // SAFETY: `p` came from `cpu.allocate::<f32>(1024)` and is freed once.
/// unsafe { cpu.deallocate(p, 1024) };
///
/// let err = cpu.allocate::<u64>(usize::MAX).unwrap_err();
/// assert_eq!(err.kind(), AllocErrorKind::SizeOverflow);
/// # Ok::<(), tensormem_allocators::AllocError>(())
/// ```
pub trait AllocatorExt: Allocator {
    /// Allocates uninitialised room for `n` values of `T` with `T`'s alignment, with default
    /// attributes.
    ///
    /// # Errors
    /// [`AllocErrorKind::SizeOverflow`](crate::AllocErrorKind::SizeOverflow) when
    /// `n * size_of::<T>()` does not fit in a `Layout`; otherwise whatever
    /// [`allocate_raw`](Allocator::allocate_raw) returns.
    fn allocate<T>(&self, n: usize) -> Result<NonNull<T>, AllocError> {
        let layout =
            Layout::array::<T>(n).map_err(|_| AllocError::array_overflow(n, Layout::new::<T>(), self.name()))?;
        self.allocate_raw(layout, &AllocationAttributes::default()).map(NonNull::cast)
    }

    /// Frees room for `n` values of `T` allocated by [`allocate`](Self::allocate). Runs no
    /// destructors.
    ///
    /// # Safety
    /// `ptr` must come from `self.allocate::<T>(n)` with the same `n` and not have been freed.
    unsafe fn deallocate<T>(&self, ptr: NonNull<T>, n: usize) {
        // `allocate` succeeded with this `n`, so the layout is valid; a mismatch is a broken
        // contract that we refuse to turn into a wrong free.
        let Ok(layout) = Layout::array::<T>(n) else {
            panic!(
                "allocator '{}': deallocate::<{}>({n}) with a count no allocation could have had",
                self.name(),
                core::any::type_name::<T>()
            );
        };
        // SAFETY: the caller promises `ptr` came from `allocate::<T>(n)` on this allocator,
        // which allocated it with exactly `layout`.
        unsafe { self.deallocate_raw(ptr.cast(), layout) }
    }

    /// The [backend](Allocator::backend) at the bottom of this allocator if it is a `B`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensormem_allocators::{Allocator, AllocatorExt, BfcAllocator, PoolAllocator, SystemAllocator};
    ///
    /// let bfc: Arc<dyn Allocator> = Arc::new(BfcAllocator::builder().memory_limit(1 << 20).build()?);
    /// let dump = bfc.backend_as::<BfcAllocator>().map(BfcAllocator::memory_dump);
    /// assert_eq!(dump.map(|d| d.allocator), Some("bfc".to_owned()));
    /// assert!(bfc.backend_as::<PoolAllocator>().is_none());
    /// assert!(SystemAllocator::new().backend_as::<SystemAllocator>().is_some());
    /// # Ok::<(), tensormem_allocators::BuildError>(())
    /// ```
    fn backend_as<B: Allocator + 'static>(&self) -> Option<&B> {
        self.backend()?.downcast_ref()
    }
}

impl<A: Allocator + ?Sized> AllocatorExt for A {}

/// The pointer every allocator returns for a zero-size request: non-null, aligned to
/// `layout.align()`, and never to be dereferenced.
///
/// ```
/// use core::alloc::Layout;
/// let p = tensormem_allocators::dangling(Layout::from_size_align(0, 256).unwrap());
/// assert_eq!(p.as_ptr() as usize, 256);
/// ```
#[inline]
pub fn dangling(layout: Layout) -> NonNull<u8> {
    NonNull::new(ptr::without_provenance_mut(layout.align())).unwrap_or(NonNull::dangling())
}

// SAFETY: every call is forwarded to the shared allocator, which keeps the contract itself.
unsafe impl<A: Allocator + ?Sized> Allocator for std::sync::Arc<A> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn memory_space(&self) -> MemorySpace {
        (**self).memory_space()
    }

    #[inline]
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        (**self).allocate_raw(layout, attrs)
    }

    #[inline]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's promise for `self` is a promise for the allocator it shares.
        unsafe { (**self).deallocate_raw(ptr, layout) }
    }

    fn tracks_allocation_sizes(&self) -> bool {
        (**self).tracks_allocation_sizes()
    }

    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        (**self).requested_size(ptr)
    }

    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        (**self).allocated_size(ptr)
    }

    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        (**self).allocation_id(ptr)
    }

    fn allocated_size_slow(&self, ptr: NonNull<u8>) -> Option<usize> {
        (**self).allocated_size_slow(ptr)
    }

    fn stats(&self) -> Option<AllocatorStats> {
        (**self).stats()
    }

    fn clear_stats(&self) -> bool {
        (**self).clear_stats()
    }

    fn snapshot_live_chunks(&self) -> Option<Vec<LiveChunk>> {
        (**self).snapshot_live_chunks()
    }

    fn backend(&self) -> Option<&dyn Any> {
        (**self).backend()
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        (**self).stream_ordered()
    }

    fn release_cached(&self) -> usize {
        (**self).release_cached()
    }
}
