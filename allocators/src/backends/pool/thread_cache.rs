//! The per-thread caches in front of the shared pool, and how another thread empties them.
//!
//! Each thread keeps up to [`MAGAZINE_CLASSES`] classes of up to [`MAGAZINE_DEPTH`] buffers,
//! written by that thread only with plain relaxed loads and stores: a hit takes no lock and no
//! locked instruction.
//!
//! # Emptying another thread's cache
//! [`Core::drain_all`] (for `release_cached`) must take buffers out of caches whose owners may be
//! running. Each cache has a `busy` flag the owner sets around every operation and a `drain` flag
//! the drainer sets. Owner: `busy = true; light fence; if drain { busy = false; take the shared
//! path }; ...; busy = false (release)`. Drainer: `drain = true; heavy fence; wait until !busy;
//! empty the magazines; drain = false (release)`. With the asymmetric fences of
//! [`crate::barrier`] (membarrier on Linux) this is Dekker's mutual exclusion at the
//! cost of a compiler fence on the owner's side: either the owner sees `drain` and keeps out,
//! or the drainer sees `busy` and waits for the operation to end.

use core::alloc::Layout;
use core::ptr::NonNull;
use core::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Arc;

use parking_lot::Mutex;

use super::lru::{Class, Pool};
use crate::barrier;
use crate::observe;
use crate::{Allocator, PerThread, ThreadValue};

/// Size classes a thread cache holds at once.
const MAGAZINE_CLASSES: usize = 8;
/// Buffers a thread cache holds per class.
const MAGAZINE_DEPTH: usize = 16;
/// Rounded sizes above this skip the thread caches and go straight to the shared pool.
pub const THREAD_CACHE_MAX_CLASS: usize = 64 << 10;

/// Up to `MAGAZINE_DEPTH` cached buffers of one class, written only by the owner thread (or by
/// a drainer that the owner keeps out of it).
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
pub(super) struct ThreadCache {
    mags: [Magazine; MAGAZINE_CLASSES],
    pub(super) hits: AtomicU64,
    /// Next magazine to give back when all are taken by other classes.
    victim: AtomicUsize,
    /// Set by the owner while it uses the magazines.
    busy: AtomicBool,
    /// Set by a drainer that wants the magazines.
    drain: AtomicBool,
}

impl ThreadCache {
    /// Owner only: marks the cache in use; false (and not in use) while a drainer has it.
    #[inline(always)]
    fn enter(&self) -> bool {
        self.busy.store(true, Relaxed);
        barrier::light();
        if self.drain.load(Acquire) {
            self.busy.store(false, Release);
            return false;
        }
        true
    }

    #[inline(always)]
    fn leave(&self) {
        self.busy.store(false, Release);
    }

    #[inline(always)]
    fn find(&self, (size, align): Class) -> Option<&Magazine> {
        self.mags.iter().find(|m| m.size.load(Relaxed) == size && m.align.load(Relaxed) == align)
    }

    /// Owner only: a cached buffer of `class`, if any.
    #[inline(always)]
    pub(super) fn pop(&self, class: Class) -> Option<usize> {
        if !self.enter() {
            return None;
        }
        let got = self.find(class).and_then(|m| {
            let len = m.len.load(Relaxed);
            if len == 0 {
                return None;
            }
            m.len.store(len - 1, Relaxed);
            Some(m.ptrs[len - 1].load(Relaxed))
        });
        if got.is_some() {
            bump(&self.hits);
        }
        self.leave();
        got
    }

    /// Owner only: keeps `ptr`; false when its magazine is full or a drainer has the cache.
    #[inline(always)]
    pub(super) fn push(&self, ptr: usize, class: Class, core: &Core) -> bool {
        if !self.enter() {
            return false;
        }
        let m = match self.find(class) {
            Some(m) => m,
            None => self.claim(class, core),
        };
        let len = m.len.load(Relaxed);
        let kept = len < MAGAZINE_DEPTH;
        if kept {
            m.ptrs[len].store(ptr, Relaxed);
            m.len.store(len + 1, Relaxed);
        }
        self.leave();
        kept
    }

