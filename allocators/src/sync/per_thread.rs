//! [`PerThread`]: one value per (object, thread), reached from the hot path with one
//! thread-local compare and no locked instruction.
//!
//! The statistics counters and the tracking allocator's chunk tables are built on it: each
//! thread writes only its own value with plain relaxed loads and stores, and readers visit all
//! values. A locked read-modify-write costs about as much as a whole small malloc/free pair, so
//! this is what keeps always-on bookkeeping cheap.
//!
//! When a thread exits, its values are handed back ([`ThreadValue::retire`]) and the next new
//! thread that needs one adopts it, so an object never holds more values than the most threads
//! that used it at once.

use core::any::Any;
use core::cell::{Cell, RefCell};
use core::fmt;
use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use crate::primitives::{AtomicBool, Mutex};

/// Direct-mapped thread-local cache slots, indexed by cache id.
const CACHE_SLOTS: usize = 32;

/// Unique ids: 0 marks an empty cache slot.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(not(loom))]
thread_local! {
    /// `(cache id, pointer to this thread's value)`. No destructor, so usable at any point of the
    /// thread's life, even while other thread-locals are being destroyed.
    static CACHE: [Cell<(u64, *const ())>; CACHE_SLOTS] =
        const { [const { Cell::new((0, ptr::null())) }; CACHE_SLOTS] };
    /// The values this thread owns; dropped at thread exit, which hands them back.
    static OWNED: RefCell<Owned> = const { RefCell::new(Owned(Vec::new())) };
}

// Loom runs its threads on one OS thread: the cache and the owned values must be loom's
// thread-locals there (dropped when each loom thread ends, as the standard ones are).
#[cfg(loom)]
loom::thread_local! {
    static CACHE: [Cell<(u64, *const ())>; CACHE_SLOTS] = [const { Cell::new((0, ptr::null())) }; CACHE_SLOTS];
    static OWNED: RefCell<Owned> = RefCell::new(Owned(Vec::new()));
}

/// What a per-thread value must do when its thread stops or another thread takes it over.
pub trait ThreadValue: Default + Send + Sync + 'static {
    /// State shared by all threads' values of one object.
    type Shared: Send + Sync + 'static;

    /// The owner thread is exiting: fold whatever must not stay thread-private into `shared`.
    /// Runs under the object's lock, before the value becomes adoptable.
    fn retire(&self, shared: &Self::Shared) {
        let _ = shared;
    }

    /// The thread's cache entry for this value was invalidated (see
    /// [`PerThread::invalidate_caches`]) and is being refilled by the owner thread.
    fn refresh(&self, shared: &Self::Shared) {
        let _ = shared;
    }
}

struct Slot<T> {
    value: T,
    /// The owner thread has exited; the slot may be adopted.
    retired: AtomicBool,
}

struct Inner<T: ThreadValue> {
    uid: u64,
    shared: T::Shared,
    slots: Mutex<Vec<Arc<Slot<T>>>>,
}

