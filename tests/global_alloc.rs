//! CountingGlobalAlloc as the process's #[global_allocator]: its own test binary, one test, since
//! the figures are process-wide.

use std::alloc::System;

use tensormem::telemetry::CountingGlobalAlloc;

#[global_allocator]
static GLOBAL: CountingGlobalAlloc<System> = CountingGlobalAlloc::new(System);

#[test]
fn the_process_heap_is_counted() {
    let before = GLOBAL.stats().expect("installed: the test harness has allocated already");
    assert_eq!(tensormem::telemetry::process_heap_stats().map(|s| s.num_allocs > 0), Some(true));
    let big = vec![7u8; 8 << 20];
    let during = GLOBAL.stats().unwrap();
    assert!(during.bytes_in_use >= before.bytes_in_use + (8 << 20) - (1 << 20), "{before:?} -> {during:?}");
    assert!(during.peak_bytes_in_use >= during.bytes_in_use);
    assert!(during.num_allocs > before.num_allocs);
    drop(big);
    let after = GLOBAL.stats().unwrap();
    assert!(after.bytes_in_use + (7 << 20) < during.bytes_in_use, "{during:?} -> {after:?}");
    assert!(after.num_frees > during.num_frees);
    assert!(after.peak_bytes_in_use >= during.bytes_in_use, "{during:?} -> {after:?}");

    // Growing a Vec reallocates: in use follows the final size.
    let mut v: Vec<u64> = Vec::new();
    for i in 0..(1 << 20) {
        v.push(i);
    }
    let grown = GLOBAL.stats().unwrap();
    assert!(grown.bytes_in_use >= after.bytes_in_use + (8 << 20) - (1 << 20));
    drop(v);

    // Many threads (more than its 64 private slots) allocating and freeing keep the totals
    // consistent: everything they allocated is freed again.
    let base = GLOBAL.stats().unwrap();
    for _ in 0..3 {
        let handles: Vec<_> = (0..40)
            .map(|t| {
                std::thread::spawn(move || {
                    let boxes: Vec<Box<[u8; 256]>> = (0..1000).map(|_| Box::new([t as u8; 256])).collect();
                    boxes.iter().map(|b| b[0] as u64).sum::<u64>()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    let end = GLOBAL.stats().unwrap();
    assert!(end.num_allocs >= base.num_allocs + 120 * 1000);
    assert!(end.num_frees >= base.num_frees + 120 * 1000);
    // Thread bookkeeping of the runtime may linger, but not 120 x 1000 boxes of 256 bytes.
    assert!(end.bytes_in_use < base.bytes_in_use + (4 << 20), "{base:?} -> {end:?}");

    #[cfg(feature = "prometheus")]
    {
        use std::sync::Arc;
        use tensormem::telemetry::AllocatorCollector;
        let text = AllocatorCollector::global().render();
        assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"global\"}"), "{text}");
        assert!(text.contains("tensormem_allocator_allocations_total{allocator=\"global\"}"));
        // An isolated registry's collector does not add the process heap unless asked...
        let isolated = Arc::new(tensormem::AllocatorRegistry::new());
        isolated.register("cpu", 0, Arc::new(tensormem::SystemAllocator::new())).unwrap();
        let text = AllocatorCollector::for_registry(Arc::clone(&isolated)).render();
        assert!(!text.contains("allocator=\"global\""), "{text}");
        // ...and an allocator registered as `global` keeps its name: the heap becomes `global_heap`,
        // so no two series share a label set.
        isolated.register("global", 0, Arc::new(tensormem::SystemAllocator::new())).unwrap();
        let text = AllocatorCollector::for_registry(isolated).with_process_heap(true).render();
        assert_eq!(text.matches("tensormem_allocator_in_use_bytes{allocator=\"global\"}").count(), 1, "{text}");
        assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"global_heap\"}"), "{text}");
    }
}
