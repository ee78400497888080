//! [`MemorySnapshot`]: every registered allocator's stats and, where the allocator knows them,
//! its live chunks (tracking allocators) or memory dump (BFC), as one serde value.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::AllocatorRegistry;
use crate::allocators::{AllocatorStats, LiveChunk, MemoryDump};
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
    /// The process heap, when a [`CountingGlobalAlloc`](crate::telemetry::CountingGlobalAlloc) is
    /// installed.
    pub global: Option<AllocatorStats>,
    /// Memory mapped from files (model weights), per file.
    #[serde(default)]
    pub mapped: crate::telemetry::MappedMemory,
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
    serde_json::to_string_pretty(&snapshot()).unwrap_or_default()
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
                (a.name().to_owned(), a.stats(), a.snapshot_live_chunks(), a.snapshot_memory_dump())
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
