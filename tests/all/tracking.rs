//! TrackingAllocator: chunks, ids, sizes, and refusing bad frees without touching the inner allocator.

use std::alloc::Layout;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;

use tensormem::{
    AllocationAttributes, Allocator, AllocatorExt, LiveChunk, SystemAllocator, TrackingAllocator, TrackingSizes,
};

fn tracker() -> (Arc<SystemAllocator>, TrackingAllocator) {
    let inner = Arc::new(SystemAllocator::new());
    let t = TrackingAllocator::new(inner.clone());
    (inner, t)
}

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn records_chunks_with_ids_increasing_from_one() {
    let (_, t) = tracker();
    let attrs = AllocationAttributes::default();
    let layouts = [(100, 8), (4096, 64), (1, 1)];
    let ptrs: Vec<_> =
        layouts.iter().map(|&(s, a)| t.allocate_raw(Layout::from_size_align(s, a).unwrap(), &attrs).unwrap()).collect();
    for (i, (&p, &(size, _))) in ptrs.iter().zip(&layouts).enumerate() {
        assert_eq!(
            t.chunk(p),
            Some(LiveChunk {
                address: p.as_ptr() as usize,
                requested_size: size,
                allocated_size: size,
                allocation_id: i as u64 + 1,
                tag: None
            })
        );
        assert_eq!(t.requested_size(p), Some(size));
        assert_eq!(t.allocated_size(p), Some(size));
        assert_eq!(t.allocation_id(p), Some(i as u64 + 1));
    }
    assert!(t.tracks_allocation_sizes());
    let live = t.live_chunks();
    assert_eq!(live.iter().map(|c| c.allocation_id).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(live[1].address, ptrs[1].as_ptr() as usize);
    assert_eq!(t.sizes(), TrackingSizes { total_bytes: 4197, high_watermark: 4197, live_bytes: 4197 });

    // SAFETY: freed once each with their layouts.
    unsafe { t.deallocate_raw(ptrs[1], Layout::from_size_align(4096, 64).unwrap()) };
    assert_eq!(t.sizes(), TrackingSizes { total_bytes: 4197, high_watermark: 4197, live_bytes: 101 });
    assert_eq!(t.requested_size(ptrs[1]), None);
    let p4 = t.allocate::<u8>(10).unwrap();
    assert_eq!(t.allocation_id(p4), Some(4));
    // SAFETY: freed once each with their layouts.
    unsafe {
        t.deallocate(p4, 10);
        t.deallocate_raw(ptrs[0], Layout::from_size_align(100, 8).unwrap());
        t.deallocate_raw(ptrs[2], Layout::from_size_align(1, 1).unwrap());
    }
    assert!(t.live_chunks().is_empty());
    assert_eq!(t.sizes(), TrackingSizes { total_bytes: 4207, high_watermark: 4197, live_bytes: 0 });
}

#[test]
fn double_free_panics_naming_allocator_and_address_without_reaching_inner() {
    let (inner, t) = tracker();
    let layout = Layout::from_size_align(256, 16).unwrap();
    let p = t.allocate_raw(layout, &AllocationAttributes::default()).unwrap();
    // SAFETY: first free of a live block.
    unsafe { t.deallocate_raw(p, layout) };
    let frees = inner.stats().unwrap().num_frees;
    // SAFETY: deliberately wrong; the tracker must refuse before the inner allocator sees it.
    let msg = panic_message(|| unsafe { t.deallocate_raw(p, layout) });
    assert!(msg.contains("TrackingAllocator over 'cpu'"), "{msg}");
    assert!(msg.contains(&format!("{p:p}")), "{msg}");
    assert!(msg.contains("already freed"), "{msg}");
    assert_eq!(inner.stats().unwrap().num_frees, frees, "the inner allocator was called");
    assert_eq!(t.stats().unwrap().num_frees, 1);
}

#[test]
fn foreign_free_panics_without_reaching_inner() {
    let (inner, t) = tracker();
    let other = SystemAllocator::new();
    let layout = Layout::from_size_align(64, 8).unwrap();
    let foreign = other.allocate_raw(layout, &AllocationAttributes::default()).unwrap();
    // SAFETY: deliberately foreign; the tracker must refuse before the inner allocator sees it.
    let msg = panic_message(|| unsafe { t.deallocate_raw(foreign, layout) });
    assert!(msg.contains("never handed out by this allocator"), "{msg}");
    assert!(msg.contains(&format!("{foreign:p}")), "{msg}");
    assert_eq!(inner.stats().unwrap().num_frees, 0);
    // The foreign block is intact and still belongs to its owner.
    // SAFETY: `foreign` is live in `other` with `layout`.
    unsafe { other.deallocate_raw(foreign, layout) };
    assert_eq!(other.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn free_with_the_wrong_size_is_refused_and_the_block_stays_tracked() {
    let (inner, t) = tracker();
    let p = t.allocate::<u64>(16).unwrap();
    // SAFETY: deliberately the wrong count; the tracker must refuse it.
    let msg = panic_message(|| unsafe { t.deallocate(p, 8) });
    assert!(msg.contains("allocated with 128 bytes (allocation #1)"), "{msg}");
    assert_eq!(t.live_chunks().len(), 1);
    assert_eq!(inner.stats().unwrap().num_frees, 0);
    // SAFETY: the right free.
    unsafe { t.deallocate(p, 16) };
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn zero_size_requests_are_not_tracked() {
    let (inner, t) = tracker();
    let p = t.allocate::<f32>(0).unwrap();
    assert!(t.live_chunks().is_empty());
    assert_eq!(t.requested_size(p.cast()), None);
    // SAFETY: zero-size frees are no-ops.
    unsafe { t.deallocate(p, 0) };
    assert_eq!(inner.stats().unwrap().num_allocs, 0);
    assert_eq!(t.sizes(), TrackingSizes::default());
}

#[test]
fn stats_combine_own_counts_with_the_inner_limit() {
    let inner = Arc::new(SystemAllocator::builder().bytes_limit(10_000).build().unwrap());
    let t = TrackingAllocator::new(inner);
    let p = t.allocate::<u8>(6000).unwrap();
    let err = t.allocate::<u8>(6000).unwrap_err();
    assert_eq!(err.kind(), tensormem::AllocErrorKind::LimitExceeded);
    let s = t.stats().unwrap();
    assert_eq!((s.num_allocs, s.bytes_in_use, s.bytes_limit, s.num_ooms), (1, 6000, Some(10_000), 1));
    assert!(t.clear_stats());
    let s = t.stats().unwrap();
    assert_eq!((s.num_allocs, s.peak_bytes_in_use, s.largest_alloc_size), (0, 6000, 0));
    // SAFETY: freed once.
    unsafe { t.deallocate(p, 6000) };
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[test]
fn allocated_size_is_jemallocs_usable_size() {
    let t = TrackingAllocator::new(Arc::new(tensormem::JemallocAllocator::new()));
    let p: NonNull<u8> = t.allocate::<u8>(100).unwrap();
    assert_eq!(t.requested_size(p), Some(100));
    assert_eq!(t.allocated_size(p), Some(112), "jemalloc's size class for 100 bytes is 112");
    assert_eq!(t.sizes().live_bytes, 112);
    // SAFETY: freed once.
    unsafe { t.deallocate(p, 100) };
}

#[test]
fn ids_stay_unique_across_threads() {
    let (_, t) = tracker();
    let ids: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let ptrs: Vec<_> = (0..2000).map(|i| t.allocate::<u8>(1 + i % 300).unwrap()).collect();
                    let ids = ptrs.iter().map(|&p| t.allocation_id(p).unwrap()).collect::<Vec<_>>();
                    for (i, p) in ptrs.into_iter().enumerate() {
                        // SAFETY: freed once with the allocation's count.
                        unsafe { t.deallocate(p, 1 + i % 300) };
                    }
                    ids
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for thread_ids in &ids {
        assert!(thread_ids.windows(2).all(|w| w[0] < w[1]), "ids increase within a thread");
    }
    let mut all: Vec<u64> = ids.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 4000, "ids are not unique");
    assert_eq!(all[0], 1);
    // Threads take ids in blocks of 64: at most one partly used block per thread.
    assert!(*all.last().unwrap() <= 4000 + 2 * 64, "{}", all.last().unwrap());
    assert_eq!(t.sizes().live_bytes, 0);
    assert!(t.live_chunks().is_empty());
}

#[test]
fn frees_from_another_thread_find_the_allocating_threads_table() {
    let (inner, t) = tracker();
    let t = Arc::new(t);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, usize)>();
    let producer = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || {
            for i in 0..5000 {
                let p = t.allocate::<u8>(1 + i % 700).unwrap();
                tx.send((p.as_ptr() as usize, 1 + i % 700)).unwrap();
            }
        })
    };
    let mut freed = 0;
    for (addr, n) in rx {
        let p = NonNull::new(addr as *mut u8).unwrap();
        assert_eq!(t.requested_size(p), Some(n), "a pointer of another thread is not visible");
        // SAFETY: each pointer is freed once with its count.
        unsafe { t.deallocate(p, n) };
        freed += 1;
    }
    producer.join().unwrap();
    assert_eq!(freed, 5000);
    assert!(t.live_chunks().is_empty());
    assert_eq!(t.sizes().live_bytes, 0);
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0);
    assert_eq!(t.stats().unwrap().num_frees, 5000);
}

