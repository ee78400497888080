//! Telemetry: the Prometheus collector of a registry's allocators, the process-wide heap
//! counter, and memory snapshots. Stats are read when scraped; nothing here runs on the allocation path.

#[cfg(feature = "prometheus")]
mod collector;
pub(crate) mod global_alloc;
mod mapped;
#[cfg(feature = "http")]
mod server;
mod snapshot;
mod summary;

#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use collector::AllocatorCollector;
#[allow(deprecated)]
pub use global_alloc::CountingGlobalAlloc;
pub use global_alloc::process_heap_stats;
pub use mapped::{MappedFile, MappedMemory, mapped_memory, mapped_stats};
pub use mapped::{MappingRecord, record_mapping};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use server::{CONTENT_TYPE_TEXT, MetricsServer, ServerError, ServerOptions};
pub use snapshot::{AllocatorSnapshot, MAX_BYTES, MemorySnapshot, snapshot, snapshot_json, snapshot_of};
pub use summary::{memory_summary, summary_of};
