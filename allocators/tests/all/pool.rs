//! PoolAllocator: free lists by rounded size, LRU eviction, auto-resize, bad frees.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use proptest::prelude::*;
use tensormem_allocators::{
    AllocationAttributes, Allocator, AllocatorExt, BuildError, PoolAllocator, PoolStats, SizeRounding, SystemAllocator,
};

fn pool(limit: u64) -> (Arc<SystemAllocator>, PoolAllocator) {
    let inner = Arc::new(SystemAllocator::new());
    let p = PoolAllocator::builder(inner.clone()).size_limit(limit).auto_resize(false).build().unwrap();
    (inner, p)
}

#[test]
fn freed_buffers_are_reused_by_rounded_size() {
    let (inner, p) = pool(1 << 20);
    let a = p.allocate::<u8>(600).unwrap();
    assert_eq!(p.stats().unwrap().bytes_in_use, 1024, "600 bytes round to the 1 KiB class");
    // SAFETY: freed once with its count.
    unsafe { p.deallocate(a, 600) };
    let b = p.allocate::<u8>(1000).unwrap();
    assert_eq!(a, b, "same 1 KiB class");
    let c = p.allocate::<u8>(1100).unwrap();
    assert_ne!(c, b, "a 2 KiB class buffer is new");
    let s = p.pool_stats();
    assert_eq!((s.hits, s.misses, s.thread_cached_buffers), (1, 2, 0));
    assert_eq!(inner.stats().unwrap().num_allocs, 2);
    // SAFETY: freed once with their counts.
    unsafe {
        p.deallocate(b, 1000);
        p.deallocate(c, 1100);
    }
    let st = p.stats().unwrap();
    assert_eq!((st.bytes_in_use, st.bytes_reserved, st.largest_free_block_bytes), (0, 3072, Some(2048)));
    assert_eq!(inner.stats().unwrap().bytes_in_use, 3072, "cached buffers stay allocated in the inner allocator");
    assert_eq!(p.pool_stats().thread_cached_bytes, 3072, "small sizes wait in this thread's cache");
    p.trim();
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0);
    let s = p.pool_stats();
    assert_eq!((s.cached_bytes, s.thread_cached_bytes), (0, 0));
}

#[test]
fn a_threads_cache_goes_to_the_shared_pool_when_it_exits() {
    let (inner, p) = pool(1 << 20);
    let p = Arc::new(p);
    let q = Arc::clone(&p);
    std::thread::spawn(move || {
        let a = q.allocate::<u8>(4000).unwrap();
        // SAFETY: freed once with its count.
        unsafe { q.deallocate(a, 4000) };
        assert_eq!(q.pool_stats().thread_cached_buffers, 1);
    })
    .join()
    .unwrap();
    let s = p.pool_stats();
    assert_eq!((s.cached_buffers, s.thread_cached_buffers), (1, 0));
    // This thread gets it from the shared pool: a hit, not a miss.
    let b = p.allocate::<u8>(4096).unwrap();
    assert_eq!((p.pool_stats().hits, p.pool_stats().misses), (1, 1));
    // SAFETY: freed once with its count.
    unsafe { p.deallocate(b, 4096) };
    drop(p);
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0, "dropping the pool returned everything");
}

#[test]
fn alignment_is_part_of_the_class() {
    let (_, p) = pool(1 << 20);
    let l8 = Layout::from_size_align(512, 8).unwrap();
    let l4k = Layout::from_size_align(512, 4096).unwrap();
    let a = p.allocate_raw(l8, &AllocationAttributes::default()).unwrap();
    // SAFETY: freed once with its layout.
    unsafe { p.deallocate_raw(a, l8) };
    let b = p.allocate_raw(l4k, &AllocationAttributes::default()).unwrap();
    assert_eq!(b.as_ptr() as usize % 4096, 0);
    assert_eq!(p.pool_stats().hits, 0, "an 8-aligned buffer must not serve a 4096-aligned request");
    // SAFETY: freed once with its layout.
    unsafe { p.deallocate_raw(b, l4k) };
}

const BIG: usize = 128 << 10; // above the thread caches' largest class

