//! The process heap's counters, kept by [`GlobalAllocator`](crate::GlobalAllocator) (and the
//! deprecated [`CountingGlobalAlloc`]) with no allocation and no lock inside their hooks.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, fence,
};

use crate::allocators::AllocatorStats;

/// Threads that get counters of their own at once (a thread's slot is freed when it exits);
/// threads beyond these count into shared atomics.
const SLOTS: usize = 64;

// A slot's `word` packs what its thread counted since its last flush, so that counting one
// allocation is one add to a thread-owned word and one test of its guard bits:
// bits 0..26: the in-use drift + `BIAS` (valid below bit 25: -16 MiB..16 MiB),
// bits 26..45: allocations (valid below bit 44), bits 45..64: frees (valid below bit 63).
// A flush (a shared atomic add) comes every 16 MiB of drift or 2^18 operations at most.
const DRIFT_MASK: u64 = (1 << 26) - 1;
const BIAS: u64 = 1 << 24;
const ALLOC_SHIFT: u32 = 26;
const FREE_SHIFT: u32 = 45;
const ALLOC_ONE: u64 = 1 << ALLOC_SHIFT;
const FREE_ONE: u64 = 1 << FREE_SHIFT;
const COUNT_MASK: u64 = (1 << 19) - 1;
/// Set in a word when a field left its valid range: the add of a size below [`BIG`] to a valid
/// word carries (or borrows) into the field's top bit, never past it.
const GUARDS: u64 = 1 << 25 | 1 << 44 | 1 << 63;
/// Sizes from here on are counted on the slow path (they could carry past a guard bit).
const BIG: usize = 1 << 25;
/// A word with nothing counted.
const EMPTY: u64 = BIAS;
/// The word of the two marker slots: guard bits set, so the fast path never writes it.
const CLOSED: u64 = GUARDS;

/// One thread's counters. `word` and `high` are written by their thread only (plain loads and
/// stores); the flushed fields change only in [`Slot::flush`], inside the `seq` lock that
/// readers retry on.
#[repr(align(128))]
struct Slot {
    /// What was counted since the last flush (the layout above).
    word: AtomicU64,
    /// The highest drift field (biased) since the last flush.
    high: AtomicU64,
    /// Odd while the owner flushes.
    seq: AtomicU64,
    /// Flushed allocations and frees of every thread that owned the slot.
    allocs: AtomicU64,
    frees: AtomicU64,
    /// The shared in-use total right after the slot's last flush.
    base: AtomicI64,
}

impl Slot {
    const fn new(word: u64) -> Self {
        Self {
            word: AtomicU64::new(word),
            high: AtomicU64::new(BIAS),
            seq: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            base: AtomicI64::new(0),
        }
    }

    /// Adds what the word holds to the flushed fields and the shared totals, with `allocs`
    /// allocations and `frees` frees more that changed in use by `bytes`. Only the slot's owner
    /// calls it.
    fn flush(&self, bytes: i64, allocs: u64, frees: u64) {
        let word = self.word.load(Relaxed);
        let drift = (word & DRIFT_MASK) as i64 - BIAS as i64 + bytes;
        let high = (self.high.load(Relaxed) as i64 - BIAS as i64).max(0);
        let base = self.base.load(Relaxed);
        let seq = self.seq.load(Relaxed);
        self.seq.store(seq + 1, Relaxed);
        fence(Release);
        self.allocs.store(self.allocs.load(Relaxed) + (word >> ALLOC_SHIFT & COUNT_MASK) + allocs, Relaxed);
        self.frees.store(self.frees.load(Relaxed) + (word >> FREE_SHIFT) + frees, Relaxed);
        // Release: a reader that sees the new total also sees this flush begun (`seq` odd), so
        // it never counts the drift both in the total and in the word.
        let now = IN_USE.fetch_add(drift, Release) + drift;
        self.base.store(now, Relaxed);
        self.word.store(EMPTY, Relaxed);
        self.high.store(BIAS, Relaxed);
        self.seq.store(seq + 2, Release);
        raise_peak((base + high).max(now));
    }

