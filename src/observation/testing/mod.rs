//! Leak checks and memory budgets for tests: [`LeakCheck`], [`assert_no_leaks`] and
//! [`assert_peak_below`].
//!
//! A check sees every allocation made on its thread (and on threads that [enter](LeakScope::enter)
//! it) through *any* tensormem allocator: backends, decorators, allocators from the registry or
//! built directly, the ones behind tensor kernels. It attributes each to the check until the
//! block is freed, on whatever thread. Other threads' allocations are never attributed to it, so
//! checks in tests that `cargo test` runs in parallel do not see each other.
//!
//! ```
//! use tensormem::testing::LeakCheck;
//! use tensormem::{AllocatorExt, SystemAllocator};
//!
//! let cpu = SystemAllocator::new();
//! let check = LeakCheck::start();
//! let kept = {
//!     let _s = tensormem::scope("doc.leak");
//!     cpu.allocate::<u32>(10)?
//! };
//! let report = check.finish();
//! assert_eq!(report.leaks.len(), 1);
//! assert_eq!(report.leaks[0].requested_size, 40);
//! assert_eq!(report.leaks[0].tag.as_deref(), Some("doc.leak"));
//! assert!(report.to_string().contains("doc.leak"));
//! // SAFETY: `kept` came from `allocate::<u32>(10)` on `cpu`.
//! unsafe { cpu.deallocate(kept, 10) };
//! # Ok::<(), tensormem::AllocError>(())
//! ```
//!
//! With `TENSORMEM_BACKTRACE=1` set when a check starts, each leak carries the backtrace of its
//! allocation (captured only then: it costs tens of microseconds per allocation), with
//! tensormem's own frames trimmed from the top.
//!
//! A check sees memory, not objects: a tensor whose storage was never allocated holds none and
//! is no leak. `tensormem-tensor`'s `Tensor::empty`, `Tensor::zeros` and `*_like` constructors are lazy (their
//! storage is allocated when first written or read), so a deliberate leak test that forgets a
//! fresh `Tensor::zeros` passes. Use `Tensor::ones`, `full`, a kernel output, or write to the
//! tensor first:
//!
//! ```
//! use tensormem_tensor::{DType, Tensor};
//! use tensormem::testing::LeakCheck;
//!
//! let check = LeakCheck::start();
//! std::mem::forget(Tensor::zeros(&[1024], DType::F32)?); // never allocated: not a leak
//! assert!(check.finish().leaks.is_empty());
//! let check = LeakCheck::start();
//! std::mem::forget(Tensor::ones(&[1024], DType::F32)?); // written: a leak of 4 KiB
//! assert_eq!(check.finish().leaks[0].requested_size, 4096);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod report;

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

pub use report::{Leak, LeakReport};

use crate::allocators::ByteSize;
use crate::allocators::observe;
use crate::observation::hub::{CheckBytes, hub};

/// The environment variable that makes leak checks capture allocation backtraces (`1`).
pub const BACKTRACE_ENV: &str = "TENSORMEM_BACKTRACE";

static NEXT_CHECK: AtomicU64 = AtomicU64::new(1);

struct Shared {
    id: u64,
    open: AtomicBool,
    bytes: Arc<CheckBytes>,
}

/// An active leak check; see the [module docs](self).
///
/// Dropping a check that is still armed and found leaks panics with the report (unless the
/// thread is already panicking); [`finish`](Self::finish) returns the report instead,
/// [`disarm`](Self::disarm) forgets it. Checks nest: an allocation made inside an inner check
/// also counts against the outer ones.
#[must_use = "a leak check reports when finished or dropped"]
pub struct LeakCheck {
    shared: Arc<Shared>,
    armed: bool,
    /// Not `Send`: it ends on the thread it started on (other threads join with a [`LeakScope`]).
    _not_send: core::marker::PhantomData<*const ()>,
}

/// A handle on a [`LeakCheck`] that other threads use to join it (`Send + Clone`).
#[derive(Clone)]
pub struct LeakScope {
    shared: Arc<Shared>,
}

/// This thread reports to a check until the guard drops; made by [`LeakScope::enter`].
#[must_use = "the thread reports to the check until the guard is dropped"]
pub struct LeakScopeGuard {
    id: Option<u64>,
    /// Not `Send`: the guard must drop on the thread that entered.
    _not_send: core::marker::PhantomData<*const ()>,
}

impl LeakCheck {
    /// Starts a check on this thread.
    pub fn start() -> LeakCheck {
        // The check's own bookkeeping is not the program's allocations (see `observe::unobserved`).
        observe::unobserved(Self::start_unobserved)
    }

    fn start_unobserved() -> LeakCheck {
        let hub = hub();
        let wants = std::env::var(BACKTRACE_ENV).is_ok_and(|v| v == "1");
        hub.backtraces.store(wants, Relaxed);
        let id = NEXT_CHECK.fetch_add(1, Relaxed);
        let bytes = Arc::new(CheckBytes::default());
        hub.checks.insert(id, Arc::clone(&bytes));
        observe::push_check(id);
        LeakCheck {
            shared: Arc::new(Shared { id, open: AtomicBool::new(true), bytes }),
            armed: true,
            _not_send: core::marker::PhantomData,
        }
    }

    /// A handle for other threads to join this check.
    pub fn handle(&self) -> LeakScope {
        LeakScope { shared: self.shared.clone() }
    }

    /// Allocations attributed to the check and still live now, with the peak so far (the check
    /// goes on).
    pub fn live(&self) -> LeakReport {
        observe::unobserved(|| report::collect(self.shared.id, self.shared.bytes.peak()))
    }

