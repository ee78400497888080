//! Allocation traces: [`TraceRecorder`] records every allocation and free of an allocator into an
//! [`AllocationTrace`]; [`replay`] runs a trace against any allocator and reports peak memory,
//! fragmentation at the peak, failures and time per operation.
//!
//! # File format
//! JSON, compact enough to ship realistic traces:
//!
//! ```json
//! {"version":1,"description":"...","events":[[0,1,4096,64],[12,2,256,16],[30,1]]}
//! ```
//!
//! Each event is an array: `[t_us, id, size, align]` allocates `size` bytes aligned to `align`
//! under a new `id`; `[t_us, id]` frees the allocation `id`. `t_us` is microseconds since the
//! start of the trace and never decreases. Ids are unique; an id is freed at most once, after
//! its allocation. [`AllocationTrace::from_json`] checks all of this.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::allocators::{AllocError, AllocationAttributes, Allocator, AllocatorStats, ByteSize};

/// The format version written and read.
pub const TRACE_VERSION: u32 = 1;

/// One event of a trace. Read from JSON as an array of two or four unsigned integers, so that a
/// wrong event is refused with what it must look like; shown (`Display`) as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
#[serde(try_from = "Vec<u64>")]
pub enum TraceEvent {
    /// `[t_us, id, size, align]`.
    Alloc(u64, u64, usize, usize),
    /// `[t_us, id]`.
    Free(u64, u64),
}

impl TryFrom<Vec<u64>> for TraceEvent {
    type Error = String;

    fn try_from(v: Vec<u64>) -> Result<Self, String> {
        let size = |x: u64, what: &str| usize::try_from(x).map_err(|_| format!("the {what} {x} does not fit a usize"));
        match v[..] {
            [t, id] => Ok(Self::Free(t, id)),
            [t, id, bytes, align] => Ok(Self::Alloc(t, id, size(bytes, "size")?, size(align, "alignment")?)),
            _ => Err(format!(
                "an event is [t_us, id, size, align] (an allocation) or [t_us, id] (a free), not {} numbers",
                v.len()
            )),
        }
    }
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Alloc(t, id, size, align) => write!(f, "[{t},{id},{size},{align}]"),
            Self::Free(t, id) => write!(f, "[{t},{id}]"),
        }
    }
}

impl TraceEvent {
    /// Microseconds since the start of the trace.
    pub fn time_us(&self) -> u64 {
        match *self {
            Self::Alloc(t, ..) | Self::Free(t, _) => t,
        }
    }
}

/// A recorded sequence of allocations and frees (see the module docs for the format).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AllocationTrace {
    /// [`TRACE_VERSION`].
    pub version: u32,
    /// What was recorded.
    pub description: String,
    /// The events, in order.
    pub events: Vec<TraceEvent>,
}

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Not JSON of the trace's shape (including a file cut short).
    #[error("{problem}: {0}", problem = json_problem(.0))]
    Json(#[from] serde_json::Error),
    /// A version this code does not read.
    #[error("trace version {found} is not supported (this reads version {TRACE_VERSION})")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// An event breaks the format's rules.
    #[error("event {index} {event} is invalid: {reason}")]
    Event {
        /// Its position, from 0.
        index: usize,
        /// The event.
        event: TraceEvent,
        /// Which rule it breaks, with the values that break it.
        reason: String,
    },
}

/// What kind of problem a JSON error is, in words.
fn json_problem(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Eof => "the trace ends early (a file cut short?)",
        serde_json::error::Category::Syntax => "the trace is not valid JSON",
        _ => {
            "not a tensormem allocation trace ({\"version\":1,\"description\":..,\"events\":[[t_us, id, size, align] or [t_us, id], ..]})"
        }
    }
}

impl AllocationTrace {
    /// Reads and checks a trace.
    ///
    /// # Errors
    /// [`TraceError::Json`] for malformed or truncated JSON, [`TraceError::Version`], or
    /// [`TraceError::Event`] naming the first event that breaks a rule.
    pub fn from_json(json: &str) -> Result<Self, TraceError> {
        let trace: Self = serde_json::from_str(json)?;
        trace.validate()?;
        Ok(trace)
    }

