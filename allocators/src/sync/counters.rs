//! [`StatsCounters`]: exact allocation statistics with no lock and no locked instruction on the
//! allocation path.
//!
//! # Design
//! A locked read-modify-write (`lock xadd`) costs as much as a whole glibc or jemalloc
//! malloc/free pair of 64 bytes (`docs/per-thread-chunk-tables.md`). So each thread gets its own
//! cache-line-sized *shard* per counter set, which only that thread writes, with plain relaxed
//! loads and stores (no `lock` prefix). Readers sum the shards when they ask for stats.
//!
//! Bytes in use are kept as a per-shard signed delta that is flushed into one shared total when it
//! passes ±[`FLUSH_BYTES`], so that every thread sees the others' usage to within that amount.
//! Each shard records the highest `shared total + own delta` it has seen; the peak is the largest
//! of those. Hence:
//! - counts, bytes in use and the largest allocation are exact once the threads that allocate
//!   are quiescent (and at any time in a single thread);
//! - the peak is exact when one thread allocates at a time, and within
//!   `(threads - 1) * FLUSH_BYTES` of the true peak when several do; it is never below in-use.
//!
//! With a byte limit the in-use total must be exact at every instant to be enforced, so limited
//! counters reserve each request in the shared total with one compare-and-swap that never takes
//! it past the limit (and release it with one `fetch_sub`) before the backend is called.
//!
//! A thread that exits hands its shard back (its delta flushed into the shared total) for the next
//! new thread to adopt, so the number of shards stays at the most threads ever alive at once.

use core::sync::atomic::Ordering::Relaxed;

use crate::primitives::{AtomicI64, AtomicU64, Mutex};

use crate::AllocatorStats;
use crate::per_thread::{PerThread, ThreadValue};

/// How far a thread's unflushed in-use delta may drift before it is added to the shared total.
pub const FLUSH_BYTES: i64 = 4 << 20;

/// One thread's counters, written only by its owner thread with plain loads and stores.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes_allocated: AtomicU64,
    /// In-use bytes not yet flushed into `Shared::in_use`.
    delta: AtomicI64,
    /// `Shared::in_use` as this thread last saw it (at its last flush or cache refill).
    base: AtomicI64,
    /// Highest in-use total this shard has seen, in epoch `epoch`.
    high: AtomicU64,
    /// Largest allocation this shard has seen, in epoch `epoch`.
    largest: AtomicU64,
    epoch: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    limit: Option<u64>,
    /// Flushed in-use bytes (exact in-use bytes when there is a limit).
    in_use: AtomicI64,
    /// Peak of `in_use` at flush points (every change when there is a limit).
    peak: AtomicU64,
    /// Bumped by `clear`; shard highs and largests of older epochs are ignored.
    epoch: AtomicU64,
    num_ooms: AtomicU64,
    num_retries: AtomicU64,
    /// Used, with read-modify-writes, by threads whose thread-locals are already destroyed.
    orphan: Orphan,
    baseline: Mutex<Baseline>,
}

/// Counts subtracted after `clear`, and the in-use figure the peak restarted from.
#[derive(Debug, Default)]
struct Baseline {
    allocs: u64,
    frees: u64,
    peak_floor: u64,
}

#[derive(Debug, Default)]
struct Orphan {
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes_allocated: AtomicU64,
    largest: AtomicU64,
}

impl ThreadValue for Shard {
    type Shared = Shared;

    fn retire(&self, shared: &Shared) {
        let delta = self.delta.swap(0, Relaxed);
        if delta != 0 {
            shared.in_use.fetch_add(delta, Relaxed);
        }
    }

    fn refresh(&self, shared: &Shared) {
        let epoch = shared.epoch.load(Relaxed);
        if self.epoch.load(Relaxed) != epoch {
            self.high.store(0, Relaxed);
            self.largest.store(0, Relaxed);
            self.epoch.store(epoch, Relaxed);
        }
        self.base.store(shared.in_use.load(Relaxed), Relaxed);
    }
}

