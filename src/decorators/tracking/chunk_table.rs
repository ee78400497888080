//! [`ChunkTable`]: the per-thread map from live pointer to chunk record behind the
//! [`TrackingAllocator`](crate::TrackingAllocator).
//!
//! # Why not one shared map
//! A sharded map such as dashmap takes a lock (two locked instructions) per insert and per
//! remove, several times the cost of a whole jemalloc alloc+free pair
//! (`docs/per-thread-chunk-tables.md`). Here
//! each thread owns one open-addressing table (via [`PerThread`](crate::allocators::PerThread))
//! and, as its only writer, inserts and removes with plain atomic stores: no lock, no locked
//! instruction.
//!
//! # Concurrency
//! - The owner inserts into EMPTY or TOMB slots only, and removes its own entries by storing
//!   TOMB. Each write is framed by a per-slot sequence number (odd while writing), so readers can
//!   tell a consistent record from one being rewritten.
//! - Another thread freeing a pointer this table holds (a cross-thread free) takes the table's
//!   read lock and swaps the key from the address to TOMB with one compare-and-swap. The owner
//!   never writes a slot whose key is a live address, so the two never write the same slot; the
//!   only overlap would be two frees of the same live pointer at once, which the `Allocator`
//!   contract already forbids.
//! - Only the owner replaces the slot array (to grow or to sweep tombstones), under the write
//!   lock, so remote readers never see an array being replaced or freed.
//! - Orderings for a cross-thread free: the remote thread reads the record, then swaps the key
//!   to TOMB with `AcqRel`; the owner reads a key with `Acquire` before reusing the slot. The
//!   release half of the swap keeps the record's loads before it, and the owner's acquire load
//!   that sees TOMB synchronises with it, so the owner's rewrite of the slot happens after the
//!   remote thread read the record: the remote free can never read a recycled record (load
//!   buffering would allow that with relaxed orderings; no x86 or ARM core does it, the memory
//!   model does).

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use crate::allocators::ThreadValue;
use crate::allocators::primitives::{AtomicU32, AtomicU64, AtomicUsize, RwLock, fence, wait_step};

const EMPTY: usize = 0;
/// No allocation can start at the last byte of the address space, so this is never a key.
const TOMB: usize = usize::MAX;
/// Under loom, small enough that a model reaches a rebuild in a few inserts.
const INITIAL_CAPACITY: usize = if cfg!(loom) { 4 } else { 64 };

/// What the tracker records for one live pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) requested: usize,
    pub(crate) allocated: usize,
    pub(crate) id: u64,
    pub(crate) align: usize,
    /// The scope tag's raw number (0: none).
    pub(crate) tag: u32,
}

#[derive(Default)]
struct Slot {
    /// Even when stable, odd while the owner rewrites the slot.
    seq: AtomicU64,
    key: AtomicUsize,
    requested: AtomicUsize,
    allocated: AtomicUsize,
    id: AtomicU64,
    align: AtomicUsize,
    tag: AtomicU32,
}

impl Slot {
    #[inline(always)]
    fn record(&self) -> Record {
        Record {
            requested: self.requested.load(Relaxed),
            allocated: self.allocated.load(Relaxed),
            id: self.id.load(Relaxed),
            align: self.align.load(Relaxed),
            tag: self.tag.load(Relaxed),
        }
    }

    /// A consistent `(key, record)` snapshot.
    fn read(&self) -> (usize, Record) {
        let mut spins = 0u32;
        loop {
            let before = self.seq.load(Acquire);
            if before % 2 == 1 {
                // The owner is rewriting the slot; if it was descheduled mid-write, let it run.
                spins = spins.wrapping_add(1);
                wait_step(spins);
                continue;
            }
            let key = self.key.load(Relaxed);
            let record = self.record();
            fence(Acquire);
            if self.seq.load(Relaxed) == before {
                return (key, record);
            }
        }
    }

    /// Owner only, on an EMPTY or TOMB slot.
    #[inline(always)]
    fn write(&self, key: usize, r: Record) {
        let seq = self.seq.load(Relaxed);
        self.seq.store(seq + 1, Relaxed);
        fence(Release);
        self.requested.store(r.requested, Relaxed);
        self.allocated.store(r.allocated, Relaxed);
        self.id.store(r.id, Relaxed);
        self.align.store(r.align, Relaxed);
        self.tag.store(r.tag, Relaxed);
        // Release: a remote thread that sees the key (Acquire in `find`) sees the record.
        self.key.store(key, Release);
        self.seq.store(seq + 2, Release);
    }
}

/// One thread's live pointers. See the module docs for who may call what.
pub(crate) struct ChunkTable {
    slots: RwLock<Box<[Slot]>>,
    /// Slots that are not EMPTY (live or TOMB); written by the owner only.
    used: AtomicUsize,
    /// The next allocation id of this thread's block, and the end of the block; owner only.
    next_id: AtomicU64,
    end_id: AtomicU64,
}

/// How many allocation ids a thread takes from the tracker's counter at a time.
pub(crate) const ID_BLOCK: u64 = 64;

