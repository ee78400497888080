//! Bad inputs get clear errors, and nothing is touched or counted.

use core::alloc::Layout;

use tensormem_allocators::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorExt, BuildError, SystemAllocator,
};

#[test]
fn typed_allocation_overflow_is_size_overflow_not_a_wrapped_size() {
    let cpu = SystemAllocator::new();
    for n in [usize::MAX, usize::MAX / 2, (isize::MAX as usize) / 4 + 1] {
        let err = cpu.allocate::<u32>(n).unwrap_err();
        assert_eq!(err.kind(), AllocErrorKind::SizeOverflow);
        assert_eq!(err.layout(), None);
        assert_eq!(
            err.to_string(),
            format!(
                "allocator 'cpu' could not allocate {n} elements of 4 bytes (align 4): the total size overflows usize"
            )
        );
    }
    assert!(format!("{:?}", cpu.allocate::<u32>(usize::MAX).unwrap_err()).contains("SizeOverflow"));
    assert_eq!(cpu.stats().unwrap().num_allocs, 0);
    assert_eq!(cpu.stats().unwrap().num_ooms, 0);
}

#[test]
fn a_request_over_the_limit_fails_before_touching_memory() {
    let cpu = SystemAllocator::builder().name("capped").bytes_limit(1 << 20).build().unwrap();
    let p = cpu.allocate::<u8>(600 << 10).unwrap();
    // 1 TiB: had it reached malloc it would have failed as OutOfMemory, not LimitExceeded.
    let err = cpu.allocate::<u8>(1 << 40).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::LimitExceeded);
    assert_eq!(err.in_use(), Some(600 << 10));
    assert_eq!(err.limit(), Some(1 << 20));
    assert_eq!(err.allocator(), "capped");
    assert_eq!(
        err.to_string(),
        "allocator 'capped' could not allocate 1.0 TiB (1099511627776 bytes, align 1): limit exceeded: \
         600.0 KiB in use of a 1.0 MiB limit"
    );
    // Just over the remaining room fails too; exactly the remaining room succeeds.
    let room = (1 << 20) - (600 << 10);
    assert_eq!(cpu.allocate::<u8>(room + 1).unwrap_err().kind(), AllocErrorKind::LimitExceeded);
    let q = cpu.allocate::<u8>(room).unwrap();
    let s = cpu.stats().unwrap();
    assert_eq!((s.num_allocs, s.bytes_in_use, s.num_ooms, s.bytes_limit), (2, 1 << 20, 2, Some(1 << 20)));
    // SAFETY: both freed once with their counts.
    unsafe {
        cpu.deallocate(p, 600 << 10);
        cpu.deallocate(q, room);
    }
    assert_eq!(cpu.stats().unwrap().bytes_in_use, 0);
    assert_eq!(cpu.stats().unwrap().peak_bytes_in_use, 1 << 20);
}

#[test]
fn a_limit_of_zero_is_a_construction_error() {
    let err = SystemAllocator::builder().name("z").bytes_limit(0).build().unwrap_err();
    assert_eq!(err, BuildError::ZeroLimit { allocator: "z".into() });
    assert_eq!(
        err.to_string(),
        "allocator 'z': a bytes_limit of 0 would refuse every allocation; set a positive limit or none"
    );
}

#[test]
fn zero_fill_and_junk_fill_together_are_a_construction_error() {
    let err = SystemAllocator::builder().junk_fill().zero_fill().build().unwrap_err();
    assert_eq!(err, BuildError::ConflictingFill { allocator: "cpu".into() });
    assert_eq!(err.to_string(), "allocator 'cpu': zero_fill and junk_fill were both requested; choose one");
    assert_eq!(SystemAllocator::builder().name("").build().unwrap_err(), BuildError::EmptyName);
}

