//! Telemetry: the Prometheus collector of a registry's allocators and the process-wide heap
//! counter. Stats are read when scraped; nothing here runs on the allocation path.

#[cfg(feature = "prometheus")]
mod collector;
mod global_alloc;

#[cfg(feature = "prometheus")]
pub use collector::AllocatorCollector;
pub use global_alloc::CountingGlobalAlloc;
