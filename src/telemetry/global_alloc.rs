//! The process heap's counters, kept by [`GlobalAllocator`](crate::GlobalAllocator) (and the
//! deprecated [`CountingGlobalAlloc`]) with no allocation and no lock inside their hooks.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use crate::allocators::AllocatorStats;

/// Threads that get counters of their own at once (a thread's slot is freed when it exits);
/// threads beyond these share one.
const SLOTS: usize = 64;
/// How far a thread's in-use delta drifts before it is added to the shared total.
const FLUSH_BYTES: i64 = 4 << 20;
/// Marks a thread that has not asked for a slot yet.
const UNASSIGNED: usize = usize::MAX;
/// Marks a thread that counts into the shared slot (all slots were taken, or it is exiting).
const SHARED: usize = usize::MAX - 1;

/// One thread's counters: written by that thread only (plain loads and stores), except the
/// shared overflow slot, which is updated with read-modify-writes.
#[repr(align(128))]
struct Slot {
    allocs: AtomicU64,
    frees: AtomicU64,
    delta: AtomicI64,
    base: AtomicI64,
    high: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Self {
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            delta: AtomicI64::new(0),
            base: AtomicI64::new(0),
            high: AtomicU64::new(0),
        }
    }
}

static SLOT_TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static OVERFLOW: Slot = Slot::new();
/// Bit `i` set: slot `i` has no thread.
static FREE_SLOTS: AtomicU64 = AtomicU64::new(u64::MAX);
/// Flushed in-use bytes.
static IN_USE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's slot index. Const-initialised with no destructor: reading it never
    /// allocates, even during thread teardown.
    static MY_SLOT: Cell<usize> = const { Cell::new(UNASSIGNED) };
    /// Gives the thread's slot back when the thread exits (touched once, when it takes one).
    static SLOT_OWNER: SlotOwner = const { SlotOwner };
}

/// Its drop, at thread exit, adds the slot's in-use drift to the shared total and frees the
/// slot for a later thread; the thread's last allocations and frees go to the shared slot.
struct SlotOwner;

impl Drop for SlotOwner {
    fn drop(&mut self) {
        let idx = MY_SLOT.with(|s| s.replace(SHARED));
        if let Some(slot) = SLOT_TABLE.get(idx) {
            release(idx, slot);
        }
    }
}

/// Flushes `slot` and marks it free. Only its thread (or, at its exit, its destructor) calls it.
fn release(idx: usize, slot: &Slot) {
    let delta = slot.delta.load(Relaxed);
    flush(slot, delta);
    // Release: the next owner's plain loads see this thread's last stores.
    FREE_SLOTS.fetch_or(1 << idx, Release);
}

/// Takes a free slot for this thread, or the shared one.
#[cold]
#[inline(never)]
fn claim() -> usize {
    INSTALLED.store(true, Relaxed);
    let mut free = FREE_SLOTS.load(Acquire);
    let idx = loop {
        if free == 0 {
            break SHARED;
        }
        let bit = free.trailing_zeros() as usize;
        match FREE_SLOTS.compare_exchange_weak(free, free & !(1 << bit), Acquire, Acquire) {
            Ok(_) => break bit,
            Err(now) => free = now,
        }
    };
    // Set first: an allocation made while the owner's destructor is registered finds the slot.
    MY_SLOT.with(|s| s.set(idx));
    if idx != SHARED && SLOT_OWNER.try_with(|_| ()).is_err() {
        // The thread is exiting: nothing would give the slot back.
        MY_SLOT.with(|s| s.set(SHARED));
        release(idx, &SLOT_TABLE[idx]);
        return SHARED;
    }
    idx
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
/// their own with plain stores (a thread's slot is freed for another when it exits); threads
/// beyond those share one slot with atomic adds. Peak is
/// exact for one thread and within (threads - 1) x 4 MiB otherwise; `realloc` counts as a free
/// and an allocation.
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

/// The slot of this thread, or `None` for the shared overflow slot.
#[inline(always)]
fn my_slot() -> Option<&'static Slot> {
    let idx = match MY_SLOT.with(Cell::get) {
        UNASSIGNED => claim(),
        idx => idx,
    };
    SLOT_TABLE.get(idx)
}

/// Counts one allocation (`alloc`, `bytes` > 0) or free of the process heap.
#[inline(always)]
pub(crate) fn record(bytes: i64, alloc: bool) {
    match my_slot() {
        Some(slot) => {
            let counter = if alloc { &slot.allocs } else { &slot.frees };
            counter.store(counter.load(Relaxed) + 1, Relaxed);
            let delta = slot.delta.load(Relaxed) + bytes;
            if !(-FLUSH_BYTES..=FLUSH_BYTES).contains(&delta) {
                return flush(slot, delta);
            }
            slot.delta.store(delta, Relaxed);
            if alloc {
                let now = slot.base.load(Relaxed) + delta;
                if now > 0 && now as u64 > slot.high.load(Relaxed) {
                    slot.high.store(now as u64, Relaxed);
                }
            }
        }
        None => {
            let counter = if alloc { &OVERFLOW.allocs } else { &OVERFLOW.frees };
            counter.fetch_add(1, Relaxed);
            let now = IN_USE.fetch_add(bytes, Relaxed) + bytes;
            if alloc {
                PEAK.fetch_max(now.max(0) as u64, Relaxed);
            }
        }
    }
}

/// Adds a slot's delta to the shared total.
#[cold]
#[inline(never)]
fn flush(slot: &Slot, delta: i64) {
    let now = IN_USE.fetch_add(delta, Relaxed) + delta;
    slot.delta.store(0, Relaxed);
    slot.base.store(now, Relaxed);
    PEAK.fetch_max(now.max(0) as u64, Relaxed);
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
    let mut in_use = IN_USE.load(Relaxed);
    let (mut allocs, mut frees, mut high) = (OVERFLOW.allocs.load(Relaxed), OVERFLOW.frees.load(Relaxed), 0u64);
    for slot in &SLOT_TABLE {
        allocs += slot.allocs.load(Relaxed);
        frees += slot.frees.load(Relaxed);
        in_use += slot.delta.load(Relaxed);
        high = high.max(slot.high.load(Relaxed));
    }
    let in_use = in_use.max(0) as u64;
    // Remember what this read saw, so that the peak never goes down between reads.
    let peak = high.max(in_use);
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
            record(layout.size() as i64, true);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise (non-zero size).
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            record(layout.size() as i64, true);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's promise (`ptr` allocated here with `layout`).
        unsafe { self.inner.dealloc(ptr, layout) };
        record(-(layout.size() as i64), false);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            record(-(layout.size() as i64), false);
            record(new_size as i64, true);
        }
        p
    }
}