    /// Owner only (inside `enter`/`leave`): a magazine for `class`, emptying another class's
    /// into the shared pool if they are all taken.
    #[cold]
    fn claim(&self, (size, align): Class, core: &Core) -> &Magazine {
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

    /// `(bytes, buffers)` cached here.
    pub(super) fn cached(&self) -> (u64, u64) {
        self.mags.iter().fold((0, 0), |(bytes, n), m| {
            let len = m.len.load(Relaxed) as u64;
            (bytes + len * m.size.load(Relaxed) as u64, n + len)
        })
    }

    /// The largest class with a cached buffer.
    pub(super) fn largest_cached(&self) -> usize {
        self.mags.iter().filter(|m| m.len.load(Relaxed) > 0).map(|m| m.size.load(Relaxed)).max().unwrap_or(0)
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
pub(super) struct Core {
    pub(super) inner: Arc<dyn Allocator>,
    pub(super) pool: Mutex<Pool>,
    pub(super) auto_resize: bool,
    /// Held by a thread emptying other threads' caches, so that two never empty one at once.
    draining: Mutex<()>,
}

impl Core {
    pub(super) fn new(inner: Arc<dyn Allocator>, pool: Pool, auto_resize: bool) -> Self {
        barrier::init();
        Self { inner, pool: Mutex::new(pool), auto_resize, draining: Mutex::new(()) }
    }

    /// Puts a freed buffer in the shared pool, evicting past the limit.
    pub(super) fn put(&self, ptr: usize, class: Class) {
        let mut pool = self.pool.lock();
        if class.0 > pool.size_limit {
            pool.held -= class.0 as u64;
            drop(pool);
            return self.release(ptr, class);
        }
        pool.put(ptr, class);
        while pool.stats.cached_bytes as usize > pool.size_limit {
            let Some((p, c)) = pool.evict(self.auto_resize) else { break };
            self.release(p, c);
        }
    }

    /// Moves a magazine's buffers to the shared pool (owner, retiring thread, or drainer).
    fn absorb(&self, m: &Magazine) {
        let class = (m.size.load(Relaxed), m.align.load(Relaxed));
        let len = m.len.load(Relaxed);
        m.len.store(0, Relaxed);
        for slot in &m.ptrs[..len] {
            self.put(slot.load(Relaxed), class);
        }
    }

    /// Gives one buffer back to the inner allocator.
    pub(super) fn release(&self, ptr: usize, (size, align): Class) {
        if let (Some(p), Ok(layout)) = (NonNull::new(ptr as *mut u8), Layout::from_size_align(size, align)) {
            // SAFETY: the buffer was allocated from `inner` with exactly this layout, was freed
            // into the pool by its user, and has just been removed from the pool.
            observe::nested(|| unsafe { self.inner.deallocate_raw(p, layout) });
        }
    }

    /// Empties every thread's cache into the shared pool, then the shared pool into the inner
    /// allocator. Returns the bytes given back.
    pub(super) fn drain_all(&self, caches: &PerThread<ThreadCache>) -> usize {
        {
            let _one_drainer = self.draining.lock();
            caches.for_each(|cache| cache.drain.store(true, Relaxed));
            barrier::heavy();
            caches.for_each(|cache| {
                // Caches that appeared after the first pass were not claimed: leave them.
                if !cache.drain.load(Relaxed) {
                    return;
                }
                // The owner is in at most one short operation (which takes no lock a drainer
                // holds here); from now on it keeps out.
                while cache.busy.load(Acquire) {
                    core::hint::spin_loop();
                }
                for m in &cache.mags {
                    self.absorb(m);
                }
                cache.drain.store(false, Release);
            });
        }
        let mut pool = self.pool.lock();
        let mut released = 0;
        while let Some((ptr, class)) = pool.pop_oldest() {
            released += class.0;
            self.release(ptr, class);
        }
        released
    }
}
