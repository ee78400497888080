//! [`PoolAllocator`]: TensorFlow's pool allocator: freed buffers are kept in free lists by
//! rounded size and handed out again, the least recently used evicted past a size limit.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, BuildError, PerThread, StatsCounters,
    ThreadValue, dangling,
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

/// Evictions between two checks of whether the pool should grow.
const CHECK_INTERVAL: u64 = 100;
/// Grow when more than this share of the buffers put in the pool were later evicted...
const MIN_EVICTION_RATE: f64 = 0.1;
/// ...and more than this share of requests missed the pool.
const TOLERABLE_MISS_RATE: f64 = 2e-3;

/// The pool's own figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
}

#[derive(Clone, Copy, Debug)]
struct Cached {
    ptr: usize,
    class: (usize, usize),
    /// Neighbours in the LRU list (toward newer, toward older).
    newer: usize,
    older: usize,
    /// Index in its class's stack.
    slot: usize,
}

const NIL: usize = usize::MAX;

/// FxHash-style word hasher: addresses and size classes are already well spread, and SipHash
/// would cost more than the pool operation itself.
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_usize(b as usize);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

#[derive(Debug, Default)]
struct Pool {
    entries: Vec<Cached>,
    vacant: Vec<usize>,
    /// Most and least recently freed.
    newest: usize,
    oldest: usize,
    classes: FastMap<(usize, usize), Vec<usize>>,
    size_limit: usize,
    stats: PoolStats,
    /// Bytes currently held from the inner allocator (in use, in the pool, in thread caches).
    held: u64,
    peak_held: u64,
    num_ooms: u64,
}

impl Pool {
    fn take(&mut self, class: (usize, usize)) -> Option<usize> {
        let idx = self.classes.get_mut(&class)?.pop()?;
        self.unlink(idx);
        let ptr = self.entries[idx].ptr;
        self.vacant.push(idx);
        self.stats.cached_bytes -= class.0 as u64;
        self.stats.cached_buffers -= 1;
        Some(ptr)
    }

    fn put(&mut self, ptr: usize, class: (usize, usize)) {
        let stack = self.classes.entry(class).or_default();
        let e = Cached { ptr, class, newer: NIL, older: self.newest, slot: stack.len() };
        let idx = match self.vacant.pop() {
            Some(i) => {
                self.entries[i] = e;
                i
            }
            None => {
                self.entries.push(e);
                self.entries.len() - 1
            }
        };
        stack.push(idx);
        if self.newest != NIL {
            self.entries[self.newest].newer = idx;
        }
        self.newest = idx;
        if self.oldest == NIL {
            self.oldest = idx;
        }
        self.stats.cached_bytes += class.0 as u64;
        self.stats.cached_buffers += 1;
        self.stats.puts += 1;
    }

    /// Removes the least recently freed buffer; returns it. Callers that evict for the limit
    /// count it.
    fn evict_one(&mut self) -> Option<(usize, (usize, usize))> {
        let idx = self.oldest;
        if idx == NIL {
            return None;
        }
        let Cached { ptr, class, slot, .. } = self.entries[idx];
        let stack = self.classes.get_mut(&class)?;
        stack.swap_remove(slot);
        if let Some(&moved) = stack.get(slot) {
            self.entries[moved].slot = slot;
        }
        self.unlink(idx);
        self.vacant.push(idx);
        self.stats.cached_bytes -= class.0 as u64;
        self.stats.cached_buffers -= 1;
        Some((ptr, class))
    }

    fn unlink(&mut self, idx: usize) {
        let Cached { newer, older, .. } = self.entries[idx];
        if newer != NIL {
            self.entries[newer].older = older;
        } else {
            self.newest = older;
        }
        if older != NIL {
            self.entries[older].newer = newer;
        } else {
            self.oldest = newer;
        }
    }

