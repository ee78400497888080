//! Observation, in one place: what the allocators crate's event hooks
//! ([`crate::allocators::observe`]) report is turned here into scopes, leak checks, history and
//! per-tag statistics.
//!
//! - [`hub`]: the process's one observer; it keeps the live allocations that a leak check or a
//!   scope tag needs and feeds the history recorder;
//! - [`scope`]: scopes and the scoped default allocator (`tensormem::scope`);
//! - [`testing`]: leak checks (`tensormem::testing`);
//! - [`history`]: the event recorder (`tensormem::history`);
//! - [`oom`]: OOM reports (`tensormem::oom`, `tensormem::on_oom`);
//! - [`tags`]: per-tag totals (`tensormem::tag_stats`);
//! - [`backtrace`]: recorded backtraces, the library's own frames trimmed.

pub(crate) mod backtrace;
pub mod history;
pub(crate) mod hub;
pub mod oom;
pub(crate) mod scope;
pub(crate) mod tags;
pub mod testing;