/// One `T` per thread that touches this object, plus a `T::Shared` for all of them.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
/// use tensormem_allocators::{PerThread, ThreadValue};
///
/// #[derive(Default)]
/// struct Count(AtomicU64);
/// impl ThreadValue for Count {
///     type Shared = ();
/// }
///
/// let counts: PerThread<Count> = PerThread::new(());
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             for _ in 0..1000 {
///                 // Only this thread writes its own value: a plain load and store is enough.
///                 counts.with(|c, _| c.0.store(c.0.load(Relaxed) + 1, Relaxed));
///             }
///         });
///     }
/// });
/// let mut total = 0;
/// counts.for_each(|c| total += c.0.load(Relaxed));
/// assert_eq!(total, 4000);
/// ```
pub struct PerThread<T: ThreadValue> {
    /// The thread-local cache key; replaced by `invalidate_caches`.
    cache_id: AtomicU64,
    inner: Arc<Inner<T>>,
}

impl<T: ThreadValue> PerThread<T> {
    /// An object with no per-thread values yet and the given shared state.
    pub fn new(shared: T::Shared) -> Self {
        Self {
            cache_id: AtomicU64::new(NEXT_ID.fetch_add(1, Relaxed)),
            inner: Arc::new(Inner { uid: NEXT_ID.fetch_add(1, Relaxed), shared, slots: Mutex::new(Vec::new()) }),
        }
    }

    /// The state shared by all threads.
    #[inline(always)]
    pub fn shared(&self) -> &T::Shared {
        &self.inner.shared
    }

    /// Runs `f` with this thread's value, which no other thread writes while `f` runs, and the
    /// shared state. Returns `None` (without running `f`) when the thread's thread-locals are
    /// already destroyed, i.e. during thread exit; the caller then needs a shared fallback.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(&T, &T::Shared) -> R) -> Option<R> {
        self.with_or(|| None, |value, shared| Some(f(value, shared)))
    }

    /// Like [`with`](Self::with), but runs `fallback` instead of returning `None`, so that small
    /// results come back in registers.
    #[inline(always)]
    pub fn with_or<R>(&self, fallback: impl FnOnce() -> R, f: impl FnOnce(&T, &T::Shared) -> R) -> R {
        let id = self.cache_id.load(Relaxed);
        let (slot_id, p) = CACHE.with(|c| c[id as usize % CACHE_SLOTS].get());
        if slot_id == id {
            // SAFETY: cache ids are unique across all `PerThread` objects and never reused, so an
            // entry with our current id was stored by this object and points at one of its
            // `Slot<T>`s, owned by this thread and kept alive by `self.inner.slots` (an `Arc`) for
            // as long as `self` lives. Entries are cleared before the thread hands its slots back,
            // so no other thread writes the slot now.
            let slot = unsafe { &*p.cast::<Slot<T>>() };
            return f(&slot.value, &self.inner.shared);
        }
        self.with_slow(id, f).unwrap_or_else(fallback)
    }

    #[cold]
    #[inline(never)]
    fn with_slow<R>(&self, id: u64, f: impl FnOnce(&T, &T::Shared) -> R) -> Option<R> {
        let slot = OWNED.try_with(|owned| owned.try_borrow_mut().ok().map(|mut o| o.slot_for(&self.inner))).ok()??;
        slot.value.refresh(&self.inner.shared);
        let p = Arc::as_ptr(&slot).cast::<()>();
        CACHE.with(|c| c[id as usize % CACHE_SLOTS].set((id, p)));
        Some(f(&slot.value, &self.inner.shared))
    }

    /// Makes every thread take the slow path once more on its next [`with`](Self::with), which
    /// calls [`ThreadValue::refresh`] on its value.
    pub fn invalidate_caches(&self) {
        self.cache_id.store(NEXT_ID.fetch_add(1, Relaxed), Relaxed);
    }

    /// Visits every thread's value (retired ones included) under the object's lock. Values may
    /// change while they are visited.
    pub fn for_each(&self, mut f: impl FnMut(&T)) {
        self.visit(|values| values.for_each(&mut f));
    }

    /// Runs `f` over every thread's value while holding the object's lock, which
    /// [`ThreadValue::retire`] also holds: whatever `f` reads of the shared state is consistent
    /// with the values, even while a thread is exiting.
    pub fn visit<R>(&self, f: impl FnOnce(&mut dyn Iterator<Item = &T>) -> R) -> R {
        let slots = self.inner.slots.lock();
        f(&mut slots.iter().map(|s| &s.value))
    }

    /// How many values exist (live and retired threads).
    pub fn len(&self) -> usize {
        self.inner.slots.lock().len()
    }

    /// True when no thread has touched the object yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: ThreadValue> fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerThread").field("type", &core::any::type_name::<T>()).field("values", &self.len()).finish()
    }
}

/// A value owned by this thread, type-erased so one thread-local list holds all kinds.
trait OwnedEntry {
    fn uid(&self) -> u64;
    fn alive(&self) -> bool;
    fn slot(&self) -> &dyn Any;
    fn retire(&self);
}

struct Entry<T: ThreadValue> {
    uid: u64,
    inner: Weak<Inner<T>>,
    slot: Arc<Slot<T>>,
}

impl<T: ThreadValue> OwnedEntry for Entry<T> {
    fn uid(&self) -> u64 {
        self.uid
    }

    fn alive(&self) -> bool {
        self.inner.strong_count() > 0
    }

    fn slot(&self) -> &dyn Any {
        &self.slot
    }

    fn retire(&self) {
        if let Some(inner) = self.inner.upgrade() {
            let _slots = inner.slots.lock();
            self.slot.value.retire(&inner.shared);
            self.slot.retired.store(true, Relaxed);
        }
    }
}

struct Owned(Vec<Box<dyn OwnedEntry>>);

