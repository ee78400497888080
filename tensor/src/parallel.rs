//! Where kernels run their parallel parts: a private rayon pool, so that a kernel holding its
//! storages' locks never waits inside a pool that also runs other jobs.
//!
//! # Why
//! A kernel locks the storages it reads and writes (so that views on two threads never race)
//! and then splits its work across threads. If it did that on rayon's global pool, a worker
//! waiting for the stolen half of its kernel would run other queued jobs, one of which may lock
//! the same storage: it waits for a lock its own thread holds, forever. The same happens when
//! every worker of the pool is blocked on a lock held by a thread waiting for that pool.
//!
//! So: the parallel part of a kernel runs on [`kernel_pool`] (one worker per
//! [`set_num_threads`] thread), whose workers only ever run kernel pieces (which take no
//! locks); the calling thread, which holds the locks, runs the first piece itself and then
//! waits for the others without stealing anything (spinning first, see [`Finished`], then
//! asleep). A kernel called from inside a rayon job (a worker of any pool: the user's own
//! parallel region, as `at::parallel_for` does in PyTorch) runs on that thread alone.
//!
//! The caller working on a piece (rather than handing all of them to the pool and sleeping, as
//! `ThreadPool::install` does) saves one thread wake-up per kernel; on 16 MB operands the
//! difference is lost in the noise (the kernels are memory-bound there), on small ones it is
//! the wake-up (`docs/kernel-thread-pool.md`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable giving the number of kernel threads at startup.
pub const NUM_THREADS_ENV: &str = "TENSORMEM_NUM_THREADS";

/// The environment variable giving, in microseconds, how long kernel threads keep spinning for
/// the next kernel after one ends (see [`set_kernel_spin`]); 0 lets them sleep at once.
pub const KERNEL_SPIN_ENV: &str = "TENSORMEM_KERNEL_SPIN_US";

/// The spin when neither [`set_kernel_spin`] nor [`KERNEL_SPIN_ENV`] says otherwise.
pub const DEFAULT_KERNEL_SPIN: Duration = Duration::from_millis(1);

/// 0: not set yet (read the environment on first use).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The whole number in environment variable `name`, if it holds one.
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The cores this process may run on (read once).
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn default_threads() -> usize {
    env_number(NUM_THREADS_ENV).and_then(|n| usize::try_from(n).ok()).filter(|&n| n > 0).unwrap_or_else(cores)
}

/// How many threads kernels split their work across (`torch.get_num_threads`): the last
/// [`set_num_threads`], else `TENSORMEM_NUM_THREADS`, else the machine's parallelism.
pub fn num_threads() -> usize {
    match THREADS.load(Relaxed) {
        0 => {
            let n = default_threads();
            // Only if still unset: a `set_num_threads` on another thread meanwhile wins.
            match THREADS.compare_exchange(0, n, Relaxed, Relaxed) {
                Ok(_) => n,
                Err(set) => set,
            }
        }
        n => n,
    }
}

/// Sets how many threads kernels split their work across (`torch.set_num_threads`); 1 runs
/// every kernel on its calling thread. 0 is taken as 1.
///
/// The next parallel kernel starts a pool of exactly `n` kernel threads (as OpenMP sizes its
/// team by `omp_set_num_threads`), so that each kernel's pieces keep running on the same threads
/// and cores; the previous count's threads end once no kernel uses them. Call it at startup,
/// not between kernels: starting a pool costs one thread start per thread.
///
/// ```
/// use tensormem_tensor::{num_threads, set_num_threads};
/// let before = num_threads();
/// set_num_threads(1);
/// assert_eq!(num_threads(), 1);
/// set_num_threads(before);
/// ```
pub fn set_num_threads(n: usize) {
    THREADS.store(n.max(1), Relaxed);
}

/// `u64::MAX`: not set yet (read the environment on first use); else nanoseconds.
static SPIN_NS: AtomicU64 = AtomicU64::new(u64::MAX);

/// How long kernel threads keep spinning for the next kernel after one ends: the last
/// [`set_kernel_spin`], else `TENSORMEM_KERNEL_SPIN_US`, else [`DEFAULT_KERNEL_SPIN`].
pub fn kernel_spin() -> Duration {
    match SPIN_NS.load(Relaxed) {
        u64::MAX => {
            let d = env_number(KERNEL_SPIN_ENV).map_or(DEFAULT_KERNEL_SPIN, Duration::from_micros);
            // Only if still unset: a `set_kernel_spin` on another thread meanwhile wins.
            match SPIN_NS.compare_exchange(u64::MAX, nanos(d), Relaxed, Relaxed) {
                Ok(_) => d,
                Err(set) => Duration::from_nanos(set),
            }
        }
        n => Duration::from_nanos(n),
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1).min(u64::MAX - 1)
}

