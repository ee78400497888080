//! The allocator contract, run over the decorators of this crate.

use std::sync::Arc;

use tensormem::allocators::allocator_conformance_tests;
use tensormem::{AllocatorWrapper, SystemAllocator, TrackingAllocator};

allocator_conformance_tests!(tracking_over_system, TrackingAllocator::new(Arc::new(SystemAllocator::new())));
allocator_conformance_tests!(wrapper_over_system, AllocatorWrapper::new(Arc::new(SystemAllocator::new())));
allocator_conformance_tests!(
    tracking_over_tracking,
    TrackingAllocator::new(Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new()))))
);

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
allocator_conformance_tests!(
    tracking_over_jemalloc,
    TrackingAllocator::new(Arc::new(tensormem::JemallocAllocator::new()))
);