    /// A consistent view: (allocations, frees, unflushed drift, highest in use this slot saw
    /// since its last flush).
    fn read(&self) -> (u64, u64, i64, i64) {
        loop {
            let seq = self.seq.load(Acquire);
            if seq & 1 == 0 {
                let word = self.word.load(Relaxed);
                let high = self.high.load(Relaxed);
                let (allocs, frees, base) =
                    (self.allocs.load(Relaxed), self.frees.load(Relaxed), self.base.load(Relaxed));
                fence(Acquire);
                if self.seq.load(Relaxed) == seq {
                    let allocs = allocs + (word >> ALLOC_SHIFT & COUNT_MASK);
                    let drift = (word & DRIFT_MASK) as i64 - BIAS as i64;
                    return (allocs, frees + (word >> FREE_SHIFT), drift, base + high as i64 - BIAS as i64);
                }
            }
            core::hint::spin_loop();
        }
    }
}

static SLOT_TABLE: [Slot; SLOTS] = [const { Slot::new(EMPTY) }; SLOTS];
/// Where a thread that has not taken a slot yet points.
static UNCLAIMED: Slot = Slot::new(CLOSED);
/// Where a thread that counts into the shared atomics points (all slots were taken, or it is
/// exiting).
static SHARED: Slot = Slot::new(CLOSED);
static SHARED_ALLOCS: AtomicU64 = AtomicU64::new(0);
static SHARED_FREES: AtomicU64 = AtomicU64::new(0);
/// Bit `i` set: slot `i` has no thread.
static FREE_SLOTS: AtomicU64 = AtomicU64::new(u64::MAX);
/// Flushed in-use bytes.
static IN_USE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's slot, or one of the two markers. Const-initialised with no destructor:
    /// reading it never allocates, even during thread teardown.
    static MINE: Cell<&'static Slot> = const { Cell::new(&UNCLAIMED) };
    /// Gives the thread's slot back when the thread exits (touched once, when it takes one).
    static SLOT_OWNER: SlotOwner = const { SlotOwner };
}

/// Its drop, at thread exit, flushes the slot and frees it for a later thread; the thread's
/// last allocations and frees go to the shared atomics.
struct SlotOwner;

impl Drop for SlotOwner {
    fn drop(&mut self) {
        let slot = MINE.with(|s| s.replace(&SHARED));
        release(slot);
    }
}

/// The table index of `slot`, or `None` for the two markers.
fn slot_index(slot: &Slot) -> Option<usize> {
    let offset = (slot as *const Slot as usize).wrapping_sub(SLOT_TABLE.as_ptr() as usize);
    let idx = offset / size_of::<Slot>();
    (idx < SLOTS).then_some(idx)
}

/// Flushes a table slot and marks it free; a marker is left alone. Only the slot's owner (or,
/// at its exit, its destructor) calls it.
fn release(slot: &'static Slot) {
    let Some(idx) = slot_index(slot) else { return };
    slot.flush(0, 0, 0);
    // Release: the next owner's plain loads see this thread's last stores.
    FREE_SLOTS.fetch_or(1 << idx, Release);
}

/// Takes a free slot for this thread, or the shared atomics.
fn claim() -> &'static Slot {
    INSTALLED.store(true, Relaxed);
    let mut free = FREE_SLOTS.load(Acquire);
    let idx = loop {
        if free == 0 {
            break None;
        }
        let bit = free.trailing_zeros() as usize;
        match FREE_SLOTS.compare_exchange_weak(free, free & !(1 << bit), Acquire, Acquire) {
            Ok(_) => break Some(bit),
            Err(now) => free = now,
        }
    };
    let Some(slot) = idx.map(|i| &SLOT_TABLE[i]) else {
        MINE.with(|s| s.set(&SHARED));
        return &SHARED;
    };
    // Set first: an allocation made while the owner's destructor is registered finds the slot.
    MINE.with(|s| s.set(slot));
    if SLOT_OWNER.try_with(|_| ()).is_err() {
        // The thread is exiting: nothing would give the slot back.
        MINE.with(|s| s.set(&SHARED));
        release(slot);
        return &SHARED;
    }
    slot
}

