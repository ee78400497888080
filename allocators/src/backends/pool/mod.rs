//! [`PoolAllocator`]: TensorFlow's pool allocator: freed buffers are kept in free lists by
//! rounded size and handed out again, the least recently used evicted past a size limit; per-thread
//! caches in front; large requests served by an expandable BFC that merges what they free.

mod lru;
mod thread_cache;

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use lru::Pool;
pub use thread_cache::THREAD_CACHE_MAX_CLASS;
use thread_cache::{Core, ThreadCache};

use crate::observe::{self, Layer};
use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, BfcAllocator, BuildError, PerThread,
    StatsCounters, dangling,
};

/// How a request's size is rounded to pick its free list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SizeRounding {
    /// Up to the next power of two (TensorFlow's `BasicRoundUp`), the default.
    #[default]
    PowerOfTwo,
    /// Up to a multiple of this many bytes (must be positive).
    Multiple(usize),
    /// Not at all: only requests of exactly the same size share a free list.
    Exact,
}

impl SizeRounding {
    fn round(self, n: usize) -> Option<usize> {
        match self {
            Self::PowerOfTwo => n.checked_next_power_of_two(),
            Self::Multiple(m) => n.checked_next_multiple_of(m),
            Self::Exact => Some(n),
        }
    }
}

/// The default size above which requests go to the pool's large allocator: 1 MiB.
pub const DEFAULT_LARGE_THRESHOLD: u64 = 1 << 20;

/// The pool's own figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct PoolStats {
    /// Requests served from a free list.
    pub hits: u64,
    /// Requests that went to the inner allocator.
    pub misses: u64,
    /// Freed buffers put in the pool.
    pub puts: u64,
    /// Buffers returned to the inner allocator to stay under the size limit.
    pub evictions: u64,
    /// Bytes held in the shared pool's free lists (bounded by `size_limit`).
    pub cached_bytes: u64,
    /// Buffers held in the shared pool's free lists.
    pub cached_buffers: u64,
    /// Bytes held in the threads' caches (outside `size_limit`).
    pub thread_cached_bytes: u64,
    /// Buffers held in the threads' caches.
    pub thread_cached_buffers: u64,
    /// The current size limit on cached bytes (grown by auto-resize).
    pub size_limit: u64,
    /// Requests above the large threshold, served by the large allocator.
    #[serde(default)]
    pub large_allocations: u64,
}

/// Keeps freed buffers of an inner allocator in free lists by rounded size (powers of two by
/// default) and hands them out again, as TensorFlow's `PoolAllocator` does for pinned host
/// memory. Past `size_limit` cached bytes the least recently freed buffers go back to the inner
/// allocator; with auto-resize the limit grows as TensorFlow's does (10% per 1000 evictions while
/// evictions and misses are both frequent).
///
/// In front of the shared pool, each thread keeps a small cache (8 classes of up to 16 buffers,
/// for rounded sizes up to [`THREAD_CACHE_MAX_CLASS`]), so a hit of a small size takes no lock
/// and no locked instruction; a thread's cache goes back to the shared pool when the thread
/// exits, and [`release_cached`](Allocator::release_cached) empties every thread's cache.
///
/// **Large requests** (above 1 MiB by default, [`PoolBuilder::large_threshold`]) do not go to
/// power-of-two free lists, which waste up to half of each block and keep blocks of sizes never
/// asked for again: they go to a [`BfcAllocator`] over expandable memory (the default large
/// allocator, [`PoolBuilder::large_allocator`]), which splits and merges them and keeps their
/// memory for reuse until [`release_cached`](Allocator::release_cached). This is on by default
/// when the inner allocator has no byte limit (a limited inner allocator keeps serving large
/// requests, so its limit holds).
///
/// Stats count rounded sizes: `bytes_in_use` is what is handed out (the class size, or the size
/// rounded to 256 bytes for a large request), `bytes_reserved` all that is held (in use, cached,
/// and the large allocator's committed memory); `peak_bytes_reserved` is the sum of the two
/// parts' peaks. [`pool_stats`](Self::pool_stats) adds hits, misses and evictions. Like
/// TensorFlow's pool it keeps no per-pointer records: freeing a pointer it did not hand out, or
/// with another layout, breaks the [`Allocator`] contract; wrap it in a tracking allocator to
/// have such frees caught.
///
/// ```
/// use std::sync::Arc;
/// use tensormem_allocators::{Allocator, AllocatorExt, PoolAllocator, SystemAllocator};
///
/// let pool = PoolAllocator::builder(Arc::new(SystemAllocator::new())).size_limit(1 << 20).build()?;
/// let a = pool.allocate::<u8>(3000)?; // miss: 4096 bytes from the system
/// // SAFETY: `a` came from `allocate::<u8>(3000)` on `pool`.
/// unsafe { pool.deallocate(a, 3000) }; // cached
/// let b = pool.allocate::<u8>(4000)?; // hit: same 4096-byte class
/// assert_eq!(a, b);
/// let p = pool.pool_stats();
/// assert_eq!((p.hits, p.misses), (1, 1));
/// // SAFETY: as above.
/// unsafe { pool.deallocate(b, 4000) };
/// assert_eq!(pool.release_cached(), 4096, "every thread's cache goes back");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PoolAllocator {
    name: String,
    rounding: SizeRounding,
    /// Whether small classes go through the thread caches (not when caching is off).
    thread_caches: bool,
    caches: PerThread<ThreadCache>,
    counters: StatsCounters,
    /// Requests above `large.0` bytes go to `large.1`.
    large: Option<(usize, Arc<dyn Allocator>)>,
    large_allocations: core::sync::atomic::AtomicU64,
}

