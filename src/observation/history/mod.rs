//! Allocation history: a bounded ring buffer of every allocator event in the process, as
//! PyTorch's `torch.cuda.memory._record_memory_history`, for the
//! [timeline page](crate::timeline) and for offline analysis.
//!
//! ```
//! use tensormem::history::{self, HistoryOptions};
//! use tensormem::{AllocatorExt, SystemAllocator};
//! use tensormem::allocators::observe::Action;
//!
//! let cpu = SystemAllocator::builder().name("doc-history").build()?;
//! history::start(HistoryOptions { capacity: 10_000, backtraces: false })?;
//! let p = cpu.allocate::<u8>(4096)?;
//! // SAFETY: `p` came from `allocate::<u8>(4096)` on `cpu`.
//! unsafe { cpu.deallocate(p, 4096) };
//! history::stop();
//! let h = history::recorded();
//! let mine: Vec<_> = h.events.iter().filter(|e| &*e.allocator == "doc-history").collect();
//! assert_eq!(mine.len(), 2);
//! assert_eq!((mine[0].action, mine[0].size), (Action::Alloc, 4096));
//! assert_eq!(mine[1].action, Action::Free);
//! let again = history::History::from_json(&h.to_json())?;
//! assert_eq!(again.events.len(), h.events.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is recorded
//! Every event of every tensormem allocator, on every thread, while recording is on:
//! `alloc` and `free` of the blocks handed out, `oom` for requests that failed, and
//! `segment_alloc` / `segment_free` for the memory a caching allocator (BFC, pool) takes from and
//! gives back to its source. Decorators report nothing of their own (the backend under them
//! reports once). With recording off, the hooks cost one relaxed load per event.
//!
//! When the buffer is full the oldest events are dropped (and counted in
//! [`History::dropped`]), so memory stays bounded however long a program runs.
//!
//! # File format (`History::to_json`, version 1)
//! ```json
//! {
//!   "version": 1,
//!   "start_unix_ms": 1763880000000,
//!   "capacity": 100000,
//!   "dropped": 0,
//!   "events": [
//!     {"time_ns": 1200, "action": "segment_alloc", "address": 140245, "size": 2097152, "allocator": "bfc"},
//!     {"time_ns": 1350, "action": "alloc", "address": 140245, "size": 4096, "allocator": "bfc",
//!      "tag": "encoder/attn", "description": "tensor f32 [32, 32]", "backtrace": "..."}
//!   ]
//! }
//! ```
//! `time_ns` counts from [`start`]; `action` is one of `alloc`, `free`, `oom`, `segment_alloc`,
//! `segment_free`; `size` is the requested size for `alloc`/`oom` (the segment's size for
//! segments, the block's requested size for `free`); `address` is 0 for `oom`. `tag`,
//! `description` (the tensor a block was made for) and `backtrace` appear only when known.

use core::fmt;
use std::backtrace::Backtrace;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::allocators::observe::{self, Action, Event, Tag};

mod live;
pub(crate) mod pprof;

pub use live::{LiveAllocation, LiveGroup, LiveSet};
pub use pprof::PPROF_SAMPLE_TYPES;

/// The current history file version.
pub const HISTORY_VERSION: u32 = 1;

/// How to record (see [`start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryOptions {
    /// The most events kept; older ones are dropped. Must be at least 1.
    pub capacity: usize,
    /// Capture a backtrace for every allocation, OOM and segment allocation (costly: tens of
    /// microseconds each).
    pub backtraces: bool,
}

impl Default for HistoryOptions {
    /// 100 000 events, no backtraces.
    fn default() -> Self {
        HistoryOptions { capacity: 100_000, backtraces: false }
    }
}

/// One event of a [`History`]; see the [module docs](self) for the meaning of each field.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HistoryEvent {
    /// Nanoseconds since recording started.
    pub time_ns: u64,
    /// What happened.
    pub action: Action,
    /// The block's or segment's address (0 for an OOM).
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// The allocator that served it.
    pub allocator: Arc<str>,
    /// The innermost scope of the allocating thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// What the block holds (e.g. `tensor f32 [32, 32]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Where it was allocated, when recorded with backtraces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<String>,
}