impl Shard {
    #[inline(always)]
    fn alloc(&self, bytes: u64, shared: &Shared, limited: bool) {
        bump(&self.allocs, 1);
        bump(&self.bytes_allocated, bytes);
        raise(&self.largest, bytes);
        // With a limit, `try_reserve` already raised the shared peak to the total it granted.
        // Reading the shared total here instead could see another thread's refused reservation
        // in the moment before it is taken back, and report a peak above the limit.
        if limited {
            return;
        }
        let delta = self.delta.load(Relaxed) + bytes as i64;
        let in_use = if delta <= FLUSH_BYTES {
            self.delta.store(delta, Relaxed);
            self.base.load(Relaxed) + delta
        } else {
            self.flush(delta, shared)
        };
        raise(&self.high, in_use.max(0) as u64);
    }

    #[inline(always)]
    fn free(&self, bytes: u64, shared: &Shared, limited: bool) {
        bump(&self.frees, 1);
        if !limited {
            let delta = self.delta.load(Relaxed) - bytes as i64;
            if delta >= -FLUSH_BYTES {
                self.delta.store(delta, Relaxed);
            } else {
                self.flush(delta, shared);
            }
        }
    }

    /// Adds the delta to the shared total; returns the new total.
    #[cold]
    #[inline(never)]
    fn flush(&self, delta: i64, shared: &Shared) -> i64 {
        let now = shared.in_use.fetch_add(delta, Relaxed) + delta;
        self.delta.store(0, Relaxed);
        self.base.store(now, Relaxed);
        if now > 0 {
            shared.peak.fetch_max(now as u64, Relaxed);
        }
        now
    }
}

/// The counters behind an allocator's [`AllocatorStats`]: allocations, frees, bytes in use,
/// peak, largest allocation, OOMs and retries, optionally enforcing a byte limit.
///
/// Backends call [`try_reserve`](Self::try_reserve) before taking memory,
/// [`record_alloc`](Self::record_alloc) once they have it (or
/// [`cancel_reservation`](Self::cancel_reservation) if the backend failed), and
/// [`record_free`](Self::record_free) when it is returned. See the module docs for how the
/// figures stay exact without a lock.
///
/// ```
/// use tensormem_allocators::StatsCounters;
///
/// let c = StatsCounters::new(Some(1000));
/// c.try_reserve(600).unwrap();
/// c.record_alloc(600);
/// let hit = c.try_reserve(500).unwrap_err();
/// assert_eq!((hit.in_use, hit.limit), (600, 1000));
/// c.record_free(600);
/// let s = c.stats();
/// assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use, s.peak_bytes_in_use), (1, 1, 0, 600));
/// ```
#[derive(Debug)]
pub struct StatsCounters {
    /// Copy of `Shared::limit.is_some()`, read on every call.
    limited: bool,
    shards: PerThread<Shard>,
}

/// A request would take the counters over their limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitHit {
    /// Bytes in use when the request was refused.
    pub in_use: u64,
    /// The limit.
    pub limit: u64,
}

/// The raw figures of a [`StatsCounters`], including ones `AllocatorStats` has no field for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Allocations since creation or the last clear.
    pub num_allocs: u64,
    /// Frees since creation or the last clear.
    pub num_frees: u64,
    /// Bytes in use now.
    pub bytes_in_use: u64,
    /// Peak bytes in use since creation or the last clear.
    pub peak_bytes_in_use: u64,
    /// Largest allocation since creation or the last clear.
    pub largest_alloc_size: u64,
    /// Bytes ever allocated (never cleared).
    pub total_bytes_allocated: u64,
    /// Failed allocations (never cleared).
    pub num_ooms: u64,
    /// Allocation retries (never cleared).
    pub num_alloc_retries: u64,
}

impl StatsCounters {
    /// Counters with an optional byte limit on the bytes in use.
    pub fn new(limit: Option<u64>) -> Self {
        Self { limited: limit.is_some(), shards: PerThread::new(Shared { limit, ..Shared::default() }) }
    }