/// Bytes a large request is counted as: the 256-byte multiple a BFC hands out.
fn large_size(n: usize) -> usize {
    n.div_ceil(256).saturating_mul(256)
}

impl PoolAllocator {
    /// A builder over `inner`.
    pub fn builder(inner: Arc<dyn Allocator>) -> PoolBuilder {
        PoolBuilder {
            inner,
            name: "pool".to_owned(),
            size_limit: 256 << 20,
            rounding: SizeRounding::default(),
            auto_resize: true,
            large_threshold: Some(DEFAULT_LARGE_THRESHOLD),
            large: None,
            huge_pages: true,
        }
    }

    fn core(&self) -> &Core {
        self.caches.shared()
    }

    /// The allocator large requests go to, and the size above which they do, if routing is on.
    pub fn large_allocator(&self) -> Option<(usize, &Arc<dyn Allocator>)> {
        self.large.as_ref().map(|(t, a)| (*t, a))
    }

    /// Hits, misses, evictions and what is cached.
    pub fn pool_stats(&self) -> PoolStats {
        let mut stats = self.core().pool.lock().stats;
        self.caches.for_each(|c| {
            let (bytes, n) = c.cached();
            stats.hits += c.hits.load(Relaxed);
            stats.thread_cached_bytes += bytes;
            stats.thread_cached_buffers += n;
        });
        stats.large_allocations = self.large_allocations.load(Relaxed);
        stats
    }

    /// Gives every cached buffer back: [`release_cached`](Allocator::release_cached).
    pub fn trim(&self) -> usize {
        self.release_cached()
    }

    #[inline(always)]
    fn class(&self, layout: Layout) -> Option<(usize, usize)> {
        let size = self.rounding.round(layout.size())?;
        Layout::from_size_align(size, layout.align()).ok()?;
        Some((size, layout.align()))
    }

    /// The large allocator, if `layout` is one of its requests.
    #[inline(always)]
    fn large_for(&self, layout: Layout) -> Option<&Arc<dyn Allocator>> {
        match &self.large {
            Some((threshold, a)) if layout.size() > *threshold => Some(a),
            _ => None,
        }
    }

    #[inline(never)]
    fn allocate_large(
        &self,
        large: &Arc<dyn Allocator>,
        layout: Layout,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        let got = match observe::nested(|| large.allocate_raw(layout, attrs)) {
            Err(_) if self.release_cached() > 0 => observe::nested(|| large.allocate_raw(layout, attrs)),
            other => other,
        };
        let p = got.inspect_err(|e| observe::refused(&self.name, e, None))?;
        self.large_allocations.fetch_add(1, Relaxed);
        self.counters.record_alloc(large_size(layout.size()));
        observe::allocated(Layer::Caching, &self.name, p.as_ptr() as usize, layout.size(), large_size(layout.size()));
        Ok(p)
    }