/// Sets how long the kernel threads that took part in a parallel kernel keep spinning, waiting
/// for the next one, before they sleep (OpenMP's `KMP_BLOCKTIME` / `GOMP_SPINCOUNT`, which
/// PyTorch's CPU kernels get). Waking a sleeping thread takes tens to hundreds of microseconds
/// (more on a virtual machine), which a kernel issued shortly after the last one would pay
/// before its second half can start; spinning burns that thread's core meanwhile.
/// `Duration::ZERO` turns it off. A spinning thread stops as soon as any kernel hands out work.
/// The same bound applies to a kernel's calling thread waiting for its pieces to end (when they
/// are no more than the cores).
///
/// ```
/// use std::time::Duration;
/// use tensormem_tensor::{kernel_spin, set_kernel_spin};
/// set_kernel_spin(Duration::from_micros(200));
/// assert_eq!(kernel_spin(), Duration::from_micros(200));
/// set_kernel_spin(tensormem_tensor::DEFAULT_KERNEL_SPIN);
/// ```
pub fn set_kernel_spin(spin: Duration) {
    SPIN_NS.store(nanos(spin), Relaxed);
}

/// Bumped before a kernel hands work to the pool: spinning threads stop when it changes.
static DISPATCHES: AtomicUsize = AtomicUsize::new(0);

/// Tells spinning kernel threads that work is coming (call before handing it to the pool).
fn dispatching() {
    DISPATCHES.fetch_add(1, Relaxed);
}

/// After a kernel that used `helpers` threads of `pool`: queues a spin job for each of them (up
/// to the pool's size, counting those still spinning), so that they are awake for the next
/// kernel.
fn keep_warm(pool: &KernelPool, helpers: usize) {
    let spin = kernel_spin();
    if spin.is_zero() {
        return;
    }
    // No more spinners than cores (with `set_num_threads` above the machine, more would take
    // cores from the caller's own work between kernels).
    let want = helpers.min(pool.threads()).min(cores());
    loop {
        let n = pool.spinners.load(Relaxed);
        if n >= want {
            return;
        }
        if pool.spinners.compare_exchange(n, n + 1, Relaxed, Relaxed).is_err() {
            continue;
        }
        // Dispatches after this point stop the job, even those before it starts running.
        let seen = DISPATCHES.load(Relaxed);
        let spinners = Arc::clone(&pool.spinners);
        pool.pool.spawn(move || {
            spin_until(spin, || DISPATCHES.load(Relaxed) != seen);
            spinners.fetch_sub(1, Relaxed);
        });
    }
}

/// Spins until `done()` holds or `spin` has passed.
fn spin_until(spin: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    let mut i = 0u32;
    while !done() {
        std::hint::spin_loop();
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) && start.elapsed() >= spin {
            return;
        }
    }
}

/// Counts the jobs a kernel handed to the pool that have ended, so that the caller can spin
/// for them before it leaves the rayon scope.
///
/// A rayon scope entered from a thread that is not one of its workers puts that thread to sleep
/// on a condition variable until the last job ends, and the job's thread then wakes it, a
/// wake-up that costs every parallel kernel more than a small kernel's work. Spinning on this
/// counter first (for at most [`kernel_spin`], as OpenMP's barrier spins for `KMP_BLOCKTIME`)
/// leaves the scope with its jobs already done (`docs/kernel-thread-pool.md`).
struct Finished(AtomicUsize);

/// Counts its job as ended when dropped: when the job returns, and also when it panics (so
/// that the caller stops spinning and the scope resumes the panic at once).
struct EndsJob<'a>(&'a Finished);

impl Drop for EndsJob<'_> {
    fn drop(&mut self) {
        // Release: the job's last access to the kernel's data happens before this.
        self.0.0.fetch_add(1, Release);
    }
}

impl Finished {
    fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// Spins until `jobs` jobs have ended, or for [`kernel_spin`] at most.
    fn spin_for(&self, jobs: usize) {
        spin_until(kernel_spin(), || self.0.load(Acquire) >= jobs);
    }
}

/// The threads a kernel of `work` items may use now: 1 below `2 * grain` items, with one
/// thread configured, or inside a rayon worker (nested parallelism runs inline).
pub(crate) fn threads_for(work: usize, grain: usize) -> usize {
    if work < 2 * grain || rayon::current_thread_index().is_some() {
        return 1;
    }
    num_threads()
}

/// A pool of kernel threads, and the spin jobs queued or running on it.
struct KernelPool {
    pool: rayon::ThreadPool,
    spinners: Arc<AtomicUsize>,
}

