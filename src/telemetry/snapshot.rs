//! [`MemorySnapshot`]: every registered allocator's stats and, where the allocator knows them,
//! its live chunks (tracking allocators) or memory dump (BFC), as one serde value.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::AllocatorRegistry;
use crate::allocators::{AllocatorExt, AllocatorStats, BfcAllocator, LiveChunk, MemoryDump};
use crate::telemetry::global_alloc;

/// One allocator in a [`MemorySnapshot`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AllocatorSnapshot {
    /// The name it is registered under.
    pub name: String,
    /// Its registry priority.
    pub priority: i32,
    /// Its own `name()`.
    pub allocator: String,
    /// Its stats, if it keeps any (and `stats()` did not panic).
    pub stats: Option<AllocatorStats>,
    /// Its live allocations, if it records them.
    pub live_chunks: Option<Vec<LiveChunk>>,
    /// Its memory dump, if it has one.
    pub memory_dump: Option<MemoryDump>,
    /// Set when one of its queries panicked; the panic was contained.
    pub error: Option<String>,
}

/// Every allocator of a registry at one moment.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemorySnapshot {
    /// When it was taken, in milliseconds since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// The allocators, in registration order.
    pub allocators: Vec<AllocatorSnapshot>,
    /// The process heap, when a [`GlobalAllocator`](crate::GlobalAllocator) is
    /// installed.
    pub global: Option<AllocatorStats>,
    /// Memory mapped from files (model weights), per file.
    #[serde(default)]
    pub mapped: crate::telemetry::MappedMemory,
}

/// The most bytes any figure of a snapshot or history can hold: no process addresses more than
/// `isize::MAX` bytes, so a larger size is forged or corrupt.
pub const MAX_BYTES: u64 = isize::MAX as u64;

impl MemorySnapshot {
    /// Checks that the figures can exist: every byte count at most [`MAX_BYTES`], and in use
    /// (reserved) at most its peak, for every allocator and the process heap. A snapshot read
    /// from a file should pass before it is shown, so that no impossible figure is printed.
    ///
    /// # Errors
    /// A message naming the allocator, the figure and its value.
    pub fn validate(&self) -> Result<(), String> {
        let named = self.allocators.iter().filter_map(|a| a.stats.as_ref().map(|s| (a.name.as_str(), s)));
        for (name, s) in named.chain(self.global.as_ref().map(|g| ("process heap", g))) {
            let figures = [
                ("bytes_in_use", s.bytes_in_use),
                ("peak_bytes_in_use", s.peak_bytes_in_use),
                ("largest_alloc_size", s.largest_alloc_size),
                ("bytes_reserved", s.bytes_reserved),
                ("peak_bytes_reserved", s.peak_bytes_reserved),
                ("bytes_limit", s.bytes_limit.unwrap_or(0)),
                ("total_bytes_allocated", s.total_bytes_allocated.unwrap_or(0)),
            ];
            if let Some((figure, v)) = figures.iter().find(|(_, v)| *v > MAX_BYTES) {
                return Err(format!(
                    "allocator '{name}': {figure} {v} is more than any process can hold ({MAX_BYTES})"
                ));
            }
            if s.bytes_in_use > s.peak_bytes_in_use {
                return Err(format!(
                    "allocator '{name}': bytes_in_use {} is above its peak_bytes_in_use {}",
                    s.bytes_in_use, s.peak_bytes_in_use
                ));
            }
            if s.bytes_reserved > s.peak_bytes_reserved {
                return Err(format!(
                    "allocator '{name}': bytes_reserved {} is above its peak_bytes_reserved {}",
                    s.bytes_reserved, s.peak_bytes_reserved
                ));
            }
        }
        Ok(())
    }
}

/// A snapshot of the [global registry](AllocatorRegistry::global).
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{AllocatorExt, AllocatorRegistry, SystemAllocator, TrackingAllocator};
///
/// let tracked = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
/// AllocatorRegistry::global().register("tracked-doc", -100, tracked.clone())?;
/// let p = tracked.allocate::<u8>(64)?;
/// let snap = tensormem::telemetry::snapshot();
/// let entry = snap.allocators.iter().find(|a| a.name == "tracked-doc").unwrap();
/// assert_eq!(entry.live_chunks.as_ref().unwrap()[0].requested_size, 64);
/// assert!(tensormem::telemetry::snapshot_json().contains("\"tracked-doc\""));
/// // SAFETY: `p` came from `allocate::<u8>(64)` on `tracked`.
/// unsafe { tracked.deallocate(p, 64) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn snapshot() -> MemorySnapshot {
    snapshot_of(AllocatorRegistry::global())
}

/// [`snapshot`] as pretty JSON.
pub fn snapshot_json() -> String {
    // A snapshot holds integers, floats, strings and paths written as text: serde_json writes
    // each of these into memory without fail (it only fails on maps with non-string keys and on
    // values whose own Serialize fails, and there are none), so this cannot panic.
    serde_json::to_string_pretty(&snapshot()).expect("a memory snapshot always serialises")
}

/// A snapshot of `registry`. A query that panics is contained and recorded in
/// [`AllocatorSnapshot::error`]; the other allocators are still read.
pub fn snapshot_of(registry: &AllocatorRegistry) -> MemorySnapshot {
    let allocators = registry
        .entries()
        .into_iter()
        .map(|entry| {
            let a = &entry.allocator;
            let read = catch_unwind(AssertUnwindSafe(|| {
                (
                    a.name().to_owned(),
                    a.stats(),
                    a.snapshot_live_chunks(),
                    a.backend_as::<BfcAllocator>().map(BfcAllocator::memory_dump),
                )
            }));
            match read {
                Ok((allocator, stats, live_chunks, memory_dump)) => AllocatorSnapshot {
                    name: entry.name,
                    priority: entry.priority,
                    allocator,
                    stats,
                    live_chunks,
                    memory_dump,
                    error: None,
                },
                Err(panic) => AllocatorSnapshot {
                    name: entry.name,
                    priority: entry.priority,
                    allocator: String::new(),
                    stats: None,
                    live_chunks: None,
                    memory_dump: None,
                    error: Some(
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_else(|| "a query panicked".to_owned()),
                    ),
                },
            }
        })
        .collect();
    MemorySnapshot {
        taken_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        allocators,
        global: global_alloc::global_stats(),
        mapped: crate::telemetry::mapped_memory(),
    }
}
