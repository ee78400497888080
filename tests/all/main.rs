//! tensormem's integration tests, in one binary (one link instead of one per file). Tests that
//! need a process of their own stay apart: `env_override` (its own harness), `global_alloc`
//! (`GlobalAllocator` as the process's allocator), `oom_dump` (the process-wide OOM dump
//! settings and history), `leak_backtrace` (it sets an environment variable), `leaks` (it
//! records the process-wide history), `huge_pages` (it reads the process's resident pages),
//! `prometheus` (it runs itself as exporter processes) and the `register_macro*` files (each a
//! different set of startup registrations).

mod budgets;
mod config;
mod conformance;
#[cfg(feature = "cuda")]
mod cuda;
mod headroom_mappings;
#[cfg(feature = "http")]
mod http;
mod memory_efficiency;
mod memory_space;
mod oom;
mod peak;
mod registry;
mod retry;
mod snapshot;
mod streams;
#[cfg(feature = "prometheus")]
mod telemetry;
mod timeline_browser;
mod trace;
mod tracking;