impl KernelPool {
    /// The pool's workers.
    fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

/// The pool for the last thread count a kernel asked for.
static CURRENT_POOL: Mutex<Option<Arc<KernelPool>>> = Mutex::new(None);

thread_local! {
    /// This thread's copy of [`CURRENT_POOL`], so that a kernel takes no shared lock to find it.
    static THIS_THREAD_POOL: RefCell<Option<Arc<KernelPool>>> = const { RefCell::new(None) };
}

/// The kernels' own pool for the current [`num_threads`], with exactly that many workers (as
/// OpenMP sizes its team by `omp_set_num_threads`).
///
/// One pool of one worker per core would do for the pieces' count, but not for where they run:
/// at 2 threads on a 16-core machine, each kernel's second piece would go to whichever of the 16
/// workers woke first, a different core from one call to the next, whose caches hold none of
/// the kernel's data (`docs/kernel-thread-pool.md`). When the count changes, the next kernel starts a pool of the new
/// size; the old one's threads end once the kernels running on it have, and every thread that
/// used it has called a kernel since (or ended).
fn kernel_pool() -> Arc<KernelPool> {
    let threads = num_threads();
    THIS_THREAD_POOL
        .try_with(|mine| {
            let mut mine = mine.borrow_mut();
            match mine.as_ref() {
                Some(pool) if pool.threads() == threads => Arc::clone(pool),
                _ => {
                    let pool = pool_of(threads);
                    *mine = Some(Arc::clone(&pool));
                    pool
                }
            }
        })
        // A kernel run by another thread-local's destructor, after this one's.
        .unwrap_or_else(|_| pool_of(threads))
}

/// [`CURRENT_POOL`] if it has `threads` workers, else a new pool of `threads` that replaces it.
fn pool_of(threads: usize) -> Arc<KernelPool> {
    let mut current = CURRENT_POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(pool) = current.as_ref().filter(|p| p.threads() == threads) {
        return Arc::clone(pool);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("tensormem-kernel-{threads}-{i}"))
        .build()
        .unwrap_or_else(|e| panic!("tensormem: cannot start {threads} kernel threads: {e}"));
    let pool = Arc::new(KernelPool { pool, spinners: Arc::new(AtomicUsize::new(0)) });
    *current = Some(Arc::clone(&pool));
    pool
}

/// Runs `f(0)`, ..., `f(pieces - 1)` in parallel: piece 0 on the calling thread, the others on
/// the kernel pool; returns when all are done. The caller must not be a rayon worker (see
/// [`threads_for`]).
pub(crate) fn for_each_piece(pieces: usize, f: impl Fn(usize) + Sync) {
    if pieces <= 1 {
        if pieces == 1 {
            f(0);
        }
        return;
    }
    debug_assert!(rayon::current_thread_index().is_none(), "a rayon worker would steal foreign jobs");
    let f = &f;
    let finished = &Finished::new();
    let pool = kernel_pool();
    dispatching();
    pool.pool.in_place_scope(|s| {
        for p in 1..pieces {
            s.spawn(move |_| {
                let _ends = EndsJob(finished);
                f(p);
            });
        }
        // Again once the pieces are queued: a spin job queued by another thread between the
        // first bump and these pieces would otherwise spin in front of them.
        dispatching();
        f(0);
        // With more pieces than cores (`set_num_threads` above the machine), a spinning caller
        // would take a core from a piece still waiting for one.
        if pieces <= cores() {
            finished.spin_for(pieces - 1);
        }
    });
    keep_warm(&pool, pieces - 1);
}

/// [`for_each_piece`] over `data` cut into `pieces` consecutive parts whose boundaries are
/// multiples of `align` elements (rows): `f(first_index, part)`.
pub(crate) fn for_each_part<T: Send>(data: &mut [T], pieces: usize, align: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let align = align.max(1);
    let units = data.len() / align;
    let pieces = pieces.clamp(1, units.max(1));
    if pieces == 1 {
        f(0, data);
        return;
    }
    let mut parts = Vec::with_capacity(pieces);
    let mut rest = data;
    let mut start = 0;
    for p in 0..pieces {
        let end = if p + 1 == pieces { start + rest.len() } else { units * (p + 1) / pieces * align };
        let (head, tail) = rest.split_at_mut(end - start);
        parts.push(parking_lot::Mutex::new((start, head)));
        rest = tail;
        start = end;
    }
    for_each_piece(pieces, |p| {
        let mut part = parts[p].lock();
        let (first, ref mut slice) = *part;
        f(first, slice);
    });
}

/// [`for_each_piece`], collecting each piece's result in order.
pub(crate) fn map_pieces<R: Send>(pieces: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let mut out: Vec<Option<R>> = (0..pieces).map(|_| None).collect();
    for_each_part(&mut out, pieces, 1, |p, slot| slot[0] = Some(f(p)));
    out.into_iter().flatten().collect()
}

/// Runs `op` (which splits itself with rayon) on the kernel pool. The caller must not be a rayon
/// worker (see [`threads_for`]), so it blocks without running other jobs while it holds its
/// locks.
pub(crate) fn install<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    debug_assert!(rayon::current_thread_index().is_none(), "install from a rayon worker would steal foreign jobs");
    // `install` with the job queued first and the spinners told after (see `for_each_piece`).
    let mut result = None;
    let slot = &mut result;
    let pool = kernel_pool();
    dispatching();
    pool.pool.in_place_scope(move |s| {
        s.spawn(move |_| *slot = Some(op()));
        dispatching();
    });
    keep_warm(&pool, pool.threads().saturating_sub(1));
    // `in_place_scope` returns only after every job it spawned ran (a panic in `op` resumes here).
    result.expect("the scope ran the job")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn kernels_run_on_a_pool_of_as_many_threads_as_set_and_a_replaced_pool_ends() {
        let before = num_threads();
        set_num_threads(3);
        let three = kernel_pool();
        assert_eq!(three.threads(), 3);
        let names = Mutex::new(Vec::new());
        for_each_piece(3, |p| {
            if p > 0 {
                names.lock().unwrap().push(std::thread::current().name().map(str::to_owned));
            }
        });
        let names = names.into_inner().unwrap();
        assert_eq!(names.len(), 2);
        assert!(names.iter().all(|n| n.as_deref().is_some_and(|n| n.starts_with("tensormem-kernel-3-"))), "{names:?}");
        set_num_threads(2);
        let two = kernel_pool();
        assert_eq!(two.threads(), 2);
        assert_eq!(install(rayon::current_num_threads), 2);
        // Back to 3: a new pool; the first one is not kept for a count no longer set.
        set_num_threads(3);
        let again = kernel_pool();
        assert_eq!(again.threads(), 3);
        assert!(!Arc::ptr_eq(&again, &three));
        // A kernel holds its pool: one replaced while it runs finishes the kernel's pieces.
        let old = Arc::downgrade(&three);
        drop((three, two));
        let sum = AtomicU64::new(0);
        for_each_piece(3, |p| {
            set_num_threads(2);
            sum.fetch_add(p as u64 + 1, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 6);
        assert_eq!(kernel_pool().threads(), 2);
        // Once no thread uses it, a replaced pool ends (other tests' threads may hold it a while).
        let deadline = Instant::now() + Duration::from_secs(30);
        while old.upgrade().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(old.upgrade().is_none(), "a replaced pool was kept");
        set_num_threads(before);
    }

    #[test]
    fn spinning_threads_give_way_to_the_next_kernel_and_the_setting_round_trips() {
        let before = kernel_spin();
        // A spin far longer than the test: a piece queued behind a spinner that did not stop
        // would take that long.
        set_kernel_spin(Duration::from_secs(20));
        assert_eq!(kernel_spin(), Duration::from_secs(20));
        let pool = kernel_pool();
        let pieces = pool.threads().max(2);
        let start = Instant::now();
        for round in 0..200u64 {
            let sum = AtomicU64::new(0);
            for_each_piece(pieces, |p| {
                sum.fetch_add(round * 1000 + p as u64, Relaxed);
            });
            let n = pieces as u64;
            assert_eq!(sum.load(Relaxed), round * 1000 * n + n * (n - 1) / 2);
            let r = install(|| round + 1);
            assert_eq!(r, round + 1);
        }
        assert!(start.elapsed() < Duration::from_secs(15), "a kernel waited behind a spinning thread");
        // At most one spinner per pool thread, however many kernels ran.
        assert!(pool.spinners.load(Relaxed) <= pool.threads());
        // Off: spinners stop at the next dispatch and no new ones are queued.
        set_kernel_spin(Duration::ZERO);
        for_each_piece(pieces, |_| {});
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.spinners.load(Relaxed) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(pool.spinners.load(Relaxed), 0);
        // A piece that panics ends the caller's spin at once, and the panic reaches the caller.
        set_kernel_spin(Duration::from_secs(20));
        let start = Instant::now();
        let caught = std::panic::catch_unwind(|| {
            for_each_piece(2, |p| {
                if p == 1 {
                    panic!("piece 1 failed");
                }
            })
        });
        let message = caught.expect_err("the piece's panic reaches the caller");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"piece 1 failed"));
        assert!(start.elapsed() < Duration::from_secs(10), "the caller spun for a piece that had panicked");
        // The longest spin is kept finite (`u64::MAX` means "not set").
        set_kernel_spin(Duration::MAX);
        assert!(kernel_spin() > Duration::from_secs(1 << 30));
        set_kernel_spin(before);
    }
}