#[test]
fn thousands_of_live_pointers_survive_table_growth() {
    let (_, t) = tracker();
    let ptrs: Vec<NonNull<u8>> = (0..20_000).map(|i| t.allocate::<u8>(8 + i % 64).unwrap()).collect();
    for (i, &p) in ptrs.iter().enumerate() {
        assert_eq!(t.chunk(p).map(|c| (c.requested_size, c.allocation_id)), Some((8 + i % 64, i as u64 + 1)));
    }
    // Free every other pointer (tombstones), then allocate again (reuse and sweeps).
    for (i, &p) in ptrs.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        // SAFETY: freed once with its count.
        unsafe { t.deallocate(p, 8 + i % 64) };
    }
    let more: Vec<NonNull<u8>> = (0..10_000).map(|_| t.allocate::<u8>(16).unwrap()).collect();
    let live = t.live_chunks();
    assert_eq!(live.len(), 20_000);
    assert!(live.windows(2).all(|w| w[0].allocation_id < w[1].allocation_id));
    for (i, &p) in ptrs.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        // SAFETY: freed once with its count.
        unsafe { t.deallocate(p, 8 + i % 64) };
    }
    for p in more {
        // SAFETY: freed once with its count.
        unsafe { t.deallocate(p, 16) };
    }
    assert!(t.live_chunks().is_empty());
    assert_eq!(t.sizes().live_bytes, 0);
}