    /// A buffer from the shared pool or, on a miss, from the inner allocator.
    #[inline(never)]
    fn allocate_shared(
        &self,
        layout: Layout,
        class: (usize, usize),
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        let core = self.core();
        let mut pool = core.pool.lock();
        if let Some(p) = pool.take(class) {
            drop(pool);
            return NonNull::new(p as *mut u8)
                .ok_or_else(|| AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.name));
        }
        drop(pool);
        // `class` was checked to make a valid layout.
        let rounded = Layout::from_size_align(class.0, class.1)
            .map_err(|_| AllocError::new(AllocErrorKind::SizeOverflow, layout, &self.name))?;
        let got = match observe::nested(|| core.inner.allocate_raw(rounded, attrs)) {
            // Out of memory: give back what every thread caches (the caller's own cache
            // included) and try once more.
            Err(_) if self.release_cached() > 0 => observe::nested(|| core.inner.allocate_raw(rounded, attrs)),
            other => other,
        };
        let mut pool = core.pool.lock();
        match got {
            Ok(p) => {
                pool.held += class.0 as u64;
                pool.peak_held = pool.peak_held.max(pool.held);
                Ok(p)
            }
            Err(e) => {
                pool.num_ooms += 1;
                drop(pool);
                observe::refused(&self.name, &e, None);
                Err(e)
            }
        }
    }
}

// SAFETY: buffers come from `inner` or the large allocator (which keep the memory contract) with
// a layout at least as large and as aligned as the request, and a cached buffer is handed out
// only after its user freed it (the caller's promise under the `Allocator` contract); buffers go
// back to `inner` only from the caches, and a large request is freed to the allocator that
// served it (the same size decides both ways). Peak >= in use: the stats come from
// `StatsCounters`.
unsafe impl Allocator for PoolAllocator {
    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// The inner allocator's: the pool keeps its free lists outside the buffers, so it pools
    /// device memory as well as host memory.
    fn memory_space(&self) -> crate::MemorySpace {
        self.core().inner.memory_space()
    }

    #[inline]
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        if let Some(large) = self.large_for(layout) {
            return self.allocate_large(large, layout, attrs);
        }
        let class =
            self.class(layout).ok_or_else(|| AllocError::new(AllocErrorKind::SizeOverflow, layout, &self.name))?;
        let hit = if self.thread_caches && class.0 <= THREAD_CACHE_MAX_CLASS {
            self.caches.with_or(|| None, |cache, _| cache.pop(class))
        } else {
            None
        };
        let ptr = match hit.and_then(|p| NonNull::new(p as *mut u8)) {
            Some(p) => p,
            None => self.allocate_shared(layout, class, attrs)?,
        };
        self.counters.record_alloc(class.0);
        observe::allocated(Layer::Caching, &self.name, ptr.as_ptr() as usize, layout.size(), class.0);
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        observe::freed(Layer::Caching, &self.name, ptr.as_ptr() as usize, layout.size());
        if let Some(large) = self.large_for(layout) {
            self.counters.record_free(large_size(layout.size()));
            // SAFETY: requests of this size went to `large` (see `allocate_raw`), so the caller's
            // promise about `ptr` and `layout` holds for it.
            return observe::nested(|| unsafe { large.deallocate_raw(ptr, layout) });
        }
        // The caller promises `layout` is the allocation's, so this is the class it came from.
        let Some(class) = self.class(layout) else { return };
        self.counters.record_free(class.0);
        let key = ptr.as_ptr() as usize;
        let kept = self.thread_caches
            && class.0 <= THREAD_CACHE_MAX_CLASS
            && self.caches.with_or(|| false, |cache, core| cache.push(key, class, core));
        if !kept {
            self.core().put(key, class);
        }
    }

    fn stats(&self) -> Option<AllocatorStats> {
        let mut s = self.counters.stats();
        let pool = self.core().pool.lock();
        s.bytes_reserved = pool.held;
        s.peak_bytes_reserved = pool.peak_held;
        s.num_ooms = pool.num_ooms;
        let mut largest = pool.largest_cached();
        drop(pool);
        self.caches.for_each(|c| largest = largest.max(c.largest_cached()));
        if let Some(l) = self.large.as_ref().and_then(|(_, a)| a.stats()) {
            s.bytes_reserved += l.bytes_reserved;
            s.peak_bytes_reserved += l.peak_bytes_reserved;
            s.num_ooms += l.num_ooms;
            largest = largest.max(l.largest_free_block_bytes.unwrap_or(0) as usize);
        }
        s.largest_free_block_bytes = Some(largest as u64);
        Some(s)
    }

    fn clear_stats(&self) -> bool {
        self.counters.clear();
        let mut pool = self.core().pool.lock();
        pool.peak_held = pool.held;
        drop(pool);
        if let Some((_, a)) = &self.large {
            a.clear_stats();
        }
        true
    }

    /// Empties every thread's cache (not only the caller's) and the shared pool into the inner
    /// allocator, and releases the large allocator's free memory. Returns the bytes given back.
    fn release_cached(&self) -> usize {
        let small = self.core().drain_all(&self.caches);
        let large = self.large.as_ref().map_or(0, |(_, a)| a.release_cached());
        if small + large > 0 {
            tracing::debug!(pool = %self.name, small, large, "pool: gave cached memory back");
        }
        small + large
    }
}

