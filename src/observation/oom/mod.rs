//! OOM reports: when an allocator refuses a request, what it held, what held it, and why the
//! request did not fit.
//!
//! Every refusal of a tensormem allocator (out of memory, or over its limit) builds an
//! [`OomReport`] once tensormem's observer is installed (by [`on_oom`], the
//! [`AllocatorRegistry`](crate::AllocatorRegistry), a scope, a leak check or history). The report
//! is delivered three ways:
//! - to every callback registered with [`on_oom`];
//! - as a `tracing` event (target `tensormem::oom`, level WARN) that carries the report's text;
//! - as files, when a dump directory is set ([`OOM_DUMP_ENV`] or [`set_dump_dir`]): `oom-<n>.json`
//!   and, while history is recording, `oom-<n>.history.json` and the timeline page
//!   `oom-<n>.html` beside it (a flight recorder), at most [`OOM_DUMP_MAX_ENV`] times per process.
//!
//! What a report holds depends on what is watching. With nothing watching, it holds what the
//! allocator knows: the request, in use, reserved, limit, the largest free block (so the
//! fragmentation), and, for a BFC, its largest live chunks from its own tables. Scopes add the
//! scope of every scoped allocation and the scopes holding the most bytes; a leak check or
//! history adds descriptions (`tensor f32 [1024, 1024]`) and, when recorded, backtraces.
//!
//! A report is made per refusal of a backend: a [`RetryAllocator`](crate::RetryAllocator) that
//! tries again after frees makes one per refused attempt. A caching allocator's call into its
//! source is not reported (the caching allocator may recover, and reports its own refusal if
//! not). The global Rust heap's refusals go to Rust's allocation error handler, not here.
//!
//! Building a report allocates only from the Rust heap, never from the allocator that refused
//! (a `SystemAllocator` refused by `malloc` itself shares the C heap with Rust's, so its report
//! needs what that heap has left), and happens only on the refusal path: a successful
//! allocation pays nothing for it. A refusal
//! inside an OOM callback (or while a report is built) is not reported again, and a callback that
//! panics is caught and logged; the allocator's caller gets its error either way.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use tensormem::{AllocatorExt, BfcAllocator};
//!
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&seen);
//! let id = tensormem::on_oom(move |report| sink.lock().unwrap().push(report.clone()));
//!
//! let bfc = BfcAllocator::builder().name("oom-doc").memory_limit(4 << 20).build()?;
//! let held = bfc.allocate::<u8>(3 << 20)?;
//! assert!(bfc.allocate::<u8>(2 << 20).is_err());
//!
//! let report = seen.lock().unwrap().iter().find(|r| r.allocator == "oom-doc").cloned().unwrap();
//! assert_eq!(report.requested_bytes, 2 << 20);
//! assert_eq!(report.largest_allocations[0].requested_bytes, 3 << 20);
//! assert!(report.to_string().contains("could not allocate 2.0 MiB"), "{report}");
//! tensormem::remove_oom_observer(id);
//! // SAFETY: `held` came from `allocate::<u8>(3 << 20)` on `bfc`.
//! unsafe { bfc.deallocate(held, 3 << 20) };
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod build;
mod dump;

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::RwLock;

use crate::allocators::ByteSize;
use crate::allocators::observe::{self, Refusal};
pub use dump::{OOM_DUMP_ENV, OOM_DUMP_MAX_ENV, set_dump_dir};

/// What an allocator refused and what held its memory at that moment.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct OomReport {
    /// Which report of this process it is, from 1.
    pub sequence: u64,
    /// When, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// The allocator that refused.
    pub allocator: String,
    /// Why: `out of memory` or `limit exceeded`.
    pub kind: String,
    /// The error as the caller got it.
    pub message: String,
    /// The bytes asked for.
    pub requested_bytes: u64,
    /// The alignment asked for.
    pub align: u64,
    /// The request as the allocator rounds it, when it rounds.
    pub rounded_bytes: Option<u64>,
    /// Bytes in use in the allocator, when it knows.
    pub in_use_bytes: Option<u64>,
    /// Bytes the allocator holds from its source (in use + cached), when it caches.
    pub reserved_bytes: Option<u64>,
    /// The allocator's limit, when it has one.
    pub limit_bytes: Option<u64>,
    /// The largest free block it holds, when it knows.
    pub largest_free_bytes: Option<u64>,
    /// How scattered its free memory is: 1 - largest free block / free bytes (0 when the free
    /// memory is one block), when it knows both.
    pub fragmentation: Option<f64>,
    /// For a device allocator: the driver's free and total bytes of the device.
    pub device_free_bytes: Option<u64>,
    /// See `device_free_bytes`.
    pub device_total_bytes: Option<u64>,
    /// The scope the refused request was made in.
    pub scope: Option<String>,
    /// The thread that made it.
    pub thread: Option<String>,
    /// The allocator's largest live allocations, largest first.
    pub largest_allocations: Vec<OomAllocation>,
    /// The scopes holding the most live bytes of this allocator, most first.
    pub top_scopes: Vec<OomScope>,
    /// Where the live allocations came from: `allocator` (the allocator's own tables),
    /// `observer` (scopes and leak checks), `history` (the recorded events), or empty when
    /// nothing knows them.
    pub sources: Vec<String>,
}