    /// TensorFlow's auto-resize: when evictions are frequent and requests still miss, double the
    /// limit.
    fn maybe_grow(&mut self) {
        if self.stats.evictions % CHECK_INTERVAL != 0 || self.stats.puts == 0 {
            return;
        }
        let eviction_rate = self.stats.evictions as f64 / self.stats.puts as f64;
        let requests = self.stats.hits + self.stats.misses;
        let miss_rate = if requests == 0 { 0.0 } else { self.stats.misses as f64 / requests as f64 };
        if eviction_rate > MIN_EVICTION_RATE && miss_rate > TOLERABLE_MISS_RATE {
            self.size_limit = self.size_limit.saturating_mul(2);
            self.stats.size_limit = self.size_limit as u64;
        }
    }
}

/// Size classes a thread cache holds at once.
const MAGAZINE_CLASSES: usize = 8;
/// Buffers a thread cache holds per class.
const MAGAZINE_DEPTH: usize = 16;
/// Rounded sizes above this skip the thread caches and go straight to the shared pool.
pub const THREAD_CACHE_MAX_CLASS: usize = 64 << 10;

/// Up to `MAGAZINE_DEPTH` cached buffers of one class, written only by the owner thread.
#[derive(Debug, Default)]
struct Magazine {
    /// Rounded size of the class (0: unused).
    size: AtomicUsize,
    align: AtomicUsize,
    len: AtomicUsize,
    ptrs: [AtomicUsize; MAGAZINE_DEPTH],
}

/// One thread's magazines and hit count.
#[derive(Debug, Default)]
struct ThreadCache {
    mags: [Magazine; MAGAZINE_CLASSES],
    hits: AtomicU64,
    /// Next magazine to give back when all are taken by other classes.
    victim: AtomicUsize,
}

impl ThreadCache {
    #[inline(always)]
    fn find(&self, (size, align): (usize, usize)) -> Option<&Magazine> {
        self.mags.iter().find(|m| m.size.load(Relaxed) == size && m.align.load(Relaxed) == align)
    }

    /// Owner only: a cached buffer of `class`, if any.
    #[inline(always)]
    fn pop(&self, class: (usize, usize)) -> Option<usize> {
        let m = self.find(class)?;
        let len = m.len.load(Relaxed);
        if len == 0 {
            return None;
        }
        m.len.store(len - 1, Relaxed);
        bump(&self.hits);
        Some(m.ptrs[len - 1].load(Relaxed))
    }

    /// Owner only: keeps `ptr`; false when its magazine is full.
    #[inline(always)]
    fn push(&self, ptr: usize, class: (usize, usize), core: &Core) -> bool {
        let m = match self.find(class) {
            Some(m) => m,
            None => self.claim(class, core),
        };
        let len = m.len.load(Relaxed);
        if len == MAGAZINE_DEPTH {
            return false;
        }
        m.ptrs[len].store(ptr, Relaxed);
        m.len.store(len + 1, Relaxed);
        true
    }

    /// Owner only: a magazine for `class`, emptying another class's into the shared pool if
    /// they are all taken.
    #[cold]
    fn claim(&self, (size, align): (usize, usize), core: &Core) -> &Magazine {
        let m = match self.mags.iter().find(|m| m.len.load(Relaxed) == 0) {
            Some(m) => m,
            None => {
                let i = self.victim.load(Relaxed) % MAGAZINE_CLASSES;
                self.victim.store(i + 1, Relaxed);
                core.absorb(&self.mags[i]);
                &self.mags[i]
            }
        };
        m.size.store(size, Relaxed);
        m.align.store(align, Relaxed);
        m
    }

    fn cached(&self) -> (u64, u64) {
        self.mags.iter().fold((0, 0), |(bytes, n), m| {
            let len = m.len.load(Relaxed) as u64;
            (bytes + len * m.size.load(Relaxed) as u64, n + len)
        })
    }
}

fn bump(a: &AtomicU64) {
    a.store(a.load(Relaxed) + 1, Relaxed);
}