/// Replaced by [`GlobalAllocator`](crate::GlobalAllocator), which counts the same figures and
/// also reports every allocation to leak checks, scopes and history.
///
/// Wraps a [`GlobalAlloc`] (usually [`std::alloc::System`]) and counts the process's heap: bytes
/// in use, peak, allocations and frees. The figures appear in
/// [`AllocatorCollector`](crate::telemetry::AllocatorCollector) as allocator `global`, and in
/// [`CountingGlobalAlloc::stats`].
///
/// Its hooks allocate nothing and take no lock: up to 64 live threads each count into a slot of
/// their own with one plain add to a word they own (a thread's slot is freed for another when it
/// exits); threads beyond those share atomic counters. Peak is exact for one thread and within
/// (threads - 1) x 16 MiB otherwise; `realloc` counts as a free and an allocation.
///
/// ```
/// use tensormem::telemetry::CountingGlobalAlloc;
///
/// #[global_allocator]
/// static GLOBAL: CountingGlobalAlloc<std::alloc::System> = CountingGlobalAlloc::new(std::alloc::System);
///
/// let v = vec![0u8; 1 << 20];
/// let s = GLOBAL.stats().unwrap(); // or tensormem::telemetry::process_heap_stats()
/// assert!(s.bytes_in_use >= 1 << 20 && s.num_allocs >= 1);
/// drop(v);
/// ```
#[derive(Debug)]
#[doc(hidden)]
#[deprecated(
    note = "use `tensormem::GlobalAllocator`: the same figures, and leak checks, scopes and history see the heap"
)]
pub struct CountingGlobalAlloc<A> {
    inner: A,
}

#[allow(deprecated)]
impl<A> CountingGlobalAlloc<A> {
    /// Counts allocations made through `inner`.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }

    /// The process-wide figures, or `None` if no `CountingGlobalAlloc` has allocated yet (it is
    /// not installed). The same as [`process_heap_stats`].
    pub fn stats(&self) -> Option<AllocatorStats> {
        global_stats()
    }
}

/// Counts one allocation of `size` bytes of the process heap.
#[inline(always)]
pub(crate) fn count_alloc(size: usize) {
    let slot = MINE.with(Cell::get);
    let word = slot.word.load(Relaxed).wrapping_add(ALLOC_ONE).wrapping_add(size as u64);
    if word & GUARDS != 0 || size >= BIG {
        return count_slow(size as i64);
    }
    slot.word.store(word, Relaxed);
    let drift = word & DRIFT_MASK;
    if drift > slot.high.load(Relaxed) {
        slot.high.store(drift, Relaxed);
    }
}

/// Counts one free of `size` bytes of the process heap.
#[inline(always)]
pub(crate) fn count_free(size: usize) {
    let slot = MINE.with(Cell::get);
    let word = slot.word.load(Relaxed).wrapping_add(FREE_ONE).wrapping_sub(size as u64);
    if word & GUARDS != 0 || size >= BIG {
        return count_slow(-(size as i64));
    }
    slot.word.store(word, Relaxed);
}

/// Counts an operation the fast path could not: this thread has no slot yet, counts into the
/// shared atomics, a field of its word is full, or the size is big.
#[cold]
#[inline(never)]
fn count_slow(bytes: i64) {
    let mut slot = MINE.with(Cell::get);
    if core::ptr::eq(slot, &UNCLAIMED) {
        slot = claim();
    }
    if !core::ptr::eq(slot, &SHARED) {
        return slot.flush(bytes, u64::from(bytes > 0), u64::from(bytes <= 0));
    }
    if bytes > 0 {
        SHARED_ALLOCS.fetch_add(1, Relaxed);
    } else {
        SHARED_FREES.fetch_add(1, Relaxed);
    }
    let now = IN_USE.fetch_add(bytes, Relaxed) + bytes;
    raise_peak(now);
}

/// Raises the shared peak to `bytes`; a read first, so that threads flushing below the peak
/// do not write its cache line.
fn raise_peak(bytes: i64) {
    let bytes = bytes.max(0) as u64;
    if bytes > PEAK.load(Relaxed) {
        PEAK.fetch_max(bytes, Relaxed);
    }
}

/// The process heap's figures when a [`GlobalAllocator`](crate::GlobalAllocator) is the global
/// allocator (`None` otherwise), from anywhere: no need to name the allocator's type.
pub fn process_heap_stats() -> Option<AllocatorStats> {
    global_stats()
}