/// One live allocation in an [`OomReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct OomAllocation {
    /// Its address.
    pub address: u64,
    /// The bytes asked for.
    pub requested_bytes: u64,
    /// The bytes set aside for it.
    pub allocated_bytes: u64,
    /// The scope it was allocated in.
    pub scope: Option<String>,
    /// What it holds (e.g. `tensor f32 [1024, 1024]`).
    pub description: Option<String>,
    /// Where it was allocated, when backtraces are recorded (`TENSORMEM_BACKTRACE=1` under a
    /// leak check, or history with backtraces).
    pub backtrace: Option<String>,
}

/// One scope's live bytes in an allocator, in an [`OomReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct OomScope {
    /// The scope path.
    pub scope: String,
    /// Bytes of its live allocations (as set aside).
    pub bytes: u64,
    /// How many.
    pub allocations: u64,
}

impl OomReport {
    /// The report as pretty-printed JSON (the `oom-<n>.json` format).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "OOM report #{}: {}", self.sequence, self.message)?;
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |b| ByteSize(b).to_string());
        write!(
            f,
            "  in use {}, reserved {}, limit {}, largest free block {}",
            opt(self.in_use_bytes),
            opt(self.reserved_bytes),
            opt(self.limit_bytes),
            opt(self.largest_free_bytes)
        )?;
        if let Some(frag) = self.fragmentation {
            write!(f, ", fragmentation {:.1}%", frag * 100.0)?;
        }
        writeln!(f)?;
        if let (Some(free), Some(total)) = (self.device_free_bytes, self.device_total_bytes) {
            writeln!(f, "  device: {} free of {}", ByteSize(free), ByteSize(total))?;
        }
        if let Some(scope) = &self.scope {
            writeln!(f, "  requested in scope '{scope}'")?;
        }
        if !self.largest_allocations.is_empty() {
            writeln!(f, "  largest live allocations:")?;
            for a in &self.largest_allocations {
                write!(f, "    {:>10}  {:#x}", ByteSize(a.requested_bytes).to_string(), a.address)?;
                if let Some(s) = &a.scope {
                    write!(f, "  scope '{s}'")?;
                }
                if let Some(d) = &a.description {
                    write!(f, "  {d}")?;
                }
                writeln!(f)?;
            }
        }
        if !self.top_scopes.is_empty() {
            writeln!(f, "  scopes holding the most:")?;
            for s in &self.top_scopes {
                writeln!(f, "    {:>10}  {} ({} allocations)", ByteSize(s.bytes).to_string(), s.scope, s.allocations)?;
            }
        }
        Ok(())
    }
}

/// Identifies a callback registered with [`on_oom`], for [`remove_oom_observer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OomObserverId(u64);

type Callback = Arc<dyn Fn(&OomReport) + Send + Sync>;

static CALLBACKS: RwLock<Vec<(u64, Callback)>> = RwLock::new(Vec::new());
static NEXT_CALLBACK: AtomicU64 = AtomicU64::new(1);
static REPORTS: AtomicU64 = AtomicU64::new(0);

/// Calls `callback` with the report of every refusal of any tensormem allocator in the process,
/// on the thread that was refused, after the allocator's own locks are released (the callback
/// may allocate and free). Until it returns, that thread's refusals are not reported again and
/// its allocations are not observed (leak checks and history do not see them). A callback that
/// panics is caught and logged.
///
/// Callbacks stay until [`remove_oom_observer`]; they see every thread's refusals, so a test
/// that registers one picks out its own allocator's reports by name.
pub fn on_oom(callback: impl Fn(&OomReport) + Send + Sync + 'static) -> OomObserverId {
    crate::observation::hub::hub();
    let id = NEXT_CALLBACK.fetch_add(1, Relaxed);
    let callback: Callback = Arc::new(callback);
    observe::unobserved(|| CALLBACKS.write().push((id, callback)));
    OomObserverId(id)
}

/// Removes a callback registered with [`on_oom`]; `false` if it was removed already.
pub fn remove_oom_observer(id: OomObserverId) -> bool {
    observe::unobserved(|| remove(id))
}

fn remove(id: OomObserverId) -> bool {
    let mut callbacks = CALLBACKS.write();
    let before = callbacks.len();
    callbacks.retain(|(i, _)| *i != id.0);
    callbacks.len() != before
}

/// Sets how many of the largest live allocations and scopes a report lists (default
/// [`DEFAULT_REPORT_ENTRIES`](crate::allocators::observe::DEFAULT_REPORT_ENTRIES)).
pub fn set_report_entries(n: usize) {
    observe::set_report_entries(n);
}

/// How many reports this process has made.
pub fn reports_made() -> u64 {
    REPORTS.load(Relaxed)
}

/// Builds the report of `refusal` and delivers it (called by the hub).
pub(crate) fn report(hub: &crate::observation::hub::Hub, refusal: &Refusal<'_>) {
    let sequence = REPORTS.fetch_add(1, Relaxed) + 1;
    let report = build::build(hub, refusal, sequence);
    tracing::warn!(
        target: "tensormem::oom",
        allocator = %report.allocator,
        requested = report.requested_bytes,
        in_use = report.in_use_bytes,
        reserved = report.reserved_bytes,
        limit = report.limit_bytes,
        largest_free = report.largest_free_bytes,
        "{report}"
    );
    let callbacks: Vec<Callback> = CALLBACKS.read().iter().map(|(_, c)| Arc::clone(c)).collect();
    for callback in callbacks {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| callback(&report))) {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".to_owned());
            tracing::error!(target: "tensormem::oom", allocator = %report.allocator, "an OOM callback panicked: {why}");
        }
    }
    dump::write(&report);
}
