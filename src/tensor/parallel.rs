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
//! pieces (which take no locks); the calling thread, which holds the locks, blocks without
//! stealing anything. A kernel called from inside a rayon job (a worker of any pool: the user's
//! own parallel region, as `at::parallel_for` does in PyTorch) runs on that thread alone.

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

/// Runs `op` (which splits itself with rayon) on the kernel pool. The caller must not be a rayon
/// worker (see [`threads_for`]), so it blocks without running other jobs while it holds its
/// locks.
pub(crate) fn install<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    debug_assert!(rayon::current_thread_index().is_none(), "install from a rayon worker would steal foreign jobs");
    kernel_pool().install(op)
}