/// A recorded history: [`recorded`] or [`History::from_json`]. [`History::peak`] and
/// [`History::live_at`] tell what was live at a point of it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct History {
    /// The file format version ([`HISTORY_VERSION`]).
    pub version: u32,
    /// When recording started, in milliseconds since the Unix epoch.
    pub start_unix_ms: u64,
    /// The ring buffer's capacity.
    pub capacity: usize,
    /// Events dropped because the buffer was full (the oldest go first).
    pub dropped: u64,
    /// The events, oldest first.
    pub events: Vec<HistoryEvent>,
}

/// Why a history could not be recorded, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// `HistoryOptions::capacity` was 0.
    #[error("history capacity must be at least 1 event (got 0)")]
    ZeroCapacity,
    /// The text is not a history file.
    #[error("not a tensormem history file: {message}")]
    Malformed {
        /// What the JSON parser said.
        message: String,
        /// Where (1-based).
        line: usize,
        /// Where (1-based).
        column: usize,
    },
    /// The file is a history of another version.
    #[error("history file version {found} is not supported (this build reads version {HISTORY_VERSION})")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// An event that cannot exist: a size past [`MAX_BYTES`](crate::telemetry::MAX_BYTES),
    /// live bytes that add up past it, or a time before the event ahead of it.
    #[error("event {index}: {reason}")]
    Event {
        /// Its position, from 0.
        index: usize,
        /// What is wrong, with the values.
        reason: String,
    },
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl History {
    /// The history as JSON (see the [module docs](self) for the format).
    pub fn to_json(&self) -> String {
        // A history holds integers, strings and a unit enum: serde_json writes them into memory
        // without fail (it only fails on maps with non-string keys and on a Serialize impl that
        // fails), so this cannot panic.
        serde_json::to_string(self).expect("a history always serialises")
    }

    /// Reads a history from JSON.
    ///
    /// # Errors
    /// [`HistoryError::Malformed`] for text that is not a history (truncated, not JSON, fields
    /// missing or of the wrong type, an unknown action), [`HistoryError::Version`] for another
    /// version, [`HistoryError::Event`] for an event that cannot exist ([`validate`](Self::validate)).
    pub fn from_json(text: &str) -> Result<History, HistoryError> {
        #[derive(serde::Deserialize)]
        struct Version {
            version: u32,
        }
        let malformed = |e: serde_json::Error| HistoryError::Malformed {
            message: e.to_string(),
            line: e.line(),
            column: e.column(),
        };
        if let Ok(v) = serde_json::from_str::<Version>(text)
            && v.version != HISTORY_VERSION
        {
            return Err(HistoryError::Version { found: v.version });
        }
        let history: History = serde_json::from_str(text).map_err(malformed)?;
        history.validate()?;
        Ok(history)
    }

    /// Checks that the history can have happened: event times never go back, every size is at
    /// most [`MAX_BYTES`](crate::telemetry::MAX_BYTES), and so are the live bytes and the
    /// reserved bytes added up at every event. (A free of an address not allocated in the history
    /// is allowed: recording may start, or the ring buffer may drop events, while it is live.)
    ///
    /// # Errors
    /// [`HistoryError::Event`] naming the first event that breaks a rule.
    pub fn validate(&self) -> Result<(), HistoryError> {
        let max = u128::from(crate::telemetry::MAX_BYTES);
        let mut live: HashMap<(&str, u64), Vec<u64>> = HashMap::new();
        let (mut in_use, mut reserved) = (0u128, 0u128);
        let mut last_t = 0;
        for (index, e) in self.events.iter().enumerate() {
            let bad = |reason: String| Err(HistoryError::Event { index, reason });
            if e.time_ns < last_t {
                return bad(format!("its time {} ns is before the event ahead of it ({last_t} ns)", e.time_ns));
            }
            last_t = e.time_ns;
            if u128::from(e.size) > max {
                return bad(format!("a size of {} bytes is more than any process can hold ({max})", e.size));
            }
            match e.action {
                Action::Alloc => {
                    in_use += u128::from(e.size);
                    live.entry((&e.allocator, e.address)).or_default().push(e.size);
                }
                Action::Free => {
                    if let Some(size) = live.get_mut(&(&*e.allocator, e.address)).and_then(Vec::pop) {
                        in_use -= u128::from(size);
                    }
                }
                Action::SegmentAlloc => reserved += u128::from(e.size),
                Action::SegmentFree => reserved = reserved.saturating_sub(u128::from(e.size)),
                Action::Oom => {}
            }
            if in_use > max || reserved > max {
                let (what, v) = if in_use > max { ("live", in_use) } else { ("reserved", reserved) };
                return bad(format!("{what} bytes add up to {v}, more than any process can hold ({max})"));
            }
        }
        Ok(())
    }

    /// Reads a history file.
    ///
    /// # Errors
    /// [`HistoryError::Io`] when the file cannot be read; otherwise as [`from_json`](Self::from_json).
    pub fn load(path: impl AsRef<Path>) -> Result<History, HistoryError> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| HistoryError::Io { path: path.to_path_buf(), source })?;
        History::from_json(&text)
    }

    /// Writes the history to a file as JSON.
    ///
    /// # Errors
    /// [`HistoryError::Io`] when the file cannot be written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), HistoryError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()).map_err(|source| HistoryError::Io { path: path.to_path_buf(), source })
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |a: Action| self.events.iter().filter(|e| e.action == a).count();
        write!(
            f,
            "{} events ({} alloc, {} free, {} oom, {} segment_alloc, {} segment_free), {} dropped",
            self.events.len(),
            count(Action::Alloc),
            count(Action::Free),
            count(Action::Oom),
            count(Action::SegmentAlloc),
            count(Action::SegmentFree),
            self.dropped
        )
    }
}