    /// The trace as compact JSON.
    pub fn to_json(&self) -> String {
        // A trace holds integers and a string: serde_json writes them into memory without fail
        // (it only fails on maps with non-string keys and on a Serialize impl that fails), so this
        // cannot panic.
        serde_json::to_string(self).expect("an allocation trace always serialises")
    }

    /// Checks the format's rules.
    ///
    /// # Errors
    /// As [`from_json`](Self::from_json).
    pub fn validate(&self) -> Result<(), TraceError> {
        if self.version != TRACE_VERSION {
            return Err(TraceError::Version { found: self.version });
        }
        let mut live: HashMap<u64, bool> = HashMap::new();
        let mut last_t = 0;
        for (index, &event) in self.events.iter().enumerate() {
            let bad = |reason: String| Err(TraceError::Event { index, event, reason });
            if event.time_us() < last_t {
                return bad(format!("its time {} us is earlier than the event before ({last_t} us)", event.time_us()));
            }
            last_t = event.time_us();
            match event {
                TraceEvent::Alloc(_, id, size, align) => {
                    if !align.is_power_of_two() {
                        return bad(format!("the alignment {align} is not a power of two"));
                    }
                    if Layout::from_size_align(size, align).is_err() {
                        return bad(format!(
                            "the size {size} rounded up to the alignment {align} passes isize::MAX ({})",
                            isize::MAX
                        ));
                    }
                    if live.insert(id, true).is_some() {
                        return bad(format!("the id {id} was allocated before"));
                    }
                }
                TraceEvent::Free(_, id) => match live.get_mut(&id) {
                    Some(alive @ true) => *alive = false,
                    Some(false) => return bad(format!("the id {id} was freed before")),
                    None => return bad(format!("the id {id} was never allocated")),
                },
            }
        }
        Ok(())
    }

    /// Number of allocations.
    pub fn allocations(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, TraceEvent::Alloc(..))).count()
    }
}

/// Wraps an allocator and records every allocation and free made through it.
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{AllocatorExt, SystemAllocator, TraceRecorder, TraceEvent};
///
/// let rec = TraceRecorder::new(Arc::new(SystemAllocator::new()), "example");
/// let p = rec.allocate::<u32>(16)?;
/// // SAFETY: `p` came from `allocate::<u32>(16)` on `rec`.
/// unsafe { rec.deallocate(p, 16) };
/// let trace = rec.trace();
/// assert!(matches!(trace.events[..], [TraceEvent::Alloc(_, 1, 64, 4), TraceEvent::Free(_, 1)]));
/// # Ok::<(), tensormem::AllocError>(())
/// ```
pub struct TraceRecorder {
    inner: Arc<dyn Allocator>,
    start: Instant,
    description: String,
    next_id: AtomicU64,
    state: Mutex<Recording>,
}

#[derive(Default)]
struct Recording {
    events: Vec<TraceEvent>,
    live: HashMap<usize, u64>,
}

impl TraceRecorder {
    /// Records allocations on `inner`; `description` goes into the trace.
    pub fn new(inner: Arc<dyn Allocator>, description: impl Into<String>) -> Self {
        Self {
            inner,
            start: Instant::now(),
            description: description.into(),
            next_id: AtomicU64::new(1),
            state: Mutex::new(Recording::default()),
        }
    }

    /// The trace so far.
    pub fn trace(&self) -> AllocationTrace {
        AllocationTrace {
            version: TRACE_VERSION,
            description: self.description.clone(),
            events: self.state.lock().events.clone(),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

// SAFETY: allocation and free are forwarded to `inner`, which keeps the contract; this type only
// records them.
unsafe impl Allocator for TraceRecorder {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn memory_space(&self) -> crate::allocators::MemorySpace {
        self.inner.memory_space()
    }

    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        let p = self.inner.allocate_raw(layout, attrs)?;
        if layout.size() > 0 {
            let id = self.next_id.fetch_add(1, Relaxed);
            let mut s = self.state.lock();
            let t = self.now_us();
            s.events.push(TraceEvent::Alloc(t, id, layout.size(), layout.align()));
            s.live.insert(p.as_ptr() as usize, id);
        }
        Ok(p)
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() > 0 {
            let mut s = self.state.lock();
            if let Some(id) = s.live.remove(&(ptr.as_ptr() as usize)) {
                let t = self.now_us();
                s.events.push(TraceEvent::Free(t, id));
            }
        }
        // SAFETY: blocks of this allocator are blocks of `inner`; the caller's promise carries over.
        unsafe { self.inner.deallocate_raw(ptr, layout) }
    }

    crate::decorators::wrapper::forward_size_queries!(inner);

    fn stats(&self) -> Option<AllocatorStats> {
        self.inner.stats()
    }

    fn clear_stats(&self) -> bool {
        self.inner.clear_stats()
    }
}

impl fmt::Debug for TraceRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceRecorder")
            .field("inner", &self.inner)
            .field("events", &self.state.lock().events.len())
            .finish()
    }
}