#[test]
fn least_recently_freed_buffers_are_evicted_past_the_limit() {
    let (inner, p) = pool(2 * BIG as u64);
    let bufs: Vec<NonNull<u8>> = (0..4).map(|_| p.allocate::<u8>(BIG).unwrap()).collect();
    for &b in &bufs {
        // SAFETY: freed once with its count.
        unsafe { p.deallocate(b, BIG) };
    }
    let s = p.pool_stats();
    assert_eq!((s.cached_buffers, s.cached_bytes, s.evictions), (2, 2 * BIG as u64, 2));
    assert_eq!(inner.stats().unwrap().bytes_in_use, 2 * BIG as u64);
    // The two most recently freed stay: reusing them gives back bufs[3] then bufs[2].
    let x = p.allocate::<u8>(BIG).unwrap();
    let y = p.allocate::<u8>(BIG).unwrap();
    assert_eq!((x, y), (bufs[3], bufs[2]));
    // A buffer larger than the whole limit is not cached at all.
    let big = p.allocate::<u8>(4 * BIG).unwrap();
    // SAFETY: freed once with their counts.
    unsafe {
        p.deallocate(big, 4 * BIG);
        p.deallocate(x, BIG);
        p.deallocate(y, BIG);
    }
    assert_eq!(p.pool_stats().cached_bytes, 2 * BIG as u64);
    assert_eq!(p.stats().unwrap().bytes_reserved, 2 * BIG as u64);
}

#[test]
fn frequent_evictions_grow_the_limit_as_tensorflow_does() {
    let inner = Arc::new(SystemAllocator::new());
    let p = PoolAllocator::builder(inner).size_limit(BIG as u64).build().unwrap();
    // Working set of 4 big buffers against a pool of one: every round evicts 3 and misses 3.
    let round = || {
        let bufs: Vec<NonNull<u8>> = (0..4).map(|_| p.allocate::<u8>(BIG).unwrap()).collect();
        for b in bufs {
            // SAFETY: freed once with its count.
            unsafe { p.deallocate(b, BIG) };
        }
    };
    // TensorFlow checks every 1000 evictions: nothing grows before the first check...
    for _ in 0..333 {
        round();
    }
    assert_eq!(p.pool_stats().size_limit, BIG as u64, "{:?}", p.pool_stats());
    round();
    // ...then the limit grows by 10%, and the window restarts.
    assert_eq!(p.pool_stats().size_limit, (BIG as f64 * 1.1) as u64, "{:?}", p.pool_stats());
    let mut rounds = 334;
    while p.pool_stats().size_limit < 4 * BIG as u64 {
        round();
        rounds += 1;
        assert!(rounds < 100_000, "the limit stopped growing: {:?}", p.pool_stats());
    }
    // 1.1^15 > 4: 15 checks of 1000 evictions each; a round evicts 3 buffers while one fits (8
    // checks), 2 while two fit (4 checks), 1 while three fit (3 checks): about 7,700 rounds.
    assert!((7000..8500).contains(&rounds), "{rounds} rounds");
    // Once it grew, the working set fits and the pool stops evicting.
    let evictions = p.pool_stats().evictions;
    for _ in 0..50 {
        round();
    }
    assert_eq!(p.pool_stats().evictions, evictions);
}

#[test]
fn release_cached_empties_the_caches_of_threads_that_are_still_alive() {
    let inner = Arc::new(SystemAllocator::new());
    let p = Arc::new(PoolAllocator::builder(inner.clone()).build().unwrap());
    let (parked_tx, parked_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let q = Arc::clone(&p);
    let worker = std::thread::spawn(move || {
        let bufs: Vec<_> = (0..10).map(|_| q.allocate::<u8>(4000).unwrap()).collect();
        for b in bufs {
            // SAFETY: freed once with its count.
            unsafe { q.deallocate(b, 4000) };
        }
        parked_tx.send(q.pool_stats().thread_cached_buffers).unwrap();
        go_rx.recv().unwrap(); // alive and idle while the main thread releases
        // Its cache was emptied; it keeps working.
        let b = q.allocate::<u8>(4000).unwrap();
        // SAFETY: freed once with its count.
        unsafe { q.deallocate(b, 4000) };
    });
    assert_eq!(parked_rx.recv().unwrap(), 10);
    assert_eq!(inner.stats().unwrap().bytes_in_use, 10 * 4096);
    assert_eq!(p.release_cached(), 10 * 4096, "the other thread's 10 buffers went back");
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0);
    let s = p.pool_stats();
    assert_eq!((s.thread_cached_buffers, s.cached_buffers), (0, 0));
    assert_eq!(p.stats().unwrap().bytes_reserved, 0);
    go_tx.send(()).unwrap();
    worker.join().unwrap();
}

