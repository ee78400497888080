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
//! So: the parallel part of a kernel runs on [`kernel_pool`], whose workers only ever run kernel
//! pieces (which take no locks); the calling thread, which holds the locks, runs the first
//! piece itself and then waits for the others without stealing anything. A kernel called from
//! inside a rayon job (a worker of any pool: the user's own parallel region, as
//! `at::parallel_for` does in PyTorch) runs on that thread alone.
//!
//! The caller working on a piece (rather than handing all of them to the pool and sleeping, as
//! `ThreadPool::install` does) saves one thread wake-up per kernel; on 16 MB operands the
//! difference is lost in the noise (the kernels are memory-bound there), on small ones it is
//! the wake-up (tens of microseconds on a VM).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The environment variable giving the number of kernel threads at startup.
pub const NUM_THREADS_ENV: &str = "TENSORMEM_NUM_THREADS";

/// 0: not set yet (read the environment on first use).
static THREADS: AtomicUsize = AtomicUsize::new(0);

fn default_threads() -> usize {
    std::env::var(NUM_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How many threads kernels split their work across (`torch.get_num_threads`): the last
/// [`set_num_threads`], else `TENSORMEM_NUM_THREADS`, else the machine's parallelism.
pub fn num_threads() -> usize {
    match THREADS.load(Relaxed) {
        0 => {
            let n = default_threads();
            THREADS.store(n, Relaxed);
            n
        }
        n => n,
    }
}

/// Sets how many threads kernels split their work across (`torch.set_num_threads`); 1 runs
/// every kernel on its calling thread. 0 is taken as 1.
///
/// ```
/// use tensormem::tensor::{num_threads, set_num_threads};
/// let before = num_threads();
/// set_num_threads(1);
/// assert_eq!(num_threads(), 1);
/// set_num_threads(before);
/// ```
pub fn set_num_threads(n: usize) {
    THREADS.store(n.max(1), Relaxed);
}

/// The threads a kernel of `work` items may use now: 1 below `2 * grain` items, with one
/// thread configured, or inside a rayon worker (nested parallelism runs inline).
pub(crate) fn threads_for(work: usize, grain: usize) -> usize {
    if work < 2 * grain || rayon::current_thread_index().is_some() {
        return 1;
    }
    num_threads()
}

/// The kernels' own pool, as large as the machine (more kernel threads than cores would only
/// queue pieces).
fn kernel_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.max(num_threads()).max(1))
            .thread_name(|i| format!("tensormem-kernel-{i}"))
            .build()
            .unwrap_or_else(|e| panic!("tensormem: cannot start the kernel threads: {e}"))
    })
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
    kernel_pool().in_place_scope(|s| {
        for p in 1..pieces {
            s.spawn(move |_| f(p));
        }
        f(0);
    });
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
    kernel_pool().install(op)
}