impl Drop for PoolAllocator {
    fn drop(&mut self) {
        // No thread can be inside a method of the pool now: every cache and the shared pool go
        // back to the inner allocator.
        self.core().drain_all(&self.caches);
    }
}

impl fmt::Debug for PoolAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolAllocator")
            .field("name", &self.name)
            .field("inner", &self.core().inner)
            .field("rounding", &self.rounding)
            .field("large", &self.large.as_ref().map(|(t, a)| (*t, a.name())))
            .field("pool", &self.pool_stats())
            .finish()
    }
}

/// Options of a [`PoolAllocator`].
#[derive(Debug)]
pub struct PoolBuilder {
    inner: Arc<dyn Allocator>,
    name: String,
    size_limit: u64,
    rounding: SizeRounding,
    auto_resize: bool,
    large_threshold: Option<u64>,
    large: Option<Arc<dyn Allocator>>,
    huge_pages: bool,
}

impl PoolBuilder {
    /// The most bytes kept in the shared pool's free lists (default 256 MiB; 0 turns caching off,
    /// thread caches included).
    #[must_use]
    pub fn size_limit(mut self, bytes: u64) -> Self {
        self.size_limit = bytes;
        self
    }

    /// How sizes are rounded to pick a free list (default: powers of two).
    #[must_use]
    pub fn rounding(mut self, rounding: SizeRounding) -> Self {
        self.rounding = rounding;
        self
    }

    /// Grow the size limit when evictions are frequent, as TensorFlow's pool does (default on).
    #[must_use]
    pub fn auto_resize(mut self, on: bool) -> Self {
        self.auto_resize = on;
        self
    }

    /// Requests larger than this go to the large allocator instead of the free lists (default
    /// 1 MiB); `None` keeps every request in the free lists (TensorFlow's pool).
    #[must_use]
    pub fn large_threshold(mut self, bytes: Option<u64>) -> Self {
        self.large_threshold = bytes;
        self
    }

    /// The allocator for large requests. Default: a [`BfcAllocator`] named `<name>.large` over
    /// expandable OS memory, limited to the machine's physical memory (address space is
    /// reserved, memory committed as needed), with the BFC's default
    /// [peak headroom](crate::BfcBuilder::peak_headroom) (on Linux its reserved memory stays
    /// within 4% of its peak in use, by moving pages); it is made only when the inner allocator
    /// has no byte limit (otherwise large requests go to the inner allocator). A BFC built with
    /// `peak_headroom(None)` here keeps what placement leaves instead, with no page moves
    /// (`docs/peak-headroom.md`).
    #[must_use]
    pub fn large_allocator(mut self, allocator: Arc<dyn Allocator>) -> Self {
        self.large = Some(allocator);
        self
    }

