//! [`StatsCounters`]: exact allocation statistics with no lock and no locked instruction on the
//! allocation path.
//!
//! # Design
//! A locked read-modify-write (`lock xadd`) costs about 5 ns on the machines we measure, as much
//! as a whole glibc or jemalloc malloc/free pair of 64 bytes. So each thread gets its own
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
//! counters reserve each request in the shared total with one `fetch_add` (and release it with one
//! `fetch_sub`) before the backend is called.
//!
//! A thread that exits hands its shard back (its delta flushed into the shared total) for the next
//! new thread to adopt, so the number of shards stays at the most threads ever alive at once.

use core::cell::{Cell, RefCell};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::AllocatorStats;

/// How far a thread's unflushed in-use delta may drift before it is added to the shared total.
pub const FLUSH_BYTES: i64 = 4 << 20;

/// Number of direct-mapped per-thread cache slots mapping a counter set to its shard.
const CACHE_SLOTS: usize = 16;

/// A source of unique counter-set ids; 0 means "empty cache slot".
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Hot-path cache: `(counter set id, its shard for this thread)`. No destructor, so it is
    /// usable at any point of the thread's life.
    static CACHE: [Cell<(u64, *const Shard)>; CACHE_SLOTS] =
        const { [const { Cell::new((0, ptr::null())) }; CACHE_SLOTS] };
    /// Every shard this thread owns; dropping it (thread exit) hands the shards back.
    static OWNED: RefCell<OwnedShards> = const { RefCell::new(OwnedShards(Vec::new())) };
}

/// One thread's counters. Written only by its owner thread (or, for the orphan shard, with
/// atomic read-modify-writes by anyone).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes_allocated: AtomicU64,
    /// In-use bytes not yet flushed into `Shared::in_use`.
    delta: AtomicI64,
    /// Highest in-use total this shard has seen, in epoch `epoch`.
    high: AtomicU64,
    /// Largest allocation this shard has seen, in epoch `epoch`.
    largest: AtomicU64,
    epoch: AtomicU64,
    /// Set when the owner thread has exited; the shard is free for adoption.
    retired: AtomicBool,
}

#[derive(Debug)]
struct Shared {
    id: u64,
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
    orphan: Shard,
    shards: Mutex<Vec<Arc<Shard>>>,
    baseline: Mutex<Baseline>,
}