    #[inline(always)]
    fn shared(&self) -> &Shared {
        self.shards.shared()
    }

    /// The byte limit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.shared().limit
    }

    /// Reserves `bytes` against the limit before the backend is asked for memory. Without a
    /// limit this does nothing and always succeeds.
    ///
    /// # Errors
    /// [`LimitHit`] when in-use plus `bytes` would exceed the limit; nothing is reserved then.
    #[inline(always)]
    pub fn try_reserve(&self, bytes: usize) -> Result<(), LimitHit> {
        if self.limited { self.reserve_limited(bytes) } else { Ok(()) }
    }

    fn reserve_limited(&self, bytes: usize) -> Result<(), LimitHit> {
        let shared = self.shared();
        let limit = shared.limit.unwrap_or(u64::MAX);
        // A compare-and-swap, not an add taken back when over: the shared total then never holds
        // a refused request, so a reader never sees bytes in use (or a peak) above the limit.
        // Uncontended it is one locked instruction, as the add was.
        let mut prev = shared.in_use.load(Relaxed);
        loop {
            let now = i64::try_from(bytes).ok().and_then(|b| prev.checked_add(b)).filter(|&n| n as u64 <= limit);
            let Some(now) = now else {
                return Err(LimitHit { in_use: prev.max(0) as u64, limit });
            };
            match shared.in_use.compare_exchange_weak(prev, now, Relaxed, Relaxed) {
                Ok(_) => {
                    if now as u64 > shared.peak.load(Relaxed) {
                        shared.peak.fetch_max(now as u64, Relaxed);
                    }
                    return Ok(());
                }
                Err(seen) => prev = seen,
            }
        }
    }

    /// Gives back a reservation whose allocation then failed in the backend.
    #[inline]
    pub fn cancel_reservation(&self, bytes: usize) {
        if self.limited {
            self.shared().in_use.fetch_sub(bytes as i64, Relaxed);
        }
    }

    /// Records a granted allocation of `bytes` (reserved first with `try_reserve`).
    #[inline(always)]
    pub fn record_alloc(&self, bytes: usize) {
        let limited = self.limited;
        if self.shards.with(|shard, shared| shard.alloc(bytes as u64, shared, limited)).is_none() {
            self.orphan_alloc(bytes as u64);
        }
    }

    /// Records the free of an allocation of `bytes`.
    #[inline(always)]
    pub fn record_free(&self, bytes: usize) {
        let limited = self.limited;
        if limited {
            self.shared().in_use.fetch_sub(bytes as i64, Relaxed);
        }
        if self.shards.with(|shard, shared| shard.free(bytes as u64, shared, limited)).is_none() {
            self.orphan_free(bytes as u64);
        }
    }

    #[cold]
    fn orphan_alloc(&self, bytes: u64) {
        let shared = self.shared();
        shared.orphan.allocs.fetch_add(1, Relaxed);
        shared.orphan.bytes_allocated.fetch_add(bytes, Relaxed);
        shared.orphan.largest.fetch_max(bytes, Relaxed);
        // With a limit, `try_reserve` counted the bytes and raised the peak (see `Shard::alloc`).
        if !self.limited {
            let now = shared.in_use.fetch_add(bytes as i64, Relaxed) + bytes as i64;
            shared.peak.fetch_max(now.max(0) as u64, Relaxed);
        }
    }

    #[cold]
    fn orphan_free(&self, bytes: u64) {
        let shared = self.shared();
        shared.orphan.frees.fetch_add(1, Relaxed);
        if !self.limited {
            shared.in_use.fetch_sub(bytes as i64, Relaxed);
        }
    }

    /// Records an allocation refused for lack of memory or for the limit.
    pub fn record_oom(&self) {
        self.shared().num_ooms.fetch_add(1, Relaxed);
    }

    /// Records an allocation that waited for memory and tried again.
    pub fn record_retry(&self) {
        self.shared().num_retries.fetch_add(1, Relaxed);
    }

    /// Restarts the windowed figures as TensorFlow's `ClearStats` does: peak := in use,
    /// allocation and free counts := 0, largest allocation := 0. Totals, OOMs and retries stay.
    pub fn clear(&self) {
        let shared = self.shared();
        let mut base = shared.baseline.lock();
        let now = self.sum_shards();
        base.allocs = now.allocs;
        base.frees = now.frees;
        base.peak_floor = now.in_use;
        shared.peak.store(now.in_use, Relaxed);
        shared.orphan.largest.store(0, Relaxed);
        shared.epoch.fetch_add(1, Relaxed);
        // Each thread resets its shard's high and largest on its next call.
        self.shards.invalidate_caches();
    }

    /// The current figures.
    pub fn snapshot(&self) -> CounterSnapshot {
        let shared = self.shared();
        let base = shared.baseline.lock();
        let sum = self.sum_shards();
        let peak = sum.high.max(base.peak_floor).max(sum.in_use);
        // Remember what this read saw, so that the peak never goes down between reads.
        let peak = shared.peak.fetch_max(peak, Relaxed).max(peak);
        CounterSnapshot {
            num_allocs: sum.allocs.saturating_sub(base.allocs),
            num_frees: sum.frees.saturating_sub(base.frees),
            bytes_in_use: sum.in_use,
            peak_bytes_in_use: peak,
            largest_alloc_size: sum.largest,
            total_bytes_allocated: sum.bytes_allocated,
            num_ooms: shared.num_ooms.load(Relaxed),
            num_alloc_retries: shared.num_retries.load(Relaxed),
        }
    }

    /// The figures as [`AllocatorStats`], with `bytes_limit` filled in and nothing reserved.
    pub fn stats(&self) -> AllocatorStats {
        let s = self.snapshot();
        AllocatorStats {
            num_allocs: s.num_allocs,
            num_frees: s.num_frees,
            bytes_in_use: s.bytes_in_use,
            peak_bytes_in_use: s.peak_bytes_in_use,
            largest_alloc_size: s.largest_alloc_size,
            bytes_limit: self.shared().limit,
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            total_bytes_allocated: Some(s.total_bytes_allocated),
            ..AllocatorStats::default()
        }
    }

    /// How many per-thread shards exist (the most threads that used the counters at once).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn sum_shards(&self) -> Sums {
        let shared = self.shared();
        let epoch = shared.epoch.load(Relaxed);
        let o = &shared.orphan;
        let mut sum = Sums {
            allocs: o.allocs.load(Relaxed),
            frees: o.frees.load(Relaxed),
            bytes_allocated: o.bytes_allocated.load(Relaxed),
            largest: o.largest.load(Relaxed),
            ..Sums::default()
        };
        // Under the lock a retiring thread takes to fold its delta into `in_use`.
        let in_use = self.shards.visit(|shards| {
            let mut in_use = shared.in_use.load(Relaxed);
            for shard in shards {
                sum.allocs += shard.allocs.load(Relaxed);
                sum.frees += shard.frees.load(Relaxed);
                sum.bytes_allocated += shard.bytes_allocated.load(Relaxed);
                in_use += shard.delta.load(Relaxed);
                if shard.epoch.load(Relaxed) == epoch {
                    sum.high = sum.high.max(shard.high.load(Relaxed));
                    sum.largest = sum.largest.max(shard.largest.load(Relaxed));
                }
            }
            in_use
        });
        sum.in_use = in_use.max(0) as u64;
        sum
    }
}

