//! The atomics, locks and thread-locals that the lock-free structures (per-thread values,
//! counters, the tracking allocator's chunk tables) are built from: the standard library's and
//! parking_lot's in a normal build, loom's under `--cfg loom`, so that loom can check every
//! interleaving and every ordering those structures rely on. Only what the models exercise goes
//! through here; ids and other values whose ordering nothing relies on stay plain atomics.
//!
//! The loom models run with
//! `RUSTFLAGS="--cfg loom" cargo test --release -p tensormem-allocators -p tensormem --no-default-features --lib loom`.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, fence};

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, fence};

/// Runs a loom model of `f` exploring every interleaving with at most `preemptions` forced
/// thread switches (`LOOM_MAX_PREEMPTIONS` overrides it): bugs of ordering need few, and the
/// unbounded search of three threads through the per-thread slow path does not end in minutes.
#[cfg(loom)]
pub fn loom_model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(preemptions));
    builder.check(f);
}

/// One step of a wait for another thread: a spin hint, and every 64th step a yield to the
/// scheduler (the other thread may have been descheduled mid-write). Under loom, a yield, so the
/// model lets the other thread run.
#[inline]
pub fn wait_step(steps: u32) {
    #[cfg(loom)]
    {
        let _ = steps;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    if steps.is_multiple_of(64) {
        std::thread::yield_now();
    } else {
        core::hint::spin_loop();
    }
}

#[cfg(not(loom))]
mod locks {
    use core::fmt;

    /// A mutex: parking_lot's.
    #[derive(Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);

    /// A locked [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A mutex holding `value`.
        pub fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        /// Locks it.
        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }

    /// A reader-writer lock: parking_lot's.
    #[derive(Default)]
    pub struct RwLock<T>(parking_lot::RwLock<T>);

    impl<T> RwLock<T> {
        /// A lock holding `value`.
        pub fn new(value: T) -> Self {
            Self(parking_lot::RwLock::new(value))
        }

        /// Shared access.
        #[inline]
        pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, T> {
            self.0.read()
        }

        /// Exclusive access.
        #[inline]
        pub fn write(&self) -> parking_lot::RwLockWriteGuard<'_, T> {
            self.0.write()
        }

        /// The value without the lock; the caller must make sure no `&mut` to it exists while it
        /// reads through the pointer.
        #[inline(always)]
        pub fn data_ptr(&self) -> *mut T {
            self.0.data_ptr()
        }
    }

    impl<T: fmt::Debug> fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }
}

#[cfg(loom)]
mod locks {
    use core::cell::UnsafeCell;
    use core::fmt;
    use core::ops::{Deref, DerefMut};

    /// A mutex: loom's, so that the model schedules around it.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// A locked [`Mutex`].
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A mutex holding `value`.
        pub fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        /// Locks it (a panic while it was held is not a state the models reach).
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// A reader-writer lock: loom's lock over the value, which `data_ptr` can also reach.
    pub struct RwLock<T> {
        lock: loom::sync::RwLock<()>,
        value: UnsafeCell<T>,
    }

    // SAFETY: the value is reached through the guards, which hold loom's lock (shared for `&T`,
    // exclusive for `&mut T`), or through `data_ptr`, whose callers keep the same rule.
    unsafe impl<T: Send + Sync> Sync for RwLock<T> {}

    impl<T: Default> Default for RwLock<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    impl<T> fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("RwLock")
        }
    }

    /// Shared access to a [`RwLock`]'s value.
    #[derive(Debug)]
    pub struct ReadGuard<'a, T> {
        _guard: loom::sync::RwLockReadGuard<'a, ()>,
        value: &'a T,
    }

    /// Exclusive access to a [`RwLock`]'s value.
    #[derive(Debug)]
    pub struct WriteGuard<'a, T> {
        _guard: loom::sync::RwLockWriteGuard<'a, ()>,
        value: &'a mut T,
    }

    impl<T> RwLock<T> {
        /// A lock holding `value`.
        pub fn new(value: T) -> Self {
            Self { lock: loom::sync::RwLock::new(()), value: UnsafeCell::new(value) }
        }

        /// Shared access.
        pub fn read(&self) -> ReadGuard<'_, T> {
            let guard = self.lock.read().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the shared lock is held for the guard's life: no `&mut` exists meanwhile.
            ReadGuard { _guard: guard, value: unsafe { &*self.value.get() } }
        }

        /// Exclusive access.
        pub fn write(&self) -> WriteGuard<'_, T> {
            let guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the exclusive lock is held for the guard's life: no other reference exists.
            WriteGuard { _guard: guard, value: unsafe { &mut *self.value.get() } }
        }

        /// The value without the lock (see the standard build's `data_ptr`).
        pub fn data_ptr(&self) -> *mut T {
            self.value.get()
        }
    }

    impl<T> Deref for ReadGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.value
        }
    }

    impl<T> Deref for WriteGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.value
        }
    }

    impl<T> DerefMut for WriteGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.value
        }
    }
}

pub use locks::{Mutex, MutexGuard, RwLock};
