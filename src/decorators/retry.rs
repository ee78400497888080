//! [`RetryAllocator`]: when memory is short, wait for frees and try again (TensorFlow's
//! `AllocatorRetry`).

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::allocators::{AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats};

/// The longest wait: longer ones (`Duration::MAX`) are cut to this.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// TensorFlow's default: give up after waiting 10 seconds for memory.
pub const DEFAULT_MAX_RETRY_WAIT: Duration = Duration::from_secs(10);

/// Wraps an allocator so that an allocation failing for lack of memory (out of memory, or over
/// the limit) waits until some memory is freed through this allocator and tries again, for up to
/// a maximum wait (10 s by default). Requests with `retry_on_failure = false` fail at once.
///
/// A request that cannot succeed however much is freed (larger than the inner allocator's whole
/// limit, or a layout it cannot honour) fails at once. A free costs one extra load when nobody
/// waits.
///
/// Its stats are the inner allocator's (none when the inner allocator keeps none), with
/// `num_alloc_retries` increased by the attempts made after a first failure, and `num_ooms`
/// counting the requests through this allocator that finally failed for lack of memory or for
/// the limit: an allocation retried five times before failing is one OOM here, while the inner
/// allocator's own stats count each refused attempt.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tensormem::{AllocationAttributes, Allocator, BfcAllocator, RetryAllocator};
/// use core::alloc::Layout;
///
/// let bfc = Arc::new(BfcAllocator::builder().memory_limit(1 << 20).build()?);
/// let retry = Arc::new(RetryAllocator::new(bfc).with_max_wait(Duration::from_secs(5)));
/// let big = Layout::from_size_align(768 << 10, 8)?;
/// let held = retry.allocate_raw(big, &AllocationAttributes::default())?;
///
/// // Without retry: fails at once.
/// assert!(retry.allocate_raw(big, &AllocationAttributes::NO_RETRY).is_err());
///
/// // With retry: waits until another thread frees.
/// let freer = {
///     let (retry, held) = (Arc::clone(&retry), held.as_ptr() as usize);
///     std::thread::spawn(move || {
///         std::thread::sleep(Duration::from_millis(50));
///         // SAFETY: `held` was allocated with `big` and is freed once.
///         unsafe { retry.deallocate_raw(std::ptr::NonNull::new(held as *mut u8).unwrap(), big) };
///     })
/// };
/// let p = retry.allocate_raw(big, &AllocationAttributes::default())?;
/// freer.join().unwrap();
/// assert!(retry.stats().unwrap().num_alloc_retries >= 1);
/// // SAFETY: `p` was allocated with `big` and is freed once.
/// unsafe { retry.deallocate_raw(p, big) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RetryAllocator {
    inner: Arc<dyn Allocator>,
    max_wait: Duration,
    /// Counts frees seen while someone waits.
    frees: Mutex<u64>,
    freed: Condvar,
    waiters: AtomicUsize,
    retries: AtomicU64,
    ooms: AtomicU64,
}

impl RetryAllocator {
    /// Retries on `inner` for up to [`DEFAULT_MAX_RETRY_WAIT`].
    pub fn new(inner: Arc<dyn Allocator>) -> Self {
        Self {
            inner,
            max_wait: DEFAULT_MAX_RETRY_WAIT,
            frees: Mutex::new(0),
            freed: Condvar::new(),
            waiters: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            ooms: AtomicU64::new(0),
        }
    }

    /// Sets the longest time one allocation waits for memory before failing (`Duration::MAX`:
    /// as long as it takes; waits are cut to a century).
    #[must_use]
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The allocator it retries on.
    pub fn wrapped(&self) -> &Arc<dyn Allocator> {
        &self.inner
    }

    #[cold]
    #[inline(never)]
    fn wait_and_retry(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        // A wait too long to express (Duration::MAX) is cut to a century.
        let now = Instant::now();
        let deadline = now.checked_add(self.max_wait.min(CENTURY)).unwrap_or(now);
        tracing::debug!(allocator = self.inner.name(), size = layout.size(), max_wait = ?self.max_wait, "retry: waiting for memory");
        let mut frees = self.frees.lock();
        // Registered before the next attempt: any free from now on notifies us.
        self.waiters.fetch_add(1, SeqCst);
        let mut last;
        let result = loop {
            let seen = *frees;
            drop(frees);
            self.retries.fetch_add(1, Relaxed);
            match self.inner.allocate_raw(layout, attrs) {
                Ok(p) => break Ok(p),
                Err(e) => last = e,
            }
            frees = self.frees.lock();
            if Instant::now() >= deadline {
                drop(frees);
                break Err(last);
            }
            // Sleep only if nothing was freed since the attempt began; then try again.
            if *frees == seen {
                let _ = self.freed.wait_until(&mut frees, deadline);
            }
        };
        self.waiters.fetch_sub(1, SeqCst);
        result
    }
}

// SAFETY: allocation and free are forwarded to `inner`, which keeps the contract; this type only
// waits and repeats requests.
unsafe impl Allocator for RetryAllocator {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn memory_space(&self) -> crate::allocators::MemorySpace {
        self.inner.memory_space()
    }

    #[inline]
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        match self.inner.allocate_raw(layout, attrs) {
            Ok(p) => Ok(p),
            Err(e) => {
                let short = matches!(e.kind(), AllocErrorKind::OutOfMemory | AllocErrorKind::LimitExceeded);
                // Larger than the whole limit: no free can ever make room.
                let hopeless = e.limit().is_some_and(|limit| e.rounded_size().unwrap_or(layout.size() as u64) > limit);
                let result = if short && !hopeless && attrs.retry_on_failure && !self.max_wait.is_zero() {
                    self.wait_and_retry(layout, attrs)
                } else {
                    Err(e)
                };
                if let Err(e) = &result
                    && matches!(e.kind(), AllocErrorKind::OutOfMemory | AllocErrorKind::LimitExceeded)
                {
                    self.ooms.fetch_add(1, Relaxed);
                    tracing::warn!(allocator = self.inner.name(), retries = self.retries.load(Relaxed), "{e}");
                }
                result
            }
        }
    }

    #[inline]
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: blocks of this allocator are blocks of `inner`; the caller's promise carries over.
        unsafe { self.inner.deallocate_raw(ptr, layout) };
        if self.waiters.load(SeqCst) > 0 {
            *self.frees.lock() += 1;
            self.freed.notify_all();
        }
    }

    crate::decorators::wrapper::forward_size_queries!(inner);

    fn stats(&self) -> Option<AllocatorStats> {
        let mut s = self.inner.stats()?;
        s.num_alloc_retries += self.retries.load(Relaxed);
        s.num_ooms = self.ooms.load(Relaxed);
        Some(s)
    }

    fn clear_stats(&self) -> bool {
        self.inner.clear_stats()
    }
}

impl fmt::Debug for RetryAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryAllocator")
            .field("inner", &self.inner)
            .field("max_wait", &self.max_wait)
            .field("waiters", &self.waiters.load(Relaxed))
            .finish()
    }
}
