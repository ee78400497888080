//! The allocator layer of [tensormem](https://docs.rs/tensormem): the [`Allocator`] trait,
//! its [`AllocatorStats`], attributes and [`AllocError`], and the backends.
//!
//! The registry, decorators and telemetry live in the `tensormem` crate, which re-exports this
//! one; the only global state here is the [`observe`] hooks' switch word and observer.
//!
//! Backends:
//! - [`SystemAllocator`]: the system allocator with exact, lock-free statistics.
//! - `JemallocAllocator` (feature `jemalloc`, on by default): jemalloc with the same statistics
//!   and jemalloc's own arena figures.
//! - [`BfcAllocator`]: TensorFlow's best-fit-with-coalescing arena over a [`SubAllocator`], with
//!   a memory limit, fragmentation figures and memory dumps: the OS's 4 KiB pages
//!   ([`OsSubAllocator`], [`OsMemory`]) or 2 MiB transparent huge pages
//!   ([`HugePageSubAllocator`], [`HugePageMemory`]).
//! - [`PoolAllocator`]: free lists by rounded size over any allocator, LRU eviction past a size
//!   limit, TensorFlow's auto-resize; requests above 1 MiB go to a BFC over huge pages.
//!
//! ```
//! use tensormem_allocators::{Allocator, AllocatorExt, SystemAllocator};
//!
//! let cpu = SystemAllocator::new();
//! let buf = cpu.allocate::<f32>(256)?;
//! assert_eq!(cpu.stats().unwrap().bytes_in_use, 1024);
//! // SAFETY: `buf` came from `allocate::<f32>(256)` on `cpu`.
//! unsafe { cpu.deallocate(buf, 256) };
//! # Ok::<(), tensormem_allocators::AllocError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

// The folders show the design: the API at the root, the backends in `backends/`, OS memory
// (sub-allocators, expandable regions, huge pages) in `os/`, and the lock-free primitives the
// backends and statistics rest on in `sync/`. Each module keeps a short path at the crate root.
mod allocator;
mod attributes;
#[path = "backends/backend.rs"]
mod backend;
#[path = "sync/barrier.rs"]
mod barrier;
#[path = "backends/bfc/mod.rs"]
mod bfc;
mod builder;
mod conformance;
#[path = "sync/counters.rs"]
mod counters;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
#[path = "backends/cuda/mod.rs"]
pub mod cuda;
mod error;
#[path = "os/expandable.rs"]
mod expandable;
#[cfg(target_os = "linux")]
#[path = "os/fake_device.rs"]
mod fake_device;
mod format;
#[path = "os/huge_pages.rs"]
mod huge_pages;
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[path = "backends/jemalloc.rs"]
mod jemalloc;
mod memory_space;
pub mod observe;
#[path = "sync/per_thread.rs"]
mod per_thread;
#[path = "backends/pool/mod.rs"]
mod pool;
// The atomics and locks of the lock-free structures, loom's under `--cfg loom`; the tracking
// allocator's chunk tables in `tensormem` use them too.
#[doc(hidden)]
#[path = "sync/primitives.rs"]
pub mod primitives;
mod stats;
mod stream;
#[path = "backends/stream_bfc.rs"]
mod stream_bfc;
#[path = "os/sub_allocator.rs"]
mod sub_allocator;
#[path = "backends/system.rs"]
mod system;
pub mod transfer;
#[path = "os/units.rs"]
mod units;
#[path = "sync/word_map.rs"]
mod word_map;

pub use allocator::{Allocator, AllocatorExt, LiveChunk, dangling};

/// This crate's folder as it was built: `tensormem` trims frames of files under it from the top
/// of recorded backtraces.
#[doc(hidden)]
pub const SOURCE_DIR: &str = env!("CARGO_MANIFEST_DIR");
pub use attributes::{AllocationAttributes, AllocatorAttributes};
pub use bfc::{
    BFC_DUMP_ON_OOM_ENV, BfcAllocator, BfcBuilder, BinSummary, ChunkInfo, DEFAULT_FIRST_FIT_ABOVE,
    DEFAULT_GROWTH_GRANULE, DEFAULT_MAX_INTERNAL_FRAGMENTATION, DEFAULT_PEAK_HEADROOM, ExpandableInfo,
    MAX_GROWTH_GRANULE, MIN_ALLOCATION_SIZE, MemoryDump, ParseSplitPolicyError, RegionInfo, SplitPolicy,
};
pub use builder::{AllocatorBuilder, BackendOptions, Fill, FromOptions};
// Internals that the other crates of the workspace build on: public for them, out of the docs.
#[doc(hidden)]
pub use bfc::NUM_BINS;
#[doc(hidden)]
pub use builder::JUNK_PATTERN;
#[doc(hidden)]
pub use counters::{CounterSnapshot, FLUSH_BYTES, LimitHit, StatsCounters};
pub use error::{AllocError, AllocErrorKind, BuildError};
pub use expandable::{ExpandableMemory, OsMemory};
// A GPU's virtual memory rules over host memory, for tests and benches of device bookkeeping.
#[cfg(target_os = "linux")]
#[doc(hidden)]
pub use fake_device::{FakeDevice, FakeDeviceSubAllocator, FakeStreams};
pub use format::ByteSize;
pub use huge_pages::{HUGE_PAGE, HugePageMemory, HugePageSubAllocator};
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[cfg_attr(docsrs, doc(cfg(feature = "jemalloc")))]
pub use jemalloc::{JemallocAllocator, JemallocStats, JemallocStatsError};
pub use memory_space::MemorySpace;
#[doc(hidden)]
pub use per_thread::{PerThread, ThreadValue};
#[doc(hidden)]
pub use pool::THREAD_CACHE_MAX_CLASS;
pub use pool::{DEFAULT_LARGE_THRESHOLD, PoolAllocator, PoolBuilder, PoolStats, SizeRounding, physical_memory};
pub use stats::AllocatorStats;
pub use stream::{StreamError, StreamEvents, StreamId, StreamOrdered};
pub use stream_bfc::StreamOrderedBfc;
pub use sub_allocator::{OsSubAllocator, SubAllocator};
pub use system::SystemAllocator;
/// jemalloc as a `GlobalAlloc`, for `tensormem::GlobalAllocator`'s `jemalloc` backend.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[doc(hidden)]
pub use tikv_jemallocator::Jemalloc as JemallocGlobal;
pub use units::{UnitDriver, UnitMemory};