/// What a [`replay`] found.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Allocations plus frees replayed.
    pub operations: usize,
    /// Allocations the allocator refused (their frees are skipped).
    pub failed_allocations: usize,
    /// The most bytes in use at once, as the allocator counts them (its rounding included).
    pub peak_in_use: u64,
    /// The most bytes the allocator held from its backing memory (0 if it does not say).
    pub peak_reserved: u64,
    /// The allocator's fragmentation when in-use bytes peaked, if it reports one.
    pub fragmentation_at_peak: Option<f64>,
    /// The requested bytes live at the peak (what a perfect allocator would need).
    pub peak_requested: u64,
    /// Wall time of the timed pass.
    pub elapsed: Duration,
    /// `elapsed / operations`, in nanoseconds.
    pub ns_per_operation: f64,
    /// Minor page faults of the process during the timed pass (fresh pages touched), on Unix.
    pub minor_page_faults: Option<u64>,
}

impl ReplayReport {
    /// Peak reserved / peak requested: the memory taken from the system (or device) over what a
    /// perfect allocator would need. `None` when the allocator reports no reserved bytes or
    /// nothing was requested.
    pub fn reserved_over_requested(&self) -> Option<f64> {
        (self.peak_reserved > 0 && self.peak_requested > 0)
            .then(|| self.peak_reserved as f64 / self.peak_requested as f64)
    }

    /// Peak in use / peak requested: the allocator's rounding and unsplit chunks (internal
    /// waste). `None` when nothing was requested.
    pub fn in_use_over_requested(&self) -> Option<f64> {
        (self.peak_requested > 0).then(|| self.peak_in_use as f64 / self.peak_requested as f64)
    }

    /// The header of the table [`table_row`](Self::table_row) fills (the replay example's and
    /// the `tensormem replay` command's).
    pub fn table_header() -> String {
        format!(
            "{:<18} {:>11} {:>11} {:>11} {:>7} {:>9} {:>6} {:>8} {:>8}",
            "allocator", "requested", "peak in use", "peak resvd", "use/req", "resvd/req", "failed", "ns/op", "faults"
        )
    }

    /// What the columns of [`table_header`](Self::table_header) mean, to print under the rows.
    pub fn table_legend() -> &'static str {
        "requested: the most bytes the trace asked for at once; peak in use: the most the allocator handed out \
         (requests rounded up); peak resvd: the most it held from its source; use/req and resvd/req: those peaks \
         over requested (1.000 is no overhead); failed: allocations refused; ns/op: time per allocation or free; \
         faults: minor page faults during the replay; '-': not known for that allocator"
    }

    /// One line of the report under [`table_header`](Self::table_header), for `allocator`.
    ///
    /// ```
    /// use tensormem::{AllocationTrace, SystemAllocator, ReplayReport, replay};
    /// let t = AllocationTrace::from_json(r#"{"version":1,"description":"d","events":[[0,1,4096,8],[1,1]]}"#)?;
    /// let row = replay(&t, &SystemAllocator::new()).table_row("system");
    /// assert!(row.starts_with("system") && row.contains("4.0 KiB"));
    /// assert_eq!(row.len(), ReplayReport::table_header().len(), "columns line up");
    /// # Ok::<(), tensormem::TraceError>(())
    /// ```
    pub fn table_row(&self, allocator: &str) -> String {
        let ratio = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.3}"));
        // An allocator that reports no reserved bytes does not know them: '-', as in the ratio.
        let reserved = if self.peak_reserved > 0 { ByteSize(self.peak_reserved).to_string() } else { "-".to_owned() };
        format!(
            "{allocator:<18} {:>11} {:>11} {:>11} {:>7} {:>9} {:>6} {:>8.1} {:>8}",
            ByteSize(self.peak_requested).to_string(),
            ByteSize(self.peak_in_use).to_string(),
            reserved,
            ratio(self.in_use_over_requested()),
            ratio(self.reserved_over_requested()),
            self.failed_allocations,
            self.ns_per_operation,
            self.minor_page_faults.map_or("-".into(), |f| f.to_string())
        )
    }
}