/// Counts subtracted after `clear`, and the in-use figure the peak restarted from.
#[derive(Debug, Default)]
struct Baseline {
    allocs: u64,
    frees: u64,
    peak_floor: u64,
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
    shared: Arc<Shared>,
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
        Self {
            shared: Arc::new(Shared {
                id: NEXT_ID.fetch_add(1, Relaxed),
                limit,
                in_use: AtomicI64::new(0),
                peak: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                num_ooms: AtomicU64::new(0),
                num_retries: AtomicU64::new(0),
                orphan: Shard::default(),
                shards: Mutex::new(Vec::new()),
                baseline: Mutex::new(Baseline::default()),
            }),
        }
    }

    /// The byte limit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.shared.limit
    }

    /// Reserves `bytes` against the limit before the backend is asked for memory. Without a
    /// limit this does nothing and always succeeds.
    ///
    /// # Errors
    /// [`LimitHit`] when in-use plus `bytes` would exceed the limit; nothing is reserved then.
    #[inline]
    pub fn try_reserve(&self, bytes: usize) -> Result<(), LimitHit> {
        let Some(limit) = self.shared.limit else {
            return Ok(());
        };
        let bytes = bytes as i64;
        let prev = self.shared.in_use.fetch_add(bytes, Relaxed);
        let now = prev.saturating_add(bytes);
        if bytes < 0 || now as u64 > limit {
            self.shared.in_use.fetch_sub(bytes, Relaxed);
            return Err(LimitHit { in_use: prev.max(0) as u64, limit });
        }
        if now as u64 > self.shared.peak.load(Relaxed) {
            self.shared.peak.fetch_max(now as u64, Relaxed);
        }
        Ok(())
    }

    /// Gives back a reservation whose allocation then failed in the backend.
    #[inline]
    pub fn cancel_reservation(&self, bytes: usize) {
        if self.shared.limit.is_some() {
            self.shared.in_use.fetch_sub(bytes as i64, Relaxed);
        }
    }

    /// Records a granted allocation of `bytes` (reserved first with `try_reserve`).
    #[inline]
    pub fn record_alloc(&self, bytes: usize) {
        self.with_shard(|shard, exclusive| self.alloc_in(shard, exclusive, bytes as u64));
    }

    /// Records the free of an allocation of `bytes`.
    #[inline]
    pub fn record_free(&self, bytes: usize) {
        if self.shared.limit.is_some() {
            self.shared.in_use.fetch_sub(bytes as i64, Relaxed);
            self.with_shard(|shard, exclusive| add(&shard.frees, 1, exclusive));
        } else {
            self.with_shard(|shard, exclusive| {
                add(&shard.frees, 1, exclusive);
                self.move_delta(shard, exclusive, -(bytes as i64));
            });
        }
    }

    /// Records an allocation refused for lack of memory or for the limit.
    pub fn record_oom(&self) {
        self.shared.num_ooms.fetch_add(1, Relaxed);
    }

    /// Records an allocation that waited for memory and tried again.
    pub fn record_retry(&self) {
        self.shared.num_retries.fetch_add(1, Relaxed);
    }

    /// Restarts the windowed figures as TensorFlow's `ClearStats` does: peak := in use,
    /// allocation and free counts := 0, largest allocation := 0. Totals, OOMs and retries stay.
    pub fn clear(&self) {
        let mut base = self.shared.baseline.lock();
        let now = self.sum_shards();
        base.allocs = now.allocs;
        base.frees = now.frees;
        base.peak_floor = now.in_use;
        self.shared.peak.store(now.in_use, Relaxed);
        self.shared.epoch.fetch_add(1, Relaxed);
    }

    /// The current figures.
    pub fn snapshot(&self) -> CounterSnapshot {
        let base = self.shared.baseline.lock();
        let sum = self.sum_shards();
        let peak = sum.high.max(self.shared.peak.load(Relaxed)).max(base.peak_floor).max(sum.in_use);
        CounterSnapshot {
            num_allocs: sum.allocs.saturating_sub(base.allocs),
            num_frees: sum.frees.saturating_sub(base.frees),
            bytes_in_use: sum.in_use,
            peak_bytes_in_use: peak,
            largest_alloc_size: sum.largest,
            total_bytes_allocated: sum.bytes_allocated,
            num_ooms: self.shared.num_ooms.load(Relaxed),
            num_alloc_retries: self.shared.num_retries.load(Relaxed),
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
            bytes_limit: self.shared.limit,
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            ..AllocatorStats::default()
        }
    }

    #[inline]
    fn alloc_in(&self, shard: &Shard, exclusive: bool, bytes: u64) {
        let epoch = self.shared.epoch.load(Relaxed);
        if shard.epoch.load(Relaxed) != epoch {
            self.new_epoch(shard, exclusive, epoch);
        }
        add(&shard.allocs, 1, exclusive);
        add(&shard.bytes_allocated, bytes, exclusive);
        let in_use = if self.shared.limit.is_some() {
            self.shared.in_use.load(Relaxed)
        } else {
            self.move_delta(shard, exclusive, bytes as i64)
        };
        max(&shard.high, in_use.max(0) as u64, exclusive);
        max(&shard.largest, bytes, exclusive);
    }

    #[cold]
    fn new_epoch(&self, shard: &Shard, exclusive: bool, epoch: u64) {
        if exclusive {
            shard.high.store(0, Relaxed);
            shard.largest.store(0, Relaxed);
            shard.epoch.store(epoch, Relaxed);
        } else {
            // The orphan shard is shared: its highs may keep one stale value; they stay bounded
            // by the true figures of the previous epoch.
            shard.epoch.store(epoch, Relaxed);
        }
    }

    /// Moves the shard's in-use delta by `by`, flushing it when it passes the threshold.
    /// Returns this thread's view of the total bytes in use.
    #[inline]
    fn move_delta(&self, shard: &Shard, exclusive: bool, by: i64) -> i64 {
        if !exclusive {
            let now = self.shared.in_use.fetch_add(by, Relaxed) + by;
            if now > 0 && now as u64 > self.shared.peak.load(Relaxed) {
                self.shared.peak.fetch_max(now as u64, Relaxed);
            }
            return now;
        }
        let delta = shard.delta.load(Relaxed) + by;
        if (-FLUSH_BYTES..=FLUSH_BYTES).contains(&delta) {
            shard.delta.store(delta, Relaxed);
            self.shared.in_use.load(Relaxed) + delta
        } else {
            self.flush(shard, delta)
        }
    }

    #[cold]
    fn flush(&self, shard: &Shard, delta: i64) -> i64 {
        let now = self.shared.in_use.fetch_add(delta, Relaxed) + delta;
        shard.delta.store(0, Relaxed);
        if now > 0 {
            self.shared.peak.fetch_max(now as u64, Relaxed);
        }
        now
    }

    /// Runs `f` on this thread's shard (`exclusive == true`) or, when thread-locals are gone,
    /// on the shared orphan shard (`exclusive == false`, read-modify-write updates).
    #[inline]
    fn with_shard<R>(&self, f: impl FnOnce(&Shard, bool) -> R) -> R {
        let id = self.shared.id;
        let cached = CACHE.with(|slots| {
            let (slot_id, shard) = slots[id as usize % CACHE_SLOTS].get();
            if slot_id == id { shard } else { ptr::null() }
        });
        if !cached.is_null() {
            // SAFETY: the cache holds, for our id only, a pointer to a shard this thread owns and
            // that `self.shared.shards` keeps alive (an `Arc`) for as long as `self` lives; the
            // entry is cleared before the shard is handed back at thread exit, so no other thread
            // writes it while we do.
            return f(unsafe { &*cached }, true);
        }
        self.with_shard_slow(f)
    }

    #[cold]
    fn with_shard_slow<R>(&self, f: impl FnOnce(&Shard, bool) -> R) -> R {
        let shard = OWNED
            .try_with(|owned| {
                let mut owned = owned.try_borrow_mut().ok()?;
                Some(owned.shard_for(&self.shared))
            })
            .ok()
            .flatten();
        match shard {
            Some(shard) => {
                let p = Arc::as_ptr(&shard);
                CACHE.with(|slots| slots[self.shared.id as usize % CACHE_SLOTS].set((self.shared.id, p)));
                f(&shard, true)
            }
            None => f(&self.shared.orphan, false),
        }
    }

    fn sum_shards(&self) -> Sums {
        let shards = self.shared.shards.lock();
        let epoch = self.shared.epoch.load(Relaxed);
        let mut sum = Sums::default();
        let mut delta = self.shared.in_use.load(Relaxed);
        for shard in shards.iter().map(|s| &**s).chain([&self.shared.orphan]) {
            sum.allocs += shard.allocs.load(Relaxed);
            sum.frees += shard.frees.load(Relaxed);
            sum.bytes_allocated += shard.bytes_allocated.load(Relaxed);
            delta += shard.delta.load(Relaxed);
            if shard.epoch.load(Relaxed) == epoch {
                sum.high = sum.high.max(shard.high.load(Relaxed));
                sum.largest = sum.largest.max(shard.largest.load(Relaxed));
            }
        }
        sum.in_use = delta.max(0) as u64;
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

/// Adds with a plain load and store when the shard is ours alone, else with `fetch_add`.
#[inline]
fn add(a: &AtomicU64, v: u64, exclusive: bool) {
    if exclusive {
        a.store(a.load(Relaxed).wrapping_add(v), Relaxed);
    } else {
        a.fetch_add(v, Relaxed);
    }
}

#[inline]
fn max(a: &AtomicU64, v: u64, exclusive: bool) {
    if v > a.load(Relaxed) {
        if exclusive {
            a.store(v, Relaxed);
        } else {
            a.fetch_max(v, Relaxed);
        }
    }
}

/// This thread's shards, one per counter set it has touched.
struct OwnedShards(Vec<(Weak<Shared>, Arc<Shard>)>);

impl OwnedShards {
    fn shard_for(&mut self, shared: &Arc<Shared>) -> Arc<Shard> {
        // Forget shards of counter sets that are gone.
        self.0.retain(|(w, _)| w.strong_count() > 0);
        if let Some((_, shard)) = self.0.iter().find(|(w, _)| ptr::eq(w.as_ptr(), Arc::as_ptr(shared))) {
            return Arc::clone(shard);
        }
        let shard = {
            let mut shards = shared.shards.lock();
            match shards.iter().find(|s| s.retired.load(Relaxed)) {
                Some(s) => {
                    s.retired.store(false, Relaxed);
                    Arc::clone(s)
                }
                None => {
                    let s = Arc::new(Shard { epoch: AtomicU64::new(shared.epoch.load(Relaxed)), ..Shard::default() });
                    shards.push(Arc::clone(&s));
                    s
                }
            }
        };
        self.0.push((Arc::downgrade(shared), Arc::clone(&shard)));
        shard
    }
}

impl Drop for OwnedShards {
    fn drop(&mut self) {
        // Stop the hot path from using shards we are about to hand back.
        let _ = CACHE.try_with(|slots| slots.iter().for_each(|s| s.set((0, ptr::null()))));
        for (weak, shard) in self.0.drain(..) {
            let Some(shared) = weak.upgrade() else { continue };
            let _guard = shared.shards.lock();
            let delta = shard.delta.swap(0, Relaxed);
            if shared.limit.is_none() && delta != 0 {
                shared.in_use.fetch_add(delta, Relaxed);
            }
            shard.retired.store(true, Relaxed);
        }
    }
}
