//! Memory budgets in tests: a leak check's peak bytes and `testing::assert_peak_below`, exact
//! and undisturbed by the other tests of this binary, which run on parallel threads.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::{Arc, Barrier};
use std::thread;

use tensormem::testing::{LeakCheck, assert_no_leaks, assert_peak_below};
use tensormem::{AllocatorExt, BfcAllocator, PoolAllocator, SystemAllocator, TrackingAllocator};

fn take(cpu: &SystemAllocator, n: usize) -> NonNull<u8> {
    cpu.allocate::<u8>(n).unwrap()
}

fn give(cpu: &SystemAllocator, p: NonNull<u8>, n: usize) {
    // SAFETY: every caller passes a block from `take(cpu, n)` with the same `n`, freed once.
    unsafe { cpu.deallocate(p, n) }
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned())).unwrap()
}

#[test]
fn the_peak_is_the_most_held_at_once_and_survives_the_frees() {
    let cpu = SystemAllocator::new();
    let check = LeakCheck::start();
    assert_eq!(check.peak_bytes(), 0);
    let a = take(&cpu, 1000);
    let b = take(&cpu, 500);
    assert_eq!(check.peak_bytes(), 1500);
    give(&cpu, a, 1000);
    let c = take(&cpu, 200); // 700 held: below the peak
    assert_eq!(check.live().peak_bytes, 1500, "live() reports the peak so far");
    let d = take(&cpu, 900); // 1600 held: a new peak
    give(&cpu, b, 500);
    give(&cpu, c, 200);
    give(&cpu, d, 900);
    let report = check.finish();
    assert!(report.is_empty(), "{report}");
    assert_eq!((report.peak_bytes, report.peak_bytes()), (1600, 1600));
}

#[test]
fn requested_sizes_count_whatever_the_allocator_rounds_to() {
    let system = Arc::new(SystemAllocator::new());
    let bfc = Arc::new(BfcAllocator::builder().memory_limit(1 << 24).build().unwrap());
    let pool = Arc::new(PoolAllocator::builder(system.clone()).build().unwrap());
    let tracked = TrackingAllocator::new(bfc.clone());
    for (name, a) in [
        ("bfc", bfc as Arc<dyn tensormem::Allocator>),
        ("pool", pool as Arc<dyn tensormem::Allocator>),
        ("tracked bfc", Arc::new(tracked)),
    ] {
        let check = LeakCheck::start();
        let p = a.allocate::<u8>(1000).unwrap(); // rounded up to 1024 (bfc) or a size class (pool)
        let q = a.allocate::<u8>(3).unwrap();
        // SAFETY: `p` and `q` came from `allocate::<u8>` on `a` with these counts.
        unsafe {
            a.deallocate(p, 1000);
            a.deallocate(q, 3);
        }
        assert_eq!(check.finish().peak_bytes, 1003, "{name}");
    }
}

#[test]
fn nested_checks_each_see_their_own_peak() {
    let cpu = SystemAllocator::new();
    let outer = LeakCheck::start();
    let before = take(&cpu, 4096); // the outer check's only
    let inner = LeakCheck::start();
    let x = take(&cpu, 100); // both checks'
    give(&cpu, x, 100);
    let inner = inner.finish();
    give(&cpu, before, 4096);
    let outer = outer.finish();
    assert_eq!((inner.peak_bytes, outer.peak_bytes), (100, 4196));
    assert!(inner.is_empty() && outer.is_empty());
}

#[test]
fn a_block_from_before_the_check_freed_inside_it_changes_nothing() {
    let cpu = SystemAllocator::new();
    let old = take(&cpu, 1 << 20);
    let check = LeakCheck::start();
    give(&cpu, old, 1 << 20);
    let p = take(&cpu, 64);
    give(&cpu, p, 64);
    assert_eq!(check.finish().peak_bytes, 64, "the earlier block is not the check's to take off");
}

#[test]
fn threads_that_enter_the_check_count_and_frees_on_other_threads_are_seen() {
    let check = LeakCheck::start();
    let handle = check.handle();
    // Two helpers each hold 3000 bytes at the same time (the barrier), then the main thread
    // frees them: the check's peak is the sum, 6000.
    let barrier = Arc::new(Barrier::new(2));
    let blocks: Vec<usize> = (0..2)
        .map(|_| {
            let (handle, barrier) = (handle.clone(), barrier.clone());
            thread::spawn(move || {
                let _entered = handle.enter();
                let p = SystemAllocator::new().allocate::<u8>(3000).unwrap();
                barrier.wait();
                p.as_ptr() as usize
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(check.peak_bytes(), 6000);
    let cpu = SystemAllocator::new();
    for p in blocks {
        give(&cpu, NonNull::new(p as *mut u8).unwrap(), 3000);
    }
    let report = check.finish();
    assert!(report.is_empty(), "freed on the main thread: {report}");
    assert_eq!(report.peak_bytes, 6000);
}

#[test]
fn parallel_checks_on_other_threads_do_not_see_each_other() {
    // Eight threads, each its own budget, all holding their blocks at the same moment.
    let barrier = Arc::new(Barrier::new(8));
    let peaks: Vec<(usize, u64)> = (1..=8)
        .map(|t| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                let cpu = SystemAllocator::new();
                let check = LeakCheck::start();
                let p = take(&cpu, t * 1000);
                barrier.wait();
                give(&cpu, p, t * 1000);
                (t * 1000, check.finish().peak_bytes)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for (size, peak) in peaks {
        assert_eq!(peak, size as u64);
    }
}

#[test]
fn assert_peak_below_passes_under_the_budget_and_returns_the_value() {
    let cpu = SystemAllocator::new();
    let out = assert_peak_below(2001, || {
        let a = take(&cpu, 2000);
        give(&cpu, a, 2000);
        let b = take(&cpu, 1500);
        give(&cpu, b, 1500);
        "done"
    });
    assert_eq!(out, "done");
    // Nothing allocated: a peak of 0 is below any positive budget.
    assert_eq!(assert_peak_below(1, || 7), 7);
}

#[test]
fn assert_peak_below_fails_at_or_over_the_budget_naming_both() {
    let cpu = SystemAllocator::new();
    for budget in [2000, 1999, 0] {
        let e = catch_unwind(AssertUnwindSafe(|| {
            assert_peak_below(budget, || {
                let a = take(&cpu, 2000);
                give(&cpu, a, 2000);
            })
        }))
        .expect_err("a peak of 2000 bytes is not below the budget");
        let msg = panic_text(e);
        assert!(msg.contains("2000 bytes") && msg.contains(&format!("({budget} bytes)")), "{msg}");
    }
}

#[test]
fn a_budget_and_a_leak_check_combine() {
    let cpu = SystemAllocator::new();
    // Within budget, and nothing left live.
    assert_no_leaks(|| {
        assert_peak_below(1 << 16, || {
            let a = take(&cpu, 1 << 15);
            give(&cpu, a, 1 << 15);
        })
    });
    // Within budget but leaking: the budget passes, the leak check catches it.
    let outer = LeakCheck::start();
    let leaked = assert_peak_below(1 << 16, || take(&cpu, 100));
    let report = outer.finish();
    assert_eq!((report.leaks.len(), report.peak_bytes), (1, 100));
    give(&cpu, leaked, 100);
}