impl Default for ChunkTable {
    fn default() -> Self {
        Self {
            slots: RwLock::new(new_slots(INITIAL_CAPACITY)),
            used: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            end_id: AtomicU64::new(0),
        }
    }
}

impl ThreadValue for ChunkTable {
    type Shared = ();
}

fn new_slots(capacity: usize) -> Box<[Slot]> {
    (0..capacity).map(|_| Slot::default()).collect()
}

/// Fibonacci hashing: pointers differ mostly in their middle bits, the product's top bits mix
/// all of them.
#[inline(always)]
fn home(key: usize, capacity: usize) -> usize {
    let bits = capacity.trailing_zeros();
    ((key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
}

impl ChunkTable {
    /// The slot array, without the lock.
    ///
    /// # Safety
    /// Only the owner thread (inside `PerThread::with` for this table) may call this: it is the
    /// only thread that replaces the array, which it does under the write lock and never while
    /// it holds the reference returned here.
    #[inline(always)]
    unsafe fn owner_slots(&self) -> &[Slot] {
        // SAFETY: per the contract, no `&mut` to the array exists while the owner reads it; other
        // threads hold only shared references (read guards).
        unsafe { &*self.slots.data_ptr() }
    }

    /// The next allocation id, from this thread's block; a new block of [`ID_BLOCK`] ids is
    /// taken from `counter` when the block is used up. Owner thread only (like `insert_owned`;
    /// safe because it only touches owner-written atomics).
    #[inline(always)]
    pub(crate) fn next_id(&self, counter: &AtomicU64) -> u64 {
        let id = self.next_id.load(Relaxed);
        if id < self.end_id.load(Relaxed) {
            self.next_id.store(id + 1, Relaxed);
            return id;
        }
        let start = counter.fetch_add(ID_BLOCK, Relaxed);
        self.next_id.store(start + 1, Relaxed);
        self.end_id.store(start + ID_BLOCK, Relaxed);
        start
    }

    /// Records a new live pointer.
    ///
    /// # Safety
    /// Owner thread only (see [`owner_slots`](Self::owner_slots)), and `key` is not live in any
    /// table (the inner allocator just returned it).
    #[inline(always)]
    pub(crate) unsafe fn insert_owned(&self, key: usize, record: Record) {
        let used = self.used.load(Relaxed);
        // SAFETY: the caller is the owner.
        let mut slots = unsafe { self.owner_slots() };
        if (used + 1) * 4 > slots.len() * 3 {
            self.rebuild();
            // SAFETY: as above; the rebuild is over.
            slots = unsafe { self.owner_slots() };
        }
        let mask = slots.len() - 1;
        let mut i = home(key, slots.len());
        loop {
            let slot = &slots[i];
            // Acquire: a TOMB left by a remote free synchronises with its swap (see the module docs).
            let k = slot.key.load(Acquire);
            if k == EMPTY || k == TOMB {
                slot.write(key, record);
                if k == EMPTY {
                    self.used.store(self.used.load(Relaxed) + 1, Relaxed);
                }
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `key` if this thread's table holds it with `requested` bytes; returns its
    /// `(allocated size, alignment)`, or `(0, 0)` when the key is not here or was allocated with
    /// another size (the caller's slow path sorts those out). Two words, so it stays in registers.
    ///
    /// # Safety
    /// Owner thread only (see [`owner_slots`](Self::owner_slots)).
    #[inline(always)]
    pub(crate) unsafe fn remove_owned(&self, key: usize, requested: usize) -> (usize, usize) {
        // SAFETY: the caller is the owner.
        let slots = unsafe { self.owner_slots() };
        let mask = slots.len() - 1;
        let mut i = home(key, slots.len());
        loop {
            let slot = &slots[i];
            match slot.key.load(Relaxed) {
                EMPTY => return (0, 0),
                k if k == key => {
                    if slot.requested.load(Relaxed) != requested {
                        return (0, 0);
                    }
                    slot.key.store(TOMB, Release);
                    return (slot.allocated.load(Relaxed), slot.align.load(Relaxed));
                }
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Removes `key` from another thread's table (a cross-thread free). Any thread.
    pub(crate) fn remove_remote(&self, key: usize) -> Option<Record> {
        let slots = self.slots.read();
        let slot = find(&slots, key)?;
        let record = slot.record();
        // AcqRel: the record's loads above stay before the swap, which the owner acquires before
        // it reuses the slot (see the module docs).
        slot.key.compare_exchange(key, TOMB, AcqRel, Relaxed).ok().map(|_| record)
    }

    /// The record of `key`, if live here. Any thread.
    pub(crate) fn get(&self, key: usize) -> Option<Record> {
        let slots = self.slots.read();
        let (k, record) = find(&slots, key)?.read();
        (k == key).then_some(record)
    }

    /// Visits every live entry. Any thread.
    pub(crate) fn for_each_live(&self, mut f: impl FnMut(usize, Record)) {
        for slot in self.slots.read().iter() {
            let (key, record) = slot.read();
            if key != EMPTY && key != TOMB {
                f(key, record);
            }
        }
    }

    /// Rebuilds the array without tombstones, twice as large if more than half of it is live.
    /// Owner only (called from `insert_owned`).
    #[cold]
    #[inline(never)]
    fn rebuild(&self) {
        let mut slots = self.slots.write();
        let live: Vec<(usize, Record)> = slots
            .iter()
            .filter_map(|s| {
                let k = s.key.load(Relaxed);
                (k != EMPTY && k != TOMB).then(|| (k, s.record()))
            })
            .collect();
        let capacity = if live.len() * 2 >= slots.len() { slots.len() * 2 } else { slots.len() };
        let fresh = new_slots(capacity);
        let mask = capacity - 1;
        for &(key, record) in &live {
            let mut i = home(key, capacity);
            while fresh[i].key.load(Relaxed) != EMPTY {
                i = (i + 1) & mask;
            }
            fresh[i].write(key, record);
        }
        *slots = fresh;
        self.used.store(live.len(), Relaxed);
    }
}

/// The slot holding `key`, probing from its home slot until an EMPTY slot.
#[inline]
fn find(slots: &[Slot], key: usize) -> Option<&Slot> {
    let mask = slots.len() - 1;
    let mut i = home(key, slots.len());
    loop {
        let slot = &slots[i];
        match slot.key.load(Acquire) {
            EMPTY => return None,
            k if k == key => return Some(slot),
            _ => i = (i + 1) & mask,
        }
    }
}

/// Loom models of a table's owner racing other threads. Run with `RUSTFLAGS="--cfg loom" cargo
/// test --release -p tensormem --no-default-features --lib loom`.
#[cfg(all(test, loom))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;
    use crate::allocators::primitives::loom_model;

    const PREEMPTIONS: usize = 3;

    fn record(n: usize) -> Record {
        Record { requested: n, allocated: n * 2, id: n as u64, align: 8, tag: n as u32 }
    }

    /// A key other than `key` whose probe starts at the same slot.
    fn same_home(key: usize) -> usize {
        (1..).map(|i| key + i * 64).find(|&k| home(k, INITIAL_CAPACITY) == home(key, INITIAL_CAPACITY)).unwrap()
    }

    #[test]
    fn loom_a_reader_sees_a_whole_record_or_none() {
        loom_model(PREEMPTIONS, || {
            let t = Arc::new(ChunkTable::default());
            let owner = {
                let t = Arc::clone(&t);
                thread::spawn(move || {
                    // SAFETY: this thread is the table's only owner-side caller; the key is new.
                    unsafe { t.insert_owned(0x1000, record(1)) };
                    // SAFETY: as above.
                    unsafe { t.remove_owned(0x1000, 1) }
                })
            };
            let seen = t.get(0x1000);
            assert!(seen.is_none() || seen == Some(record(1)), "{seen:?}");
            let mut visited = Vec::new();
            t.for_each_live(|k, r| visited.push((k, r)));
            assert!(visited.is_empty() || visited == [(0x1000, record(1))], "{visited:?}");
            assert_eq!(owner.join().unwrap(), (2, 8));
            assert_eq!(t.get(0x1000), None);
        });
    }

    #[test]
    fn loom_a_cross_thread_free_reads_its_record_even_when_the_owner_reuses_the_slot() {
        let (old, new) = (0x1000, same_home(0x1000));
        loom_model(PREEMPTIONS, move || {
            let t = Arc::new(ChunkTable::default());
            // SAFETY: no other thread exists yet; the key is new.
            unsafe { t.insert_owned(old, record(1)) };
            let remote = {
                let t = Arc::clone(&t);
                thread::spawn(move || t.remove_remote(old))
            };
            let owner = {
                let t = Arc::clone(&t);
                // The owner allocates again; if the remote free made the slot a TOMB first, the
                // new record takes that very slot.
                // SAFETY: this thread is the only owner-side caller; the key is new.
                thread::spawn(move || unsafe { t.insert_owned(new, record(2)) })
            };
            assert_eq!(remote.join().unwrap(), Some(record(1)), "the freed record, never the new one");
            owner.join().unwrap();
            assert_eq!((t.get(old), t.get(new)), (None, Some(record(2))));
        });
    }

    #[test]
    fn loom_readers_never_see_the_array_being_replaced() {
        loom_model(PREEMPTIONS, || {
            let t = Arc::new(ChunkTable::default());
            // SAFETY: no other thread exists yet; the keys are new.
            unsafe {
                t.insert_owned(0x1000, record(1));
                t.insert_owned(0x2000, record(2));
            }
            let owner = {
                let t = Arc::clone(&t);
                // The third insert passes three quarters of the small table: a rebuild.
                // SAFETY: this thread is the only owner-side caller; the key is new.
                thread::spawn(move || unsafe { t.insert_owned(0x3000, record(3)) })
            };
            assert_eq!(t.get(0x1000), Some(record(1)));
            assert_eq!(t.remove_remote(0x2000), Some(record(2)));
            owner.join().unwrap();
            let mut live = Vec::new();
            t.for_each_live(|k, r| live.push((k, r)));
            live.sort_unstable_by_key(|e| e.0);
            assert_eq!(live, [(0x1000, record(1)), (0x3000, record(3))]);
        });
    }
}