impl ThreadValue for ThreadCache {
    type Shared = Core;

    /// The exiting thread's buffers go to the shared pool.
    fn retire(&self, core: &Core) {
        for m in &self.mags {
            core.absorb(m);
        }
    }
}

/// What all threads share: the inner allocator and the LRU pool behind the thread caches.
#[derive(Debug)]
struct Core {
    inner: Arc<dyn Allocator>,
    pool: Mutex<Pool>,
    auto_resize: bool,
}

impl Core {
    /// Puts a freed buffer in the shared pool, evicting past the limit.
    fn put(&self, ptr: usize, class: (usize, usize)) {
        let mut pool = self.pool.lock();
        if class.0 > pool.size_limit {
            pool.held -= class.0 as u64;
            drop(pool);
            return self.release(ptr, class);
        }
        pool.put(ptr, class);
        while pool.stats.cached_bytes as usize > pool.size_limit {
            let Some((p, c)) = pool.evict_one() else { break };
            pool.stats.evictions += 1;
            pool.held -= c.0 as u64;
            self.release(p, c);
            if self.auto_resize {
                pool.maybe_grow();
            }
        }
    }

    /// Moves a magazine's buffers to the shared pool.
    fn absorb(&self, m: &Magazine) {
        let class = (m.size.load(Relaxed), m.align.load(Relaxed));
        let len = m.len.load(Relaxed);
        m.len.store(0, Relaxed);
        for slot in &m.ptrs[..len] {
            self.put(slot.load(Relaxed), class);
        }
    }

    fn release(&self, ptr: usize, (size, align): (usize, usize)) {
        if let (Some(p), Ok(layout)) = (NonNull::new(ptr as *mut u8), Layout::from_size_align(size, align)) {
            // SAFETY: the buffer was allocated from `inner` with exactly this layout, was freed
            // into the pool by its user, and has just been removed from the pool.
            unsafe { self.inner.deallocate_raw(p, layout) };
        }
    }
}

/// Keeps freed buffers of an inner allocator in free lists by rounded size (powers of two by
/// default) and hands them out again, as TensorFlow's `PoolAllocator` does for pinned host
/// memory. Past `size_limit` cached bytes the least recently freed buffers go back to the inner
/// allocator; with auto-resize the limit doubles when that happens often while requests still
/// miss the pool.
///
/// In front of the shared pool, each thread keeps a small cache (8 classes of up to 16 buffers,
/// for rounded sizes up to [`THREAD_CACHE_MAX_CLASS`]), so a hit of a small size takes no lock;
/// a thread's cache goes back to the shared pool when the thread exits. These caches are outside
/// `size_limit` (at most 8 MiB per thread) and [`trim`](Self::trim) does not reach them.
///
/// Stats count rounded sizes: `bytes_in_use` is what is handed out, `bytes_reserved` all that is
/// held from the inner allocator; [`pool_stats`](Self::pool_stats) adds hits, misses and
/// evictions. Like TensorFlow's pool it keeps no per-pointer records: freeing a pointer it did
/// not hand out, or with another layout, breaks the [`Allocator`] contract; wrap it in a
/// tracking allocator to have such frees caught.
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
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PoolAllocator {
    name: String,
    rounding: SizeRounding,
    /// Whether small classes go through the thread caches (not when caching is off).
    thread_caches: bool,
    caches: PerThread<ThreadCache>,
    counters: StatsCounters,
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
        }
    }

    fn core(&self) -> &Core {
        self.caches.shared()
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
        stats
    }

    /// Returns every buffer cached in the shared pool and in this thread's cache to the inner
    /// allocator (other threads' caches go back when those threads exit or the pool is dropped).
    pub fn trim(&self) {
        let core = self.core();
        self.caches.with_or(|| (), |cache, core| cache.mags.iter().for_each(|m| core.absorb(m)));
        let mut pool = core.pool.lock();
        while let Some((ptr, class)) = pool.evict_one() {
            pool.held -= class.0 as u64;
            core.release(ptr, class);
        }
    }

    #[inline(always)]
    fn class(&self, layout: Layout) -> Option<(usize, usize)> {
        let size = self.rounding.round(layout.size())?;
        Layout::from_size_align(size, layout.align()).ok()?;
        Some((size, layout.align()))
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
            pool.stats.hits += 1;
            drop(pool);
            return NonNull::new(p as *mut u8)
                .ok_or_else(|| AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.name));
        }
        pool.stats.misses += 1;
        drop(pool);
        // `class` was checked to make a valid layout.
        let rounded = Layout::from_size_align(class.0, class.1)
            .map_err(|_| AllocError::new(AllocErrorKind::SizeOverflow, layout, &self.name))?;
        let got = match core.inner.allocate_raw(rounded, attrs) {
            Err(_) if core.pool.lock().stats.cached_buffers > 0 => {
                // Out of memory with buffers cached: give them back and try once more.
                self.trim();
                core.inner.allocate_raw(rounded, attrs)
            }
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
                Err(e)
            }
        }
    }
}