impl Owned {
    fn slot_for<T: ThreadValue>(&mut self, inner: &Arc<Inner<T>>) -> Arc<Slot<T>> {
        self.0.retain(|e| e.alive());
        if let Some(e) = self.0.iter().find(|e| e.uid() == inner.uid)
            && let Some(slot) = e.slot().downcast_ref::<Arc<Slot<T>>>()
        {
            return Arc::clone(slot);
        }
        let slot = {
            let mut slots = inner.slots.lock();
            match slots.iter().find(|s| s.retired.load(Relaxed)) {
                Some(s) => {
                    s.retired.store(false, Relaxed);
                    Arc::clone(s)
                }
                None => {
                    let s = Arc::new(Slot { value: T::default(), retired: AtomicBool::new(false) });
                    slots.push(Arc::clone(&s));
                    s
                }
            }
        };
        self.0.push(Box::new(Entry { uid: inner.uid, inner: Arc::downgrade(inner), slot: Arc::clone(&slot) }));
        slot
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // Stop the hot path from reaching slots we are about to hand back.
        let _ = CACHE.try_with(|c| c.iter().for_each(|s| s.set((0, ptr::null()))));
        for e in self.0.drain(..) {
            e.retire();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    use super::*;

    #[derive(Default)]
    struct Count(AtomicU64);
    impl ThreadValue for Count {
        type Shared = AtomicU64;
    }

    #[test]
    fn each_thread_writes_its_own_value_and_every_count_outlives_its_thread() {
        let counts: Arc<PerThread<Count>> = Arc::new(PerThread::new(AtomicU64::new(0)));
        std::thread::scope(|s| {
            for t in 1..=8u64 {
                let counts = Arc::clone(&counts);
                s.spawn(move || {
                    for _ in 0..10_000 * t {
                        counts.with(|c, shared| {
                            // The owner alone writes its value: a load and a store, no lock.
                            c.0.store(c.0.load(Relaxed) + 1, Relaxed);
                            shared.fetch_add(1, Relaxed);
                        });
                    }
                });
            }
        });
        // A slot of a thread that ended goes to the next new thread, value and all: no count is
        // lost, and there are never more slots than threads alive at once.
        let mut total = 0;
        counts.for_each(|c| total += c.0.load(Relaxed));
        assert_eq!(total, 360_000, "every increment of every thread is kept");
        assert_eq!(counts.shared().load(Relaxed), 360_000);
        assert!((1..=8).contains(&counts.len()), "{} slots", counts.len());
    }

    #[test]
    fn two_objects_never_share_a_threads_value() {
        let a: PerThread<Count> = PerThread::new(AtomicU64::new(0));
        let b: PerThread<Count> = PerThread::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..1_000 {
                        let target = if i % 2 == 0 { &a } else { &b };
                        target.with(|c, _| c.0.store(c.0.load(Relaxed) + 1, Relaxed));
                    }
                });
            }
        });
        let (mut sa, mut sb) = (0, 0);
        a.for_each(|c| sa += c.0.load(Relaxed));
        b.for_each(|c| sb += c.0.load(Relaxed));
        assert_eq!((sa, sb), (2_000, 2_000));
    }

    #[test]
    fn an_object_dropped_while_its_threads_live_and_one_made_after_start_from_zero() {
        let first: PerThread<Count> = PerThread::new(AtomicU64::new(0));
        first.with(|c, _| c.0.store(7, Relaxed));
        drop(first);
        // A new object on the same thread (possibly at the same address) gets a fresh value.
        let second: PerThread<Count> = PerThread::new(AtomicU64::new(0));
        assert_eq!(second.with(|c, _| c.0.load(Relaxed)), Some(0));
    }
}

/// Loom models of the hand-over between threads. Run with `RUSTFLAGS="--cfg loom" cargo test
/// --release -p tensormem-allocators --lib loom`.
#[cfg(all(test, loom))]
mod loom_models {
    use core::sync::atomic::Ordering::Relaxed;

    use loom::sync::Arc;
    use loom::thread;

    use super::{PerThread, ThreadValue};
    use crate::primitives::{AtomicU64, loom_model};

    const PREEMPTIONS: usize = 3;

    /// A count that moves into the shared total when its thread exits, as the counters' in-use
    /// delta does.
    #[derive(Default)]
    struct Delta(AtomicU64);
    impl ThreadValue for Delta {
        type Shared = AtomicU64;
        fn retire(&self, shared: &AtomicU64) {
            shared.fetch_add(self.0.swap(0, Relaxed), Relaxed);
        }
    }

    fn total(p: &PerThread<Delta>) -> u64 {
        p.visit(|values| p.shared().load(Relaxed) + values.map(|v| v.0.load(Relaxed)).sum::<u64>())
    }

    #[test]
    fn loom_a_reader_counts_an_exiting_threads_value_once() {
        loom_model(PREEMPTIONS, || {
            let p = Arc::new(PerThread::<Delta>::new(AtomicU64::new(0)));
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let p = Arc::clone(&p);
                    thread::spawn(move || {
                        p.with(|v, _| v.0.store(v.0.load(Relaxed) + 1, Relaxed));
                    })
                })
                .collect();
            // While the threads write and retire: each write is seen once or not yet, never twice.
            assert!(total(&p) <= 2);
            for w in workers {
                w.join().unwrap();
            }
            // Loom may end the threads' thread-locals (and so retire their values) after `join`:
            // retired or not, each write counts once.
            assert_eq!(total(&p), 2);
        });
    }

    #[test]
    fn loom_a_new_thread_adopts_a_retired_value_and_writes_it_alone() {
        loom_model(PREEMPTIONS, || {
            let p = Arc::new(PerThread::<Delta>::new(AtomicU64::new(0)));
            let p1 = Arc::clone(&p);
            let first = thread::spawn(move || {
                p1.with(|v, _| v.0.store(5, Relaxed));
            });
            let p2 = Arc::clone(&p);
            // May start before or after the first exits: it adopts the retired value or gets a
            // new one, and either way its value is its own (starts at what retire left: 0).
            let second = thread::spawn(move || p2.with(|v, _| v.0.swap(7, Relaxed)));
            first.join().unwrap();
            let seen = second.join().unwrap();
            assert_eq!(seen, Some(0));
            assert!(p.len() <= 2);
            // The second thread's value was retired too: 5 + 7 in the shared total.
            assert_eq!(total(&p), 12);
        });
    }
}