/// Minor page faults of this process so far.
fn minor_faults() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut usage = core::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `getrusage` writes a `rusage` into the valid, writable buffer it is given.
        let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0;
        // SAFETY: the call succeeded, so the struct is initialised (it was zeroed anyway).
        ok.then(|| unsafe { usage.assume_init() }.ru_minflt as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// A trace turned into operations on dense slots, so that replaying it costs no lookups.
#[derive(Clone, Debug)]
pub struct PreparedTrace {
    ops: Vec<Op>,
    slots: usize,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { slot: usize, layout: Layout },
    Free { slot: usize },
}

impl PreparedTrace {
    /// Prepares a trace. A trace that was not validated is fine: events that break the format's
    /// rules are skipped (an allocation of an id that is live, a free of an id that is not, a
    /// layout that cannot exist), so replaying never frees a block twice or leaks one.
    pub fn new(trace: &AllocationTrace) -> Self {
        let mut live: HashMap<u64, usize> = HashMap::new();
        let mut ops = Vec::with_capacity(trace.events.len());
        let mut slots = 0;
        for &event in &trace.events {
            match event {
                TraceEvent::Alloc(_, id, size, align) => {
                    let Ok(layout) = Layout::from_size_align(size, align) else { continue };
                    if live.contains_key(&id) {
                        continue;
                    }
                    live.insert(id, slots);
                    ops.push(Op::Alloc { slot: slots, layout });
                    slots += 1;
                }
                TraceEvent::Free(_, id) => {
                    if let Some(slot) = live.remove(&id) {
                        ops.push(Op::Free { slot });
                    }
                }
            }
        }
        Self { ops, slots }
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when there is nothing to replay.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Replays once and returns the wall time of the replay loop (blocks the trace leaves live are
    /// freed afterwards, outside the timing).
    pub fn run_timed(&self, allocator: &dyn Allocator) -> Duration {
        self.timed(allocator, Touch::FirstByte)
    }

    /// As [`run_timed`](Self::run_timed), but writing one byte in every 4 KiB page of every
    /// block (host memory), as a workload that uses its memory does: the time then includes the
    /// page faults an allocator causes (memory given back and faulted in again) or saves
    /// (memory kept, or moved to where it is needed), which a first-byte replay does not see.
    pub fn run_timed_writing_pages(&self, allocator: &dyn Allocator) -> Duration {
        self.timed(allocator, Touch::EveryPage)
    }

    fn timed(&self, allocator: &dyn Allocator, touch: Touch) -> Duration {
        let mut live = vec![None; self.slots];
        let start = Instant::now();
        self.run(allocator, &mut live, touch, |_, _| {}, |_| {});
        let elapsed = start.elapsed();
        free_rest(allocator, &mut live, |_| {});
        elapsed
    }

    /// Runs the operations, writing each granted block as `touch` says; `after_alloc(layout,
    /// granted)` after each allocation, `on_free(size)` after each free of a granted block.
    fn run(
        &self,
        allocator: &dyn Allocator,
        live: &mut [Option<(NonNull<u8>, Layout)>],
        touch: Touch,
        mut after_alloc: impl FnMut(Layout, bool),
        mut on_free: impl FnMut(usize),
    ) {
        // Device memory must not be touched from the host: replay skips the first-byte write.
        let host = allocator.memory_space().is_host_accessible();
        for &op in &self.ops {
            match op {
                Op::Alloc { slot, layout } => match allocator.allocate_raw(layout, &AllocationAttributes::NO_RETRY) {
                    Ok(p) => {
                        if host && layout.size() > 0 {
                            let step = match touch {
                                Touch::FirstByte => layout.size(),
                                Touch::EveryPage => PAGE,
                            };
                            for at in (0..layout.size()).step_by(step) {
                                // SAFETY: `p` is valid for host writes of `layout.size()` bytes (a
                                // host memory space, checked above) and `at` is below that.
                                unsafe { p.as_ptr().add(at).write(1) };
                            }
                        }
                        live[slot] = Some((p, layout));
                        after_alloc(layout, true);
                    }
                    Err(_) => after_alloc(layout, false),
                },
                Op::Free { slot } => {
                    if let Some((p, layout)) = live[slot].take() {
                        // SAFETY: `p` was allocated above with `layout` and is freed once.
                        unsafe { allocator.deallocate_raw(p, layout) };
                        on_free(layout.size());
                    }
                }
            }
        }
    }
}

/// How a replay writes the blocks it is granted.
#[derive(Clone, Copy, Debug)]
enum Touch {
    /// One byte per block: the allocator's own time, with the pages it lands on touched once.
    FirstByte,
    /// One byte per 4 KiB page: what a workload that uses its memory pays in page faults too.
    EveryPage,
}

/// The page size the page-writing replay assumes.
const PAGE: usize = 4096;

fn free_rest(allocator: &dyn Allocator, live: &mut [Option<(NonNull<u8>, Layout)>], mut on_free: impl FnMut(usize)) {
    for (p, layout) in live.iter_mut().filter_map(Option::take) {
        // SAFETY: each block was allocated with `layout` and is freed once.
        unsafe { allocator.deallocate_raw(p, layout) };
        on_free(layout.size());
    }
}

/// Replays `trace` on `allocator` three times: a measured pass (reading the stats after every
/// allocation, for the peaks and the fragmentation at the peak), a warm-up pass, then a timed
/// pass with nothing else in the loop, counting the page faults it causes (what an allocator
/// that keeps its memory saves: a caching allocator's blocks land on pages the warm-up touched,
/// while one that gives memory back faults again). Every block is written once (its first
/// byte) so the memory is really used. Everything allocated is freed by the end. The
/// allocator's stats are cleared first. Use [`ReplayReport::reserved_over_requested`] and
/// [`ReplayReport::in_use_over_requested`] to compare allocators.
pub fn replay(trace: &AllocationTrace, allocator: &dyn Allocator) -> ReplayReport {
    let prepared = PreparedTrace::new(trace);
    allocator.clear_stats();
    let mut report = ReplayReport {
        operations: prepared.len(),
        failed_allocations: 0,
        peak_in_use: 0,
        peak_reserved: 0,
        fragmentation_at_peak: None,
        peak_requested: 0,
        elapsed: Duration::ZERO,
        ns_per_operation: 0.0,
        minor_page_faults: None,
    };
    let requested = core::cell::Cell::new(0u64);
    let mut live = vec![None; prepared.slots];
    prepared.run(
        allocator,
        &mut live,
        Touch::FirstByte,
        |layout, granted| {
            if !granted {
                report.failed_allocations += 1;
                return;
            }
            requested.set(requested.get() + layout.size() as u64);
            report.peak_requested = report.peak_requested.max(requested.get());
            let s = allocator.stats().unwrap_or_default();
            if s.bytes_in_use > report.peak_in_use {
                report.peak_in_use = s.bytes_in_use;
                report.fragmentation_at_peak = s.fragmentation;
            }
            report.peak_reserved = report.peak_reserved.max(s.bytes_reserved);
        },
        |size| requested.set(requested.get() - size as u64),
    );
    free_rest(allocator, &mut live, |_| {});
    // A warm-up pass from the same state as the timed one, so that a caching allocator's blocks
    // land where they will land when timed, on pages that were already touched.
    prepared.run_timed(allocator);
    let faults_before = minor_faults();
    report.elapsed = prepared.run_timed(allocator);
    report.minor_page_faults = faults_before.zip(minor_faults()).map(|(a, b)| b.saturating_sub(a));
    report.ns_per_operation = report.elapsed.as_nanos() as f64 / report.operations.max(1) as f64;
    report
}