#[test]
fn zero_fill_zeroes_and_junk_fill_writes_the_nan_pattern() {
    let attrs = AllocationAttributes::default();
    let layout = Layout::from_size_align(4096, 64).unwrap();
    for _ in 0..50 {
        let dirty = SystemAllocator::new();
        let p = dirty.allocate_raw(layout, &attrs).unwrap();
        // SAFETY: 4096 writable bytes; freed once.
        unsafe {
            p.as_ptr().write_bytes(0xAB, 4096);
            dirty.deallocate_raw(p, layout);
        }
        let zero = SystemAllocator::builder().zero_fill().build().unwrap();
        let z = zero.allocate_raw(layout, &attrs).unwrap();
        // SAFETY: `z` is valid for 4096 bytes, freshly zeroed.
        assert!(unsafe { core::slice::from_raw_parts(z.as_ptr(), 4096) }.iter().all(|&b| b == 0));
        // SAFETY: freed once.
        unsafe { zero.deallocate_raw(z, layout) };
    }
    let junk = SystemAllocator::builder().junk_fill().build().unwrap();
    let j = junk.allocate::<f32>(1000).unwrap();
    // SAFETY: 1000 f32s, all written by the junk fill.
    let values = unsafe { core::slice::from_raw_parts(j.as_ptr(), 1000) };
    assert!(values.iter().all(|v| v.is_nan() && v.to_bits() == tensormem_allocators::JUNK_PATTERN));
    // SAFETY: freed once.
    unsafe { junk.deallocate(j, 1000) };
}

#[test]
fn errors_are_small_copy_and_debug_shows_the_kind() {
    fn assert_copy<T: Copy + std::error::Error + Send + Sync + 'static>() {}
    assert_copy::<AllocError>();
    // Small enough to build on the stack when an allocation fails; the success path of a
    // `Result<NonNull<u8>, AllocError>` writes only the tag and the pointer whatever this size.
    assert!(core::mem::size_of::<AllocError>() <= 104, "{}", core::mem::size_of::<AllocError>());
    let e = AllocError::new(
        AllocErrorKind::OutOfMemory,
        Layout::new::<[u8; 10]>(),
        "a-rather-long-allocator-name-that-goes-on",
    )
    .with_rounded_size(256)
    .with_usage(1 << 30, Some(1 << 30))
    .with_largest_free_block(4096);
    assert_eq!(
        e.to_string(),
        "allocator 'a-rather-long-allocator-nam…' could not allocate 10 B (10 bytes, align 1), rounded to 256 B: \
         out of memory: 1.0 GiB in use of a 1.0 GiB limit; largest free block 4.0 KiB"
    );
    let dbg = format!("{e:?}");
    assert!(dbg.contains("kind: OutOfMemory") && dbg.contains("largest_free_block: 4096"), "{dbg}");
    assert_eq!(e.allocator(), "a-rather-long-allocator-nam");
    assert_eq!((e.rounded_size(), e.largest_free_block()), (Some(256), Some(4096)));
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[test]
fn jemalloc_limit_is_checked_before_jemalloc_maps_anything() {
    use tensormem_allocators::JemallocAllocator;
    let je = JemallocAllocator::builder().bytes_limit(1 << 20).build().unwrap();
    let before = JemallocAllocator::jemalloc_stats().unwrap();
    let err = je.allocate::<u8>(256 << 20).unwrap_err();
    let after = JemallocAllocator::jemalloc_stats().unwrap();
    assert_eq!(err.kind(), AllocErrorKind::LimitExceeded);
    // Other tests in this process allocate too, but nowhere near 256 MiB.
    assert!(after.mapped < before.mapped + (128 << 20), "jemalloc mapped the refused request");
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[test]
fn jemalloc_stats_are_ordered_and_move_with_allocations() {
    use tensormem_allocators::JemallocAllocator;
    let je = JemallocAllocator::new();
    let before = JemallocAllocator::jemalloc_stats().unwrap();
    let p = je.allocate::<u8>(64 << 20).unwrap();
    // SAFETY: 64 MiB writable; touch every page so it becomes resident.
    unsafe { p.as_ptr().write_bytes(1, 64 << 20) };
    let during = JemallocAllocator::jemalloc_stats().unwrap();
    assert!(during.allocated >= before.allocated + (64 << 20) - (8 << 20));
    assert!(during.active >= during.allocated);
    assert!(during.resident >= 64 << 20);
    assert!(during.mapped >= during.active);
    assert!(during.metadata > 0);
    // SAFETY: freed once.
    unsafe { je.deallocate(p, 64 << 20) };
    let after = JemallocAllocator::jemalloc_stats().unwrap();
    assert!(after.allocated + (32 << 20) < during.allocated);
    assert_eq!(je.stats().unwrap().bytes_in_use, 0);
}
