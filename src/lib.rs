//! tensormem: a TensorFlow-style memory layer for Rust ML runtimes.
//!
//! - Pick allocators by priority or by name at startup without touching call sites:
//!   [`AllocatorRegistry`], `TENSORMEM_ALLOCATOR`, [`register_allocator!`].
//! - Know where memory goes: every allocator keeps [`AllocatorStats`]; a
//!   [`TrackingAllocator`] records every live pointer; [`scope()`] tags allocations;
//!   [`history`] records every event for the [`timeline`] page;
//!   [`telemetry::memory_summary`] prints a table.
//! - Fail a test the moment it leaks: [`testing::LeakCheck`] sees every allocation of its
//!   thread through any tensormem allocator.
//!
//! The allocator layer itself (the [`Allocator`] trait, its types, the backends) is the
//! `tensormem-allocators` crate, re-exported as [`allocators`] and at the top level here.
//!
//! ```
//! use std::sync::Arc;
//! use tensormem::{AllocatorExt, AllocatorRegistry, TrackingAllocator};
//!
//! let tracker = TrackingAllocator::new(AllocatorRegistry::global().get());
//! let buf = tracker.allocate::<f32>(1 << 16)?;
//! assert_eq!(tracker.live_chunks().len(), 1);
//! // SAFETY: `buf` came from `allocate::<f32>(1 << 16)` on `tracker`.
//! unsafe { tracker.deallocate(buf, 1 << 16) };
//! assert_eq!(tracker.sizes().live_bytes, 0);
//! # Ok::<(), tensormem::AllocError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

/// The `prometheus` crate this one is built with (feature `prometheus`), so that a registry or
/// metric you make has the same version as the [`telemetry::AllocatorCollector`] it sits beside.
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use prometheus;
pub use tensormem_allocators as allocators;

mod config;
mod decorators;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod device;
mod global_allocator;
mod observation;
mod registration;
mod registry;
pub mod telemetry;
mod text_table;
pub mod timeline;
mod trace;

pub use allocators::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorAttributes, AllocatorExt, AllocatorStats,
    BfcAllocator, BuildError, ByteSize, LiveChunk, MemoryDump, MemorySpace, PoolAllocator, PoolStats, SizeRounding,
    SubAllocator, SystemAllocator,
};
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[cfg_attr(docsrs, doc(cfg(feature = "jemalloc")))]
pub use allocators::{JemallocAllocator, JemallocStats};
#[doc(hidden)]
pub use config::SIZE_SPELLINGS;
pub use config::{
    ALLOC_CONF_ENV, AllocConf, ConfigError, DEFAULT_CUDA_MEMORY_FRACTION, KEYS as ALLOC_CONF_KEYS, MAX_SIZE, parse_size,
};
pub use global_allocator::{GLOBAL_ALLOCATOR_ENV, GLOBAL_ALLOCATOR_NAME, GlobalAllocator, GlobalBackend};
pub use observation::oom::{on_oom, remove_oom_observer};
pub use observation::tags::{TagStats, tag_stats};
pub use observation::{history, oom, testing};
// What `register_allocator!` expands to: public for the macro, out of the docs.
pub use decorators::retry::{DEFAULT_MAX_RETRY_WAIT, RetryAllocator};
pub use decorators::tracking::{TrackingAllocator, TrackingSizes};
pub use decorators::wrapper::AllocatorWrapper;
pub use observation::scope::{ScopeGuard, current_scope, scope, with_default_allocator};
#[doc(hidden)]
pub use registration::AllocatorFactory;
pub use registry::{
    ALLOCATOR_ENV, AllocatorRegistry, CONFIGURED_PRIORITY, DEFAULT_PRIORITY, DEVICE_PRIORITY, RegistryEntry,
    RegistryError, SelectionOrigin,
};
pub use trace::{
    AllocationTrace, PreparedTrace, ReplayReport, TRACE_VERSION, TraceError, TraceEvent, TraceRecorder, replay,
};

#[doc(hidden)]
pub mod __private {
    pub use inventory;
}

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
