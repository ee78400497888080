//! The allocator contract, run over every backend of this crate.

use std::sync::Arc;

use tensormem_allocators::{SystemAllocator, allocator_conformance_tests};

allocator_conformance_tests!(system, SystemAllocator::new());
allocator_conformance_tests!(system_limited, SystemAllocator::builder().bytes_limit(1 << 40).build().unwrap());
allocator_conformance_tests!(system_zero_fill, SystemAllocator::builder().zero_fill().build().unwrap());
allocator_conformance_tests!(system_junk_fill, SystemAllocator::builder().junk_fill().build().unwrap());
allocator_conformance_tests!(
    system_as_dyn,
    Arc::new(SystemAllocator::new()) as Arc<dyn tensormem_allocators::Allocator>
);

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
mod jemalloc_backends {
    use tensormem_allocators::{JemallocAllocator, allocator_conformance_tests};

    allocator_conformance_tests!(jemalloc, JemallocAllocator::new());
    allocator_conformance_tests!(jemalloc_limited, JemallocAllocator::builder().bytes_limit(1 << 40).build().unwrap());
    allocator_conformance_tests!(jemalloc_zero_fill, JemallocAllocator::builder().zero_fill().build().unwrap());
}

allocator_conformance_tests!(
    bfc_growing,
    tensormem_allocators::BfcAllocator::builder().memory_limit(1 << 30).allow_growth(true).build().unwrap()
);
allocator_conformance_tests!(
    bfc_whole_limit,
    tensormem_allocators::BfcAllocator::builder().memory_limit(256 << 20).build().unwrap()
);
allocator_conformance_tests!(
    pool_over_system,
    tensormem_allocators::PoolAllocator::builder(Arc::new(SystemAllocator::new()))
        .size_limit(64 << 20)
        .build()
        .unwrap()
);
allocator_conformance_tests!(
    pool_without_caching,
    tensormem_allocators::PoolAllocator::builder(Arc::new(SystemAllocator::new())).size_limit(0).build().unwrap()
);