    /// The most bytes (requested sizes) that allocations attributed to the check held at once so
    /// far, wherever they were freed.
    pub fn peak_bytes(&self) -> u64 {
        self.shared.bytes.peak()
    }

    /// Ends the check and reports what is still live.
    pub fn finish(mut self) -> LeakReport {
        self.close()
    }

    /// Ends the check and panics with the report if anything leaked.
    ///
    /// # Panics
    /// When the report is not empty.
    #[track_caller]
    pub fn assert_no_leaks(self) {
        let report = self.finish();
        if !report.is_empty() {
            panic!("{report}");
        }
    }

    /// Ends the check without looking at it.
    pub fn disarm(mut self) {
        self.close();
    }

    fn close(&mut self) -> LeakReport {
        self.armed = false;
        let id = self.shared.id;
        observe::remove_check(id);
        self.shared.open.store(false, Relaxed);
        observe::unobserved(|| {
            let hub = hub();
            hub.checks.remove(&id);
            let report = report::collect(id, self.shared.bytes.peak());
            hub.detach_check(id);
            report
        })
    }
}

impl Drop for LeakCheck {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let report = self.close();
        if !report.is_empty() && !std::thread::panicking() {
            panic!("leak check dropped with leaks:\n{report}");
        }
    }
}

impl LeakScope {
    /// Makes this thread report to the check until the guard drops. Entering a finished check
    /// does nothing.
    pub fn enter(&self) -> LeakScopeGuard {
        if !self.shared.open.load(Relaxed) {
            return LeakScopeGuard { id: None, _not_send: core::marker::PhantomData };
        }
        observe::push_check(self.shared.id);
        LeakScopeGuard { id: Some(self.shared.id), _not_send: core::marker::PhantomData }
    }

    /// Whether the check is still running.
    pub fn is_active(&self) -> bool {
        self.shared.open.load(Relaxed)
    }
}

impl Drop for LeakScopeGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            observe::remove_check(id);
        }
    }
}

/// Runs `f` under a [`LeakCheck`] and panics with the report if anything it allocated is still
/// live when it returns; returns what `f` returned.
///
/// # Panics
/// When `f` leaked.
///
/// ```should_panic
/// use tensormem::{AllocatorExt, SystemAllocator};
///
/// let cpu = SystemAllocator::new();
/// tensormem::testing::assert_no_leaks(|| { let _leaked = cpu.allocate::<u8>(64); });
/// ```
#[track_caller]
pub fn assert_no_leaks<R>(f: impl FnOnce() -> R) -> R {
    let check = LeakCheck::start();
    let out = f();
    check.assert_no_leaks();
    out
}

/// Runs `f` under a [`LeakCheck`] of its own and panics if the allocations it made (on this
/// thread, and on threads that [entered](LeakScope::enter) the check) held `bytes` or more at
/// once; returns what `f` returned. A memory budget for a test: like leak checks, it sees only
/// its own threads' allocations, so tests that `cargo test` runs in parallel do not disturb it.
/// Sizes are the requested ones. It checks the peak only: memory `f` leaves live is not an error
/// here (combine with [`assert_no_leaks`] for that).
///
/// # Panics
/// When the peak is not below `bytes`; the message gives the peak, the budget and what was still
/// live when `f` returned.
///
/// ```
/// use tensormem::{AllocatorExt, SystemAllocator};
/// use tensormem::testing::assert_peak_below;
///
/// let cpu = SystemAllocator::new();
/// let sum = assert_peak_below(8192, || {
///     let a = cpu.allocate::<u8>(4096).unwrap();
///     // SAFETY: `a` came from `allocate::<u8>(4096)` on `cpu`.
///     unsafe { cpu.deallocate(a, 4096) };
///     let b = cpu.allocate::<u8>(4096).unwrap();
///     // SAFETY: as above.
///     unsafe { cpu.deallocate(b, 4096) };
///     2 + 2
/// });
/// assert_eq!(sum, 4); // two 4 KiB blocks, one at a time: a peak of 4096 bytes
/// ```
///
/// ```should_panic
/// use tensormem::{AllocatorExt, SystemAllocator};
///
/// let cpu = SystemAllocator::new();
/// tensormem::testing::assert_peak_below(1 << 20, || {
///     let big = cpu.allocate::<u8>(2 << 20).unwrap();
///     // SAFETY: `big` came from `allocate::<u8>(2 << 20)` on `cpu`.
///     unsafe { cpu.deallocate(big, 2 << 20) };
/// });
/// ```
#[track_caller]
pub fn assert_peak_below<R>(bytes: u64, f: impl FnOnce() -> R) -> R {
    let check = LeakCheck::start();
    let out = f();
    let report = check.finish();
    if report.peak_bytes >= bytes {
        panic!(
            "memory budget exceeded: the allocations held {} ({} bytes) at their peak; the budget is to stay below {} ({bytes} bytes)\n{report}",
            ByteSize(report.peak_bytes),
            report.peak_bytes,
            ByteSize(bytes)
        );
    }
    out
}

impl fmt::Debug for LeakCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeakCheck").field("id", &self.shared.id).field("armed", &self.armed).finish()
    }
}

impl fmt::Debug for LeakScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeakScope").field("check", &self.shared.id).field("active", &self.is_active()).finish()
    }
}

impl fmt::Debug for LeakScopeGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeakScopeGuard").field("check", &self.id).finish()
    }
}