    /// Whether the default large allocator's memory asks for transparent huge pages (default
    /// on): its BFC then takes [`HugePageMemory`](crate::HugePageMemory), 2 MiB granules at
    /// 2 MiB-aligned addresses that Linux may back with 2 MiB pages, instead of
    /// [`OsMemory`](crate::OsMemory)'s 4 KiB pages. A memory-bound pass over large tensors
    /// misses the TLB 512 times less often (`docs/huge-pages.md`). A block's first
    /// touch makes whole 2 MiB pages resident; off, every page is 4 KiB, so its resident memory
    /// is exactly the pages touched. No effect with [`large_allocator`](Self::large_allocator)
    /// given.
    #[must_use]
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// The allocator's name (default `pool`).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Builds the pool.
    ///
    /// # Errors
    /// [`BuildError::EmptyName`]; [`BuildError::InvalidOption`] for `SizeRounding::Multiple(0)`
    /// or a large threshold of 0.
    pub fn build(self) -> Result<PoolAllocator, BuildError> {
        if self.name.is_empty() {
            return Err(BuildError::EmptyName);
        }
        if self.rounding == SizeRounding::Multiple(0) {
            return Err(BuildError::InvalidOption {
                allocator: self.name,
                option: "rounding",
                reason: "a multiple of 0 bytes".to_owned(),
            });
        }
        if self.large_threshold == Some(0) {
            return Err(BuildError::InvalidOption {
                allocator: self.name,
                option: "large_threshold",
                reason: "a threshold of 0 bytes would send every request to the large allocator; use None to turn routing off"
                    .to_owned(),
            });
        }
        let size_limit = usize::try_from(self.size_limit).unwrap_or(usize::MAX);
        let large = match (self.large_threshold, self.large) {
            (None, _) => None,
            (Some(t), Some(a)) => Some((usize::try_from(t).unwrap_or(usize::MAX), a)),
            (Some(t), None) => default_large(&self.name, &self.inner, self.huge_pages)
                .map(|a| (usize::try_from(t).unwrap_or(usize::MAX), a)),
        };
        let caching = size_limit > 0;
        Ok(PoolAllocator {
            name: self.name,
            rounding: self.rounding,
            thread_caches: caching,
            caches: PerThread::new(Core::new(self.inner, Pool::new(size_limit), self.auto_resize)),
            counters: StatsCounters::new(None),
            large,
            large_allocations: core::sync::atomic::AtomicU64::new(0),
        })
    }
}

/// The default large allocator: an expandable BFC over the OS as large as physical memory, when
/// the inner allocator is host memory with no limit and address space can be reserved; over
/// [`HugePageSubAllocator`](crate::HugePageSubAllocator) when `huge_pages`.
fn default_large(name: &str, inner: &Arc<dyn Allocator>, huge_pages: bool) -> Option<Arc<dyn Allocator>> {
    // The default large allocator maps host memory: over anything else (a device allocator),
    // large requests stay in the inner allocator's memory space.
    if inner.memory_space() != crate::MemorySpace::Host || inner.stats().is_some_and(|s| s.bytes_limit.is_some()) {
        return None;
    }
    let mut builder = BfcAllocator::builder().name(format!("{name}.large")).memory_limit(physical_memory());
    if huge_pages {
        builder = builder.sub_allocator(Arc::new(crate::HugePageSubAllocator));
    }
    let built = builder.expandable(true).build();
    match built {
        Ok(bfc) => Some(Arc::new(bfc)),
        Err(error) => {
            tracing::warn!(pool = name, %error, "pool: no large allocator; large requests go to the inner allocator");
            None
        }
    }
}

/// The machine's physical memory in bytes (64 GiB when it cannot be read): the limit of a host
/// BFC that is given none (the pool's large allocator, and `bfc` without `bfc.memory_limit`).
pub fn physical_memory() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads system configuration.
        let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        if pages > 0 && page > 0 {
            return (pages as u64).saturating_mul(page as u64);
        }
    }
    64 << 30
}