#[test]
fn readers_see_consistent_chunks_while_threads_allocate_and_free() {
    let (_, t) = tracker();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for w in 0..2usize {
            let t = &t;
            s.spawn(move || {
                let mut live = Vec::new();
                for i in 0..30_000usize {
                    let n = 1 + (i * 13 + w) % 500;
                    live.push((t.allocate::<u8>(n).unwrap(), n));
                    if live.len() > 100 {
                        let (p, n) = live.swap_remove(i % live.len());
                        // SAFETY: freed once with its count.
                        unsafe { t.deallocate(p, n) };
                    }
                }
                for (p, n) in live {
                    // SAFETY: freed once with its count.
                    unsafe { t.deallocate(p, n) };
                }
            });
        }
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for c in t.live_chunks() {
                    assert!(c.address != 0 && c.requested_size >= 1 && c.requested_size <= 500, "{c:?}");
                    assert!(c.allocated_size >= c.requested_size && c.allocation_id >= 1, "{c:?}");
                }
                std::thread::yield_now();
            }
        });
        // Let the workers run, then stop the reader once they are done.
        std::thread::sleep(std::time::Duration::from_millis(50));
        while t.stats().unwrap().num_frees < 60_000 {
            std::thread::yield_now();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(t.live_chunks().is_empty());
    let s = t.stats().unwrap();
    assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use), (60_000, 60_000, 0));
}

#[test]
fn pointers_of_exited_threads_stay_tracked_and_freeable() {
    let (inner, t) = tracker();
    let t = Arc::new(t);
    let addrs: Vec<usize> = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || (0..300).map(|_| t.allocate::<u64>(4).unwrap().as_ptr() as usize).collect())
            .join()
            .unwrap()
    };
    assert_eq!(t.live_chunks().len(), 300);
    // A new thread adopts the exited thread's table and keeps using it.
    let t2 = Arc::clone(&t);
    let extra = std::thread::spawn(move || t2.allocate::<u64>(4).unwrap().as_ptr() as usize).join().unwrap();
    assert_eq!(t.live_chunks().len(), 301);
    for addr in addrs.into_iter().chain([extra]) {
        // SAFETY: each pointer is freed once with its count.
        unsafe { t.deallocate(NonNull::new(addr as *mut u64).unwrap(), 4) };
    }
    assert!(t.live_chunks().is_empty());
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0);
    assert!(format!("{t:?}").contains("threads: 1"), "{t:?}");
}

#[test]
fn a_tracker_over_a_pool_catches_the_double_free_the_pool_cannot() {
    let pool = Arc::new(tensormem::PoolAllocator::builder(Arc::new(SystemAllocator::new())).build().unwrap());
    let t = TrackingAllocator::new(pool.clone());
    let p = t.allocate::<u8>(100).unwrap();
    // SAFETY: first free.
    unsafe { t.deallocate(p, 100) };
    // SAFETY: deliberately a double free; the tracker refuses it before the pool sees it.
    let msg = panic_message(|| unsafe { t.deallocate(p, 100) });
    assert!(msg.contains("already freed"), "{msg}");
    assert_eq!(pool.pool_stats().thread_cached_buffers, 1, "the pool holds the buffer once, not twice");
}

#[test]
fn a_tracked_bfc_keeps_its_memory_dump_in_snapshots() {
    let bfc = Arc::new(tensormem::BfcAllocator::builder().memory_limit(1 << 20).build().unwrap());
    let tracked = TrackingAllocator::new(bfc);
    let p = tracked.allocate::<u8>(1000).unwrap();
    let bfc = tracked.backend_as::<tensormem::BfcAllocator>().expect("the BFC is reached through the tracker");
    let dump = bfc.memory_dump();
    assert!(tracked.backend_as::<tensormem::PoolAllocator>().is_none(), "a BFC is no pool");
    assert_eq!(dump.stats.bytes_in_use, 1024);
    assert_eq!(tracked.snapshot_live_chunks().unwrap().len(), 1);
    // SAFETY: freed once with its count.
    unsafe { tracked.deallocate(p, 1000) };
}