// SAFETY: buffers come from `inner` (which keeps the memory contract) with a layout at least as
// large and as aligned as the request, and a cached buffer is handed out only after its user
// freed it (the caller's promise under the `Allocator` contract); buffers go back to `inner` only
// from the caches. Peak >= in use: the stats come from `StatsCounters`.
unsafe impl Allocator for PoolAllocator {
    fn name(&self) -> &str {
        &self.name
    }

    #[inline]
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
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
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
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
        let core = self.core();
        let pool = core.pool.lock();
        s.bytes_reserved = pool.held;
        s.peak_bytes_reserved = pool.peak_held;
        s.num_ooms = pool.num_ooms;
        let mut largest = pool.classes.iter().filter(|(_, v)| !v.is_empty()).map(|(c, _)| c.0).max().unwrap_or(0);
        drop(pool);
        self.caches.for_each(|c| {
            for m in c.mags.iter().filter(|m| m.len.load(Relaxed) > 0) {
                largest = largest.max(m.size.load(Relaxed));
            }
        });
        s.largest_free_block_bytes = Some(largest as u64);
        Some(s)
    }

    fn clear_stats(&self) -> bool {
        self.counters.clear();
        let mut pool = self.core().pool.lock();
        pool.peak_held = pool.held;
        true
    }
}

impl Drop for PoolAllocator {
    fn drop(&mut self) {
        // No thread can be inside a method of the pool now, so every thread cache can be emptied.
        let core = self.caches.shared();
        self.caches.for_each(|cache| cache.mags.iter().for_each(|m| core.absorb(m)));
        self.trim();
    }
}

impl fmt::Debug for PoolAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolAllocator")
            .field("name", &self.name)
            .field("inner", &self.core().inner)
            .field("rounding", &self.rounding)
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

    /// Double the size limit when evictions are frequent (default on, as in TensorFlow).
    #[must_use]
    pub fn auto_resize(mut self, on: bool) -> Self {
        self.auto_resize = on;
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
    /// [`BuildError::EmptyName`]; [`BuildError::InvalidOption`] for `SizeRounding::Multiple(0)`.
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
        let size_limit = usize::try_from(self.size_limit).unwrap_or(usize::MAX);
        let pool = Pool {
            newest: NIL,
            oldest: NIL,
            size_limit,
            stats: PoolStats { size_limit: self.size_limit, ..PoolStats::default() },
            ..Pool::default()
        };
        Ok(PoolAllocator {
            name: self.name,
            rounding: self.rounding,
            thread_caches: size_limit > 0,
            caches: PerThread::new(Core { inner: self.inner, pool: Mutex::new(pool), auto_resize: self.auto_resize }),
            counters: StatsCounters::new(None),
        })
    }
}