/// Sums the slots; `None` when no counting global allocator has been used.
pub(crate) fn global_stats() -> Option<AllocatorStats> {
    if !INSTALLED.load(Relaxed) {
        return None;
    }
    // A flush moves a slot's drift into `IN_USE`: a scan during which `IN_USE` did not change
    // counts every byte once (a few tries, then the last scan stands).
    let (mut allocs, mut frees, mut in_use, mut high) = (0, 0, 0, 0i64);
    for _ in 0..4 {
        let flushed = IN_USE.load(Acquire);
        (allocs, frees) = (SHARED_ALLOCS.load(Relaxed), SHARED_FREES.load(Relaxed));
        let mut drift = 0i64;
        high = 0;
        for slot in &SLOT_TABLE {
            let (a, f, d, h) = slot.read();
            allocs += a;
            frees += f;
            drift += d;
            high = high.max(h);
        }
        fence(Acquire);
        let now = IN_USE.load(Relaxed);
        in_use = (now + drift).max(0) as u64;
        if now == flushed {
            break;
        }
    }
    // Remember what this read saw, so that the peak never goes down between reads.
    let peak = (high.max(0) as u64).max(in_use);
    let peak = PEAK.fetch_max(peak, Relaxed).max(peak);
    Some(AllocatorStats::build(|s| {
        s.num_allocs = allocs;
        s.num_frees = frees;
        s.bytes_in_use = in_use;
        s.peak_bytes_in_use = peak;
    }))
}

// SAFETY: every call is forwarded to `inner` with the caller's arguments; the counting around it
// touches only static atomics and a const thread-local, and never allocates or unwinds.
#[allow(deprecated)]
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingGlobalAlloc<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise (non-zero size).
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            count_alloc(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise (non-zero size).
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            count_alloc(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's promise (`ptr` allocated here with `layout`).
        unsafe { self.inner.dealloc(ptr, layout) };
        count_free(layout.size());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count_free(layout.size());
            count_alloc(new_size);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    fn stats() -> AllocatorStats {
        global_stats().expect("counted already")
    }

    /// One test: the counters are process-wide (nothing else in this binary counts into them).
    #[test]
    fn counts_stay_exact_across_every_slow_path() {
        count_alloc(1);
        count_free(1);
        let base = stats();

        // A field of the packed word fills (more allocations than it holds), the drift leaves
        // its range both ways, and big sizes bypass the word: every count is kept.
        std::thread::spawn(|| {
            let n = (1 << 19) + 77;
            (0..n).for_each(|_| count_alloc(24));
            (0..n).for_each(|_| count_free(24));
            (0..40).for_each(|_| count_alloc(1 << 20));
            count_alloc(64 << 20);
            count_free(64 << 20);
            (0..40).for_each(|_| count_free(1 << 20));
        })
        .join()
        .unwrap();
        let after = stats();
        let n = (1 << 19) + 77;
        assert_eq!(after.num_allocs - base.num_allocs, n + 41);
        assert_eq!(after.num_frees - base.num_frees, n + 41);
        assert_eq!(after.bytes_in_use, base.bytes_in_use);
        assert!(after.peak_bytes_in_use >= base.bytes_in_use + (104 << 20), "{base:?} -> {after:?}");

        // One thread's peak inside its drift range is exact, read while the thread still runs.
        let (ready, done) = (Barrier::new(2), Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                (0..3).for_each(|_| count_alloc(1 << 20));
                (0..3).for_each(|_| count_free(1 << 20));
                count_alloc(5000);
                ready.wait();
                done.wait();
                count_free(5000);
            });
            ready.wait();
            let during = stats();
            done.wait();
            assert_eq!(during.bytes_in_use, after.bytes_in_use + 5000);
            assert_eq!(during.num_allocs, after.num_allocs + 4);
            assert!(during.peak_bytes_in_use >= after.bytes_in_use + (3 << 20));
        });

        // More threads at once than there are slots: the rest count into the shared atomics,
        // and slots freed at thread exit are taken again.
        let before = stats();
        let gate = Barrier::new(SLOTS + 20);
        std::thread::scope(|s| {
            for _ in 0..SLOTS + 20 {
                s.spawn(|| {
                    count_alloc(100);
                    gate.wait();
                    count_free(100);
                    count_alloc(7);
                });
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while FREE_SLOTS.load(Relaxed).count_ones() as usize != SLOTS - 1 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let end = stats();
        assert_eq!(end.num_allocs - before.num_allocs, 2 * (SLOTS as u64 + 20));
        assert_eq!(end.num_frees - before.num_frees, SLOTS as u64 + 20);
        assert_eq!(end.bytes_in_use - before.bytes_in_use, 7 * (SLOTS as u64 + 20));
        // Exited threads gave their slots back; this thread keeps its own.
        assert_eq!(FREE_SLOTS.load(Relaxed).count_ones() as usize, SLOTS - 1, "every other slot was given back");
    }
}
