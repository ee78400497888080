//! The shared pool behind the thread caches: free lists by size class, least recently freed
//! evicted past a byte limit, and TensorFlow's auto-resize of that limit.

use super::PoolStats;
use crate::word_map::WordMap;

/// A size class: `(rounded size, alignment)`.
pub(super) type Class = (usize, usize);

/// TensorFlow's auto-resize (`PoolAllocator::EvictOne`): checked every this many evictions...
const CHECK_INTERVAL: u64 = 1000;
/// ...the limit grows by this factor when both the eviction rate and the miss rate are above
/// [`TOLERABLE`]; the window counters then restart.
const INCREASE_FACTOR: f64 = 1.1;
/// TensorFlow's `kTolerable`.
const TOLERABLE: f64 = 2e-3;

#[derive(Clone, Copy, Debug)]
struct Cached {
    ptr: usize,
    class: Class,
    /// Neighbours in the LRU list (toward newer, toward older).
    newer: usize,
    older: usize,
    /// Index in its class's stack.
    slot: usize,
}

const NIL: usize = usize::MAX;

/// The counts TensorFlow's auto-resize looks at, restarted after each resize.
#[derive(Debug, Default)]
struct Window {
    puts: u64,
    evictions: u64,
    hits: u64,
    misses: u64,
}

/// Free lists by class with an LRU order over all of them.
#[derive(Debug)]
pub(super) struct Pool {
    entries: Vec<Cached>,
    vacant: Vec<usize>,
    /// Most and least recently freed.
    newest: usize,
    oldest: usize,
    classes: WordMap<Class, Vec<usize>>,
    pub(super) size_limit: usize,
    pub(super) stats: PoolStats,
    window: Window,
    /// Bytes currently held from the inner allocator (in use, in the pool, in thread caches).
    pub(super) held: u64,
    pub(super) peak_held: u64,
    pub(super) num_ooms: u64,
}

impl Pool {
    pub(super) fn new(size_limit: usize) -> Self {
        Self {
            entries: Vec::new(),
            vacant: Vec::new(),
            newest: NIL,
            oldest: NIL,
            classes: WordMap::default(),
            size_limit,
            stats: PoolStats { size_limit: size_limit as u64, ..PoolStats::default() },
            window: Window::default(),
            held: 0,
            peak_held: 0,
            num_ooms: 0,
        }
    }

    /// A cached buffer of `class`, counted as a hit; `None` is counted as a miss.
    pub(super) fn take(&mut self, class: Class) -> Option<usize> {
        let Some(idx) = self.classes.get_mut(&class).and_then(Vec::pop) else {
            self.stats.misses += 1;
            self.window.misses += 1;
            return None;
        };
        self.unlink(idx);
        let ptr = self.entries[idx].ptr;
        self.vacant.push(idx);
        self.stats.cached_bytes -= class.0 as u64;
        self.stats.cached_buffers -= 1;
        self.stats.hits += 1;
        self.window.hits += 1;
        Some(ptr)
    }

    /// Keeps a freed buffer as the most recently freed.
    pub(super) fn put(&mut self, ptr: usize, class: Class) {
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
        self.window.puts += 1;
    }

    /// Removes the least recently freed buffer and returns it (the caller gives it back to the
    /// inner allocator). Not counted as an eviction: see [`evict`](Self::evict).
    pub(super) fn pop_oldest(&mut self) -> Option<(usize, Class)> {
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
        self.held -= class.0 as u64;
        Some((ptr, class))
    }

    /// Removes the least recently freed buffer to stay under the limit, counts the eviction, and
    /// runs TensorFlow's auto-resize check when asked.
    pub(super) fn evict(&mut self, auto_resize: bool) -> Option<(usize, Class)> {
        let evicted = self.pop_oldest()?;
        self.stats.evictions += 1;
        self.window.evictions += 1;
        if auto_resize {
            self.maybe_grow();
        }
        Some(evicted)
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

    /// TensorFlow's auto-resize: every 1000 evictions, when more than 0.2% of the buffers put in
    /// the pool were evicted and more than 0.2% of requests missed, the limit grows by 10% and
    /// the counts restart, so the next check judges the new size.
    fn maybe_grow(&mut self) {
        let w = &self.window;
        if !w.evictions.is_multiple_of(CHECK_INTERVAL) || w.puts == 0 {
            return;
        }
        let eviction_rate = w.evictions as f64 / w.puts as f64;
        let requests = w.hits + w.misses;
        let miss_rate = if requests == 0 { 0.0 } else { w.misses as f64 / requests as f64 };
        if eviction_rate > TOLERABLE && miss_rate > TOLERABLE {
            let grown = (self.size_limit as f64 * INCREASE_FACTOR) as usize;
            self.size_limit = grown.max(self.size_limit + 1);
            self.stats.size_limit = self.size_limit as u64;
            self.window = Window::default();
            tracing::debug!(size_limit = self.size_limit, eviction_rate, miss_rate, "pool: auto-resize grew the limit");
        }
    }

    /// The largest cached class.
    pub(super) fn largest_cached(&self) -> usize {
        self.classes.iter().filter(|(_, v)| !v.is_empty()).map(|(c, _)| c.0).max().unwrap_or(0)
    }
}