/// One event as kept in the ring buffer (names and tags as numbers).
#[derive(Clone)]
struct Raw {
    time_ns: u64,
    action: Action,
    address: usize,
    size: usize,
    /// The allocator's name, interned.
    allocator: Tag,
    tag: u32,
    description: Option<Box<str>>,
    backtrace: Option<Arc<Backtrace>>,
}

struct Recorder {
    started: Instant,
    start_unix_ms: u64,
    options: HistoryOptions,
    events: VecDeque<Raw>,
    dropped: u64,
}

/// The recorder; kept after [`stop`] so that [`snapshot`] still sees what was recorded.
static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

/// Starts recording every allocator event of the process into a ring buffer of
/// `options.capacity` events, discarding what an earlier recording kept.
///
/// # Errors
/// [`HistoryError::ZeroCapacity`] for a capacity of 0 (nothing is changed).
pub fn start(options: HistoryOptions) -> Result<(), HistoryError> {
    if options.capacity == 0 {
        return Err(HistoryError::ZeroCapacity);
    }
    // The recorder's own allocations are not the program's, and the old recorder is dropped
    // under the lock that recording takes (see `observe::unobserved`).
    observe::unobserved(|| start_unobserved(options));
    Ok(())
}

fn start_unobserved(options: HistoryOptions) {
    crate::observation::hub::hub();
    // The ring grows as events come (up to the capacity), so a large capacity costs nothing
    // until it is used.
    let recorder = Recorder {
        started: Instant::now(),
        start_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        options,
        events: VecDeque::new(),
        dropped: 0,
    };
    *RECORDER.lock() = Some(recorder);
    observe::set_recording(true);
}

/// Stops recording; what was recorded stays for [`snapshot`].
pub fn stop() {
    observe::set_recording(false);
}

/// Whether recording is on.
pub fn is_recording() -> bool {
    observe::recording()
}

/// Renamed [`recorded`]: a *snapshot* is the memory state of [`crate::telemetry::snapshot`].
#[doc(hidden)]
#[deprecated(note = "renamed `history::recorded`")]
pub fn snapshot() -> History {
    recorded()
}

/// The events recorded so far (recording goes on if it is on). Empty if nothing was recorded.
pub fn recorded() -> History {
    observe::unobserved(recorded_unobserved)
}