#[test]
fn release_cached_while_other_threads_allocate_loses_and_corrupts_nothing() {
    let inner = Arc::new(SystemAllocator::new());
    let p = Arc::new(PoolAllocator::builder(inner.clone()).build().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2u8)
        .map(|t| {
            let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
                let mut i = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || i < 10_000 {
                    let n = 1 + (i * 7919 + usize::from(t)) % 60_000;
                    let q = p.allocate::<u8>(n).unwrap();
                    // SAFETY: `q` holds `n` bytes.
                    unsafe { q.as_ptr().write_bytes(t + 1, n) };
                    live.push((q, n));
                    if live.len() > 8 {
                        let (q, n) = live.swap_remove(i % live.len());
                        // SAFETY: only this thread wrote it, and nobody else was handed it.
                        let bytes = unsafe { std::slice::from_raw_parts(q.as_ptr(), n) };
                        assert!(bytes.iter().all(|&b| b == t + 1), "a live buffer was handed out twice");
                        // SAFETY: freed once with its count.
                        unsafe { p.deallocate(q, n) };
                    }
                    i += 1;
                }
                for (q, n) in live {
                    // SAFETY: freed once with its count.
                    unsafe { p.deallocate(q, n) };
                }
            })
        })
        .collect();
    for _ in 0..200 {
        p.release_cached();
        std::thread::yield_now();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    p.release_cached();
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0, "every buffer went back exactly once");
    assert_eq!(p.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn large_requests_go_to_an_expandable_bfc_that_merges_them() {
    let inner = Arc::new(SystemAllocator::new());
    let p = PoolAllocator::builder(inner.clone()).build().unwrap();
    let (threshold, large) = p.large_allocator().expect("routing is on over an unlimited inner allocator");
    assert_eq!((threshold, large.name()), (1 << 20, "pool.large"));
    let a = p.allocate::<u8>(3 << 20).unwrap();
    let b = p.allocate::<u8>((5 << 20) + 100).unwrap();
    assert_eq!(inner.stats().unwrap().bytes_in_use, 0, "nothing large came from the inner allocator");
    let s = p.stats().unwrap();
    assert_eq!(s.bytes_in_use, (3 << 20) + (5 << 20) + 256, "large requests count their 256-byte multiple");
    assert_eq!(p.pool_stats().large_allocations, 2);
    // SAFETY: freed once with their counts.
    unsafe {
        p.deallocate(a, 3 << 20);
        p.deallocate(b, (5 << 20) + 100);
    }
    // The two freed blocks merged: a 7 MiB request reuses their memory without growing.
    let reserved = p.stats().unwrap().bytes_reserved;
    let c = p.allocate::<u8>(7 << 20).unwrap();
    assert_eq!(c, a);
    assert_eq!(p.stats().unwrap().bytes_reserved, reserved);
    // SAFETY: freed once with its count.
    unsafe { p.deallocate(c, 7 << 20) };
    assert!(p.release_cached() >= 8 << 20);
    assert_eq!(p.stats().unwrap().bytes_reserved, 0);
    // Routing off: TensorFlow's pool, power-of-two classes from the inner allocator.
    let tf = PoolAllocator::builder(inner.clone()).large_threshold(None).build().unwrap();
    assert!(tf.large_allocator().is_none());
    let d = tf.allocate::<u8>(3 << 20).unwrap();
    assert_eq!(inner.stats().unwrap().bytes_in_use, 4 << 20);
    // SAFETY: freed once with its count.
    unsafe { tf.deallocate(d, 3 << 20) };
}

#[test]
fn a_limited_inner_allocator_keeps_its_limit_for_large_requests() {
    let inner = Arc::new(SystemAllocator::builder().bytes_limit(4 << 20).build().unwrap());
    let p = PoolAllocator::builder(inner.clone()).build().unwrap();
    assert!(p.large_allocator().is_none());
    let err = p.allocate::<u8>(5 << 20).unwrap_err();
    assert_eq!(err.kind(), tensormem_allocators::AllocErrorKind::LimitExceeded);
}

#[test]
fn an_exhausted_inner_allocator_is_retried_after_flushing_every_cache() {
    // 64 KiB of room: four 16 KiB buffers fill it, and they wait in this thread's cache once freed.
    let inner = Arc::new(SystemAllocator::builder().bytes_limit(64 << 10).build().unwrap());
    let p = PoolAllocator::builder(inner.clone()).build().unwrap();
    let bufs: Vec<_> = (0..4).map(|_| p.allocate::<u8>(16 << 10).unwrap()).collect();
    for b in bufs {
        // SAFETY: freed once with its count.
        unsafe { p.deallocate(b, 16 << 10) };
    }
    assert_eq!(p.pool_stats().thread_cached_buffers, 4);
    // A 32 KiB request misses; the inner allocator is full of cached 16 KiB buffers.
    let big = p.allocate::<u8>(32 << 10).unwrap();
    assert_eq!(p.pool_stats().thread_cached_buffers, 0, "the cache was flushed to make room");
    assert_eq!(inner.stats().unwrap().bytes_in_use, 32 << 10);
    // SAFETY: freed once with its count.
    unsafe { p.deallocate(big, 32 << 10) };
}

#[test]
fn other_roundings_and_bad_options() {
    let inner: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    let m = PoolAllocator::builder(inner.clone()).rounding(SizeRounding::Multiple(256)).build().unwrap();
    let a = m.allocate::<u8>(300).unwrap();
    assert_eq!(m.stats().unwrap().bytes_in_use, 512);
    // SAFETY: freed once with its count.
    unsafe { m.deallocate(a, 300) };
    let e = PoolAllocator::builder(inner.clone()).rounding(SizeRounding::Exact).build().unwrap();
    let b = e.allocate::<u8>(300).unwrap();
    assert_eq!(e.stats().unwrap().bytes_in_use, 300);
    // SAFETY: freed once with its count.
    unsafe { e.deallocate(b, 300) };
    let err = PoolAllocator::builder(inner).rounding(SizeRounding::Multiple(0)).build().unwrap_err();
    assert!(matches!(err, BuildError::InvalidOption { option: "rounding", .. }));
    assert_eq!(err.to_string(), "allocator 'pool': invalid rounding: a multiple of 0 bytes");
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_match_the_model(
        ops in prop::collection::vec(prop_oneof![(1usize..70_000).prop_map(Op::Alloc), any::<usize>().prop_map(Op::Free)], 1..300),
        limit in 0u64..(1 << 18),
    ) {
        let inner = Arc::new(SystemAllocator::new());
        let p = PoolAllocator::builder(inner.clone()).size_limit(limit).build().unwrap();
        let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
        let mut peak = 0u64;
        for op in ops {
            match op {
                Op::Alloc(n) => {
                    let q = p.allocate::<u8>(n).unwrap();
                    // SAFETY: `q` holds `n` bytes.
                    unsafe { q.as_ptr().write_bytes(0x5A, n) };
                    live.push((q, n));
                }
                Op::Free(i) if !live.is_empty() => {
                    let (q, n) = live.swap_remove(i % live.len());
                    // SAFETY: nobody else wrote it; freed once with its count.
                    unsafe {
                        prop_assert_eq!(q.as_ptr().add(n - 1).read(), 0x5A);
                        p.deallocate(q, n);
                    }
                }
                Op::Free(_) => {}
            }
            let in_use: u64 = live.iter().map(|&(_, n)| n.next_power_of_two() as u64).sum();
            peak = peak.max(in_use);
            let s = p.stats().unwrap();
            let ps: PoolStats = p.pool_stats();
            prop_assert_eq!(s.bytes_in_use, in_use);
            prop_assert_eq!(s.peak_bytes_in_use, peak);
            prop_assert!(ps.cached_bytes <= ps.size_limit);
            prop_assert_eq!(s.bytes_reserved, in_use + ps.cached_bytes + ps.thread_cached_bytes);
            prop_assert_eq!(inner.stats().unwrap().bytes_in_use, s.bytes_reserved);
            let mut spans: Vec<(usize, usize)> = live.iter().map(|&(q, n)| (q.as_ptr() as usize, n)).collect();
            spans.sort();
            for w in spans.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0, "live buffers overlap");
            }
        }
        for (q, n) in live {
            // SAFETY: freed once with its count.
            unsafe { p.deallocate(q, n) };
        }
        drop(p);
        prop_assert_eq!(inner.stats().unwrap().bytes_in_use, 0, "dropping the pool returned everything");
    }
}