impl Default for StatsCounters {
    /// Counters without a limit.
    fn default() -> Self {
        Self::new(None)
    }
}

#[derive(Default)]
struct Sums {
    allocs: u64,
    frees: u64,
    bytes_allocated: u64,
    in_use: u64,
    high: u64,
    largest: u64,
}

/// Adds to a value only this thread writes: a plain load and store, no locked instruction.
#[inline(always)]
fn bump(a: &AtomicU64, v: u64) {
    a.store(a.load(Relaxed).wrapping_add(v), Relaxed);
}

/// Raises a value only this thread writes.
#[inline(always)]
fn raise(a: &AtomicU64, v: u64) {
    if v > a.load(Relaxed) {
        a.store(v, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};

    use super::*;

    /// The sizes thread `t` allocates, in order: varied, some past `FLUSH_BYTES` so that shards
    /// flush into the shared total while other threads do the same.
    fn sizes(t: usize) -> impl Iterator<Item = usize> {
        (0..5_000).map(move |i| match (i + t) % 7 {
            0 => 5 << 20,
            1 => 64,
            2 => 4096,
            3 => 300_000,
            _ => 1 + (i * 37 + t) % 10_000,
        })
    }

    #[test]
    fn counts_and_bytes_are_exact_once_threads_are_quiescent() {
        let c = Arc::new(StatsCounters::new(None));
        std::thread::scope(|s| {
            for t in 0..4 {
                let c = Arc::clone(&c);
                s.spawn(move || {
                    for b in sizes(t) {
                        c.record_alloc(b);
                        c.record_free(b);
                    }
                });
            }
        });
        let snap = c.snapshot();
        let total: u64 = (0..4).flat_map(sizes).map(|b| b as u64).sum();
        assert_eq!((snap.num_allocs, snap.num_frees), (20_000, 20_000));
        assert_eq!(snap.bytes_in_use, 0);
        assert_eq!(snap.total_bytes_allocated, total);
        assert_eq!(snap.largest_alloc_size, 5 << 20);
        // Each thread holds one block at a time: the peak is at least the largest block and at
        // most four of them plus what the unflushed shard deltas can hide.
        assert!(snap.peak_bytes_in_use >= 5 << 20, "{snap:?}");
        assert!(snap.peak_bytes_in_use <= 4 * (5 << 20) + 4 * FLUSH_BYTES as u64, "{snap:?}");
    }

    #[test]
    fn a_block_freed_on_another_thread_leaves_nothing_in_use() {
        let c = Arc::new(StatsCounters::new(None));
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        std::thread::scope(|s| {
            let a = Arc::clone(&c);
            s.spawn(move || {
                for b in sizes(1) {
                    a.record_alloc(b);
                    tx.send(b).unwrap();
                }
            });
            let f = Arc::clone(&c);
            s.spawn(move || {
                for b in rx {
                    f.record_free(b);
                }
            });
        });
        let snap = c.snapshot();
        assert_eq!((snap.num_allocs, snap.num_frees, snap.bytes_in_use), (5_000, 5_000, 0));
    }

    #[test]
    fn a_limit_is_never_exceeded_by_concurrent_reservations() {
        const LIMIT: u64 = 1 << 20;
        let c = Arc::new(StatsCounters::new(Some(LIMIT)));
        let held = Arc::new(AtomicI64::new(0));
        std::thread::scope(|s| {
            for t in 0..4 {
                let (c, held) = (Arc::clone(&c), Arc::clone(&held));
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..20_000usize {
                        let b = 1024 * (1 + (i + t) % 64);
                        if c.try_reserve(b).is_ok() {
                            c.record_alloc(b);
                            let now = held.fetch_add(b as i64, SeqCst) + b as i64;
                            assert!(now as u64 <= LIMIT, "{now} bytes held under a limit of {LIMIT}");
                            mine.push(b);
                        } else {
                            c.record_oom();
                        }
                        // Up to 41 blocks of 32 KiB on average: one thread alone passes the
                        // limit, so refusals happen however the threads are scheduled.
                        if mine.len() > 40 || (i % 7 == 0 && !mine.is_empty()) {
                            let b = mine.remove(0);
                            held.fetch_sub(b as i64, SeqCst);
                            c.record_free(b);
                        }
                    }
                    for b in mine {
                        held.fetch_sub(b as i64, SeqCst);
                        c.record_free(b);
                    }
                });
            }
        });
        let snap = c.snapshot();
        assert_eq!(snap.bytes_in_use, 0);
        assert_eq!(snap.num_allocs, snap.num_frees);
        assert_eq!(snap.num_allocs + snap.num_ooms, 80_000);
        assert!(snap.peak_bytes_in_use <= LIMIT, "{snap:?}");
        assert!(snap.num_ooms > 0, "the limit was never reached: the test proves nothing");
    }
}