fn recorded_unobserved() -> History {
    let guard = RECORDER.lock();
    let Some(r) = guard.as_ref() else {
        return History { version: HISTORY_VERSION, start_unix_ms: 0, capacity: 0, dropped: 0, events: Vec::new() };
    };
    let raw: Vec<Raw> = r.events.iter().cloned().collect();
    let (start_unix_ms, capacity, dropped) = (r.start_unix_ms, r.options.capacity, r.dropped);
    drop(guard);
    // Backtraces are resolved outside the lock (symbolisation is slow).
    let events = observe::unobserved(|| {
        // One shared name per allocator, not one string per event.
        let mut names: HashMap<Tag, Arc<str>> = HashMap::new();
        raw.into_iter()
            .map(|e| HistoryEvent {
                time_ns: e.time_ns,
                action: e.action,
                address: e.address as u64,
                size: e.size as u64,
                allocator: names.entry(e.allocator).or_insert_with(|| e.allocator.as_str().into()).clone(),
                tag: Tag::from_raw(e.tag).map(|t| t.as_str().to_owned()),
                description: e.description.map(String::from),
                backtrace: e.backtrace.as_deref().map(crate::observation::backtrace::trimmed),
            })
            .collect()
    });
    History { version: HISTORY_VERSION, start_unix_ms, capacity, dropped, events }
}

/// Records one event (called by the observer while recording).
pub(crate) fn record(e: &Event<'_>) {
    let wants_backtrace = matches!(e.action, Action::Alloc | Action::Oom | Action::SegmentAlloc);
    let mut guard = RECORDER.lock();
    let Some(r) = guard.as_mut() else { return };
    let backtrace = if wants_backtrace && r.options.backtraces {
        drop(guard);
        let bt = Arc::new(Backtrace::force_capture());
        guard = RECORDER.lock();
        Some(bt)
    } else {
        None
    };
    let Some(r) = guard.as_mut() else { return };
    if r.events.len() >= r.options.capacity {
        r.events.pop_front();
        r.dropped += 1;
    }
    let size = if e.action == Action::Alloc || e.action == Action::Oom { e.requested } else { e.allocated };
    r.events.push_back(Raw {
        time_ns: r.started.elapsed().as_nanos() as u64,
        action: e.action,
        address: e.address,
        size,
        allocator: Tag::intern(e.allocator),
        tag: e.tag.map_or(0, Tag::to_raw),
        description: None,
        backtrace,
    });
}

/// Attaches a description to the newest allocation event at `address`.
pub(crate) fn describe(address: usize, description: &dyn Fn() -> String) {
    let mut guard = RECORDER.lock();
    let Some(r) = guard.as_mut() else { return };
    // The allocation was recorded moments ago: look among the newest events only.
    if let Some(e) = r.events.iter_mut().rev().take(256).find(|e| e.action == Action::Alloc && e.address == address) {
        e.description = Some(description().into());
    }
}

/// A block the recorded events show live, for an OOM report.
pub(crate) struct RingBlock {
    pub(crate) requested: usize,
    pub(crate) tag: Option<Tag>,
    pub(crate) description: Option<Box<str>>,
    pub(crate) backtrace: Option<Arc<Backtrace>>,
}

/// The blocks of `allocator` whose newest recorded event is their allocation, by address
/// (empty when nothing is recorded).
pub(crate) fn live_blocks(allocator: &str) -> HashMap<usize, RingBlock> {
    let me = Tag::intern(allocator);
    let mut live = HashMap::new();
    let guard = RECORDER.lock();
    let Some(r) = guard.as_ref() else { return live };
    for e in r.events.iter().filter(|e| e.allocator == me) {
        match e.action {
            Action::Alloc => {
                let block = RingBlock {
                    requested: e.size,
                    tag: Tag::from_raw(e.tag),
                    description: e.description.clone(),
                    backtrace: e.backtrace.clone(),
                };
                live.insert(e.address, block);
            }
            Action::Free => {
                live.remove(&e.address);
            }
            _ => {}
        }
    }
    live
}
