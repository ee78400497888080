//! Decorators: allocators that wrap another and add one behaviour, each an [`Allocator`] itself
//! so that they stack and register like any backend.
//!
//! - [`wrapper`]: forwards everything (`AllocatorWrapper`, the base to override from);
//! - [`tracking`]: records every live pointer with its size and scope (`TrackingAllocator`);
//! - [`retry`]: waits for memory to be freed before giving up (`RetryAllocator`).
//!
//! [`Allocator`]: crate::Allocator

pub(crate) mod retry;
pub(crate) mod tracking;
pub(crate) mod wrapper;