/// Loom models: every interleaving (and every ordering the memory model allows) of a few
/// threads' calls. Run with `RUSTFLAGS="--cfg loom" cargo test --release -p tensormem-allocators
/// --lib loom`.
#[cfg(all(test, loom))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;
    use crate::primitives::loom_model;

    const PREEMPTIONS: usize = 2;

    #[test]
    fn loom_a_limit_is_never_exceeded_nor_reported_above() {
        loom_model(PREEMPTIONS + 1, || {
            let c = Arc::new(StatsCounters::new(Some(1000)));
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let c = Arc::clone(&c);
                    thread::spawn(move || {
                        let granted = c.try_reserve(600).is_ok();
                        if granted {
                            c.record_alloc(600);
                            c.record_free(600);
                        }
                        granted
                    })
                })
                .collect();
            // A reader while the two race for the limit: never a figure above it.
            let s = c.snapshot();
            assert!(s.bytes_in_use <= 1000 && s.peak_bytes_in_use <= 1000, "{s:?}");
            let granted = workers.into_iter().map(|w| w.join().unwrap()).filter(|&g| g).count() as u64;
            let s = c.snapshot();
            assert!(granted >= 1, "one of two 600-byte requests fits a 1000-byte limit");
            assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use), (granted, granted, 0));
            assert_eq!(s.peak_bytes_in_use, 600);
        });
    }

    #[test]
    fn loom_unlimited_counts_are_exact_and_the_peak_bounded_once_threads_are_done() {
        let big = FLUSH_BYTES as usize + 1;
        loom_model(PREEMPTIONS, move || {
            let c = Arc::new(StatsCounters::new(None));
            let workers: Vec<_> = [big, 64]
                .into_iter()
                .map(|size| {
                    let c = Arc::clone(&c);
                    thread::spawn(move || {
                        c.record_alloc(size);
                        c.record_free(size);
                    })
                })
                .collect();
            let mid = c.snapshot();
            assert!(mid.bytes_in_use <= (big + 64) as u64, "{mid:?}");
            for w in workers {
                w.join().unwrap();
            }
            let s = c.snapshot();
            assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use), (2, 2, 0));
            assert_eq!(s.total_bytes_allocated, (big + 64) as u64);
            assert_eq!(s.largest_alloc_size, big as u64);
            // Never below the largest single figure; above the true peak by at most one thread's
            // unflushed delta.
            assert!(s.peak_bytes_in_use >= big as u64, "{s:?}");
            assert!(s.peak_bytes_in_use <= (big + 64) as u64 + FLUSH_BYTES as u64, "{s:?}");
        });
    }

    #[test]
    fn loom_a_thread_that_exits_hands_its_delta_on() {
        loom_model(PREEMPTIONS, || {
            let c = Arc::new(StatsCounters::new(None));
            let c1 = Arc::clone(&c);
            // Allocates and exits with the bytes still in its unflushed delta.
            let first = thread::spawn(move || c1.record_alloc(100));
            // A reader while the thread may be retiring: the bytes are counted once, or not yet.
            let mid = c.snapshot().bytes_in_use;
            assert!(mid == 0 || mid == 100, "{mid}");
            first.join().unwrap();
            assert_eq!(c.snapshot().bytes_in_use, 100);
            let c2 = Arc::clone(&c);
            thread::spawn(move || c2.record_free(100)).join().unwrap();
            let s = c.snapshot();
            assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use, s.peak_bytes_in_use), (1, 1, 0, 100));
            // Loom ends a thread's thread-locals after `join` returns (the standard library before),
            // so the second thread may start before the first one's shard is handed back.
            assert!((1..=2).contains(&c.shard_count()), "{} shards", c.shard_count());
        });
    }
}
