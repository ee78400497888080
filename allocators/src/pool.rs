//! [`PoolAllocator`]: TensorFlow's pool allocator: freed buffers are kept in free lists by
//! rounded size and handed out again, the least recently used evicted past a size limit.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, BuildError, dangling};

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
    /// Bytes held in free lists.
    pub cached_bytes: u64,
    /// Buffers held in free lists.
    pub cached_buffers: u64,
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
    /// Live buffers: address -> (requested, rounded, align).
    live: FastMap<usize, (usize, usize, usize)>,
    size_limit: usize,
    stats: PoolStats,
    num_allocs: u64,
    num_frees: u64,
    in_use: usize,
    peak_in_use: usize,
    largest: usize,
    peak_reserved: usize,
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

    /// Removes the least recently freed buffer; returns it.
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
        self.stats.evictions += 1;
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

    fn reserved(&self) -> usize {
        self.in_use + self.stats.cached_bytes as usize
    }
}

/// Keeps freed buffers of an inner allocator in free lists by rounded size (powers of two by
/// default) and hands them out again, as TensorFlow's `PoolAllocator` does for pinned host
/// memory. Past `size_limit` cached bytes the least recently freed buffers go back to the inner
/// allocator; with auto-resize the limit doubles when that happens often while requests still
/// miss the pool.
///
/// Stats count rounded sizes: `bytes_in_use` is what is handed out, `bytes_reserved` that plus
/// what is cached; [`pool_stats`](Self::pool_stats) adds hits, misses and evictions.
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
    inner: Arc<dyn Allocator>,
    rounding: SizeRounding,
    auto_resize: bool,
    pool: Mutex<Pool>,
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

    /// Hits, misses, evictions and what is cached.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.lock().stats
    }

    /// Returns every cached buffer to the inner allocator.
    pub fn trim(&self) {
        let mut pool = self.pool.lock();
        while let Some((ptr, class)) = pool.evict_one() {
            pool.stats.evictions -= 1;
            self.release(ptr, class);
        }
    }

    fn release(&self, ptr: usize, (size, align): (usize, usize)) {
        if let (Some(p), Ok(layout)) = (NonNull::new(ptr as *mut u8), Layout::from_size_align(size, align)) {
            // SAFETY: the buffer was allocated from `inner` with exactly this layout, was freed
            // into the pool by its user, and has just been removed from the pool.
            unsafe { self.inner.deallocate_raw(p, layout) };
        }
    }

    #[cold]
    #[track_caller]
    fn refuse_free(&self, ptr: NonNull<u8>, layout: Layout, why: &str) -> ! {
        panic!(
            "PoolAllocator '{}': refusing to free {ptr:p} ({} bytes, align {}): {why}",
            self.name,
            layout.size(),
            layout.align()
        )
    }
}

// SAFETY: buffers come from `inner` (which keeps the memory contract) with a layout at least as
// large and as aligned as the request; a buffer is handed out only when it is not live, and goes
// back to `inner` only from the pool (never while live). Peak >= in use by construction.
unsafe impl Allocator for PoolAllocator {
    fn name(&self) -> &str {
        &self.name
    }

    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        let rounded = self
            .rounding
            .round(layout.size())
            .and_then(|n| Layout::from_size_align(n, layout.align()).ok())
            .ok_or_else(|| AllocError::new(AllocErrorKind::SizeOverflow, layout, &self.name))?;
        let class = (rounded.size(), rounded.align());
        let mut pool = self.pool.lock();
        let ptr = match pool.take(class) {
            Some(p) => {
                pool.stats.hits += 1;
                p
            }
            None => {
                pool.stats.misses += 1;
                let got = match self.inner.allocate_raw(rounded, attrs) {
                    Ok(p) => Ok(p),
                    // Out of memory with buffers cached: give them back and try once more.
                    Err(_) if pool.stats.cached_buffers > 0 => {
                        while let Some((p, c)) = pool.evict_one() {
                            self.release(p, c);
                        }
                        self.inner.allocate_raw(rounded, attrs)
                    }
                    Err(e) => Err(e),
                };
                match got {
                    Ok(p) => p.as_ptr() as usize,
                    Err(e) => {
                        pool.num_ooms += 1;
                        return Err(e);
                    }
                }
            }
        };
        pool.live.insert(ptr, (layout.size(), class.0, class.1));
        pool.num_allocs += 1;
        pool.in_use += class.0;
        pool.peak_in_use = pool.peak_in_use.max(pool.in_use);
        pool.largest = pool.largest.max(layout.size());
        pool.peak_reserved = pool.peak_reserved.max(pool.reserved());
        drop(pool);
        NonNull::new(ptr as *mut u8).ok_or_else(|| AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.name))
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let mut pool = self.pool.lock();
        let key = ptr.as_ptr() as usize;
        let Some((requested, size, align)) = pool.live.remove(&key) else {
            drop(pool);
            self.refuse_free(ptr, layout, "it was never handed out by this pool, or was already freed");
        };
        if requested != layout.size() {
            pool.live.insert(key, (requested, size, align));
            drop(pool);
            self.refuse_free(ptr, layout, &format!("it was allocated with {requested} bytes"));
        }
        pool.num_frees += 1;
        pool.in_use -= size;
        if size > pool.size_limit {
            drop(pool);
            return self.release(key, (size, align));
        }
        pool.put(key, (size, align));
        while pool.stats.cached_bytes as usize > pool.size_limit {
            let Some((p, c)) = pool.evict_one() else { break };
            self.release(p, c);
            if self.auto_resize {
                pool.maybe_grow();
            }
        }
    }

    fn tracks_allocation_sizes(&self) -> bool {
        true
    }

    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.pool.lock().live.get(&(ptr.as_ptr() as usize)).map(|l| l.0)
    }

    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.pool.lock().live.get(&(ptr.as_ptr() as usize)).map(|l| l.1)
    }

    fn stats(&self) -> Option<AllocatorStats> {
        let pool = self.pool.lock();
        let largest_cached = pool.classes.iter().filter(|(_, v)| !v.is_empty()).map(|(c, _)| c.0).max();
        Some(AllocatorStats {
            num_allocs: pool.num_allocs,
            num_frees: pool.num_frees,
            bytes_in_use: pool.in_use as u64,
            peak_bytes_in_use: pool.peak_in_use as u64,
            largest_alloc_size: pool.largest as u64,
            bytes_limit: None,
            bytes_reserved: pool.reserved() as u64,
            peak_bytes_reserved: pool.peak_reserved as u64,
            largest_free_block_bytes: Some(largest_cached.unwrap_or(0) as u64),
            fragmentation: None,
            num_alloc_retries: 0,
            num_ooms: pool.num_ooms,
        })
    }

    fn clear_stats(&self) -> bool {
        let mut pool = self.pool.lock();
        pool.num_allocs = 0;
        pool.num_frees = 0;
        pool.peak_in_use = pool.in_use;
        pool.largest = 0;
        pool.peak_reserved = pool.reserved();
        true
    }
}

impl Drop for PoolAllocator {
    fn drop(&mut self) {
        self.trim();
    }
}

impl fmt::Debug for PoolAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolAllocator")
            .field("name", &self.name)
            .field("inner", &self.inner)
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
    /// The most bytes kept in free lists (default 256 MiB; 0 turns caching off).
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
        Ok(PoolAllocator {
            name: self.name,
            inner: self.inner,
            rounding: self.rounding,
            auto_resize: self.auto_resize,
            pool: Mutex::new(Pool {
                newest: NIL,
                oldest: NIL,
                size_limit,
                stats: PoolStats { size_limit: self.size_limit, ..PoolStats::default() },
                ..Pool::default()
            }),
        })
    }
}
