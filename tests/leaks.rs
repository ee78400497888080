//! Leak checks, scopes and the scoped default allocator, on the real allocators.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use tensormem::allocators::observe::Action;
use tensormem::history::{self, HistoryError, HistoryOptions};
use tensormem::testing::{LeakCheck, assert_no_leaks};
use tensormem::{
    Allocator, AllocatorExt, AllocatorRegistry, BfcAllocator, PoolAllocator, SystemAllocator, TrackingAllocator, scope,
    with_default_allocator,
};
use tensormem_tensor::{DType, SafeTensors, Tensor, TensorOptions, save_safetensors};

/// A fresh directory, removed with everything in it when the returned guard drops.
fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("tm-leaks-{tag}-")).tempdir().unwrap()
}

/// An inference engine's leak test: three tensors forgotten, two of which went to the
/// registry's default allocator (a kernel output whose first input is a mapped weight, and a
/// scalar made without options). All three are reported, with sizes, tags and tensor shapes.
#[test]
fn three_planted_leaks_are_all_reported() {
    let dir_guard = tempdir("planted");
    let dir = dir_guard.path();
    let path = dir.join("w.safetensors");
    let w = Tensor::ones(&[4, 8], DType::F32).unwrap();
    save_safetensors(&path, &[("w", &w)], None).unwrap();
    // SAFETY: the test owns the file and does not change it.
    let file = unsafe { SafeTensors::open(&path) }.unwrap();
    let weight = file.tensor("w").unwrap();
    let tracker = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));

    let check = LeakCheck::start();
    {
        let _engine = scope("engine");
        let x = {
            let _s = scope("embed");
            Tensor::ones(&[4, 8], TensorOptions::new().allocator(tracker.clone())).unwrap()
        };
        let _s = scope("decoder.layer0");
        let mapped_out = weight.add(&x).unwrap(); // first input mapped: registry default
        let scalar = Tensor::scalar(2.5, DType::F64).unwrap(); // no options: registry default
        scalar.materialize_for_test();
        let fine = x.mul(&mapped_out).unwrap(); // dropped below: not a leak
        drop(fine);
        std::mem::forget(x);
        std::mem::forget(mapped_out);
        std::mem::forget(scalar);
    }
    let report = check.finish();
    assert_eq!(report.leaks.len(), 3, "{report}");
    let sizes: Vec<usize> = report.leaks.iter().map(|l| l.requested_size).collect();
    assert_eq!(sizes, vec![128, 128, 8], "{report}");
    let tags: Vec<&str> = report.leaks.iter().map(|l| l.tag.as_deref().unwrap_or("-")).collect();
    assert_eq!(tags, vec!["engine/embed", "engine/decoder.layer0", "engine/decoder.layer0"]);
    assert_eq!(report.leaks[0].tensor.as_deref(), Some("tensor f32 [4, 8]"));
    assert_eq!(report.leaks[1].tensor.as_deref(), Some("tensor f32 [4, 8]"));
    assert_eq!(report.leaks[2].tensor.as_deref(), Some("tensor f64 []"));
    assert_eq!(report.leaks[0].allocator, tracker.name());
    let default_name = AllocatorRegistry::global().get().name().to_owned();
    assert_eq!(report.leaks[1].allocator, default_name);
    assert!(report.leaks.windows(2).all(|w| w[0].allocation_id < w[1].allocation_id));
    let table = report.to_string();
    assert!(table.starts_with("3 leaked allocation(s), 264 B requested (peak "), "{table}");
    // x, mapped_out, the scalar and `fine` (dropped) were all live at once.
    assert_eq!(report.peak_bytes, 128 + 128 + 8 + 128, "{report}");
    assert!(table.contains("engine/decoder.layer0") && table.contains("tensor f64 []"), "{table}");
    let json = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<tensormem::testing::LeakReport>(&json).unwrap(), report);
}

trait MaterializeForTest {
    fn materialize_for_test(&self);
}
impl MaterializeForTest for Tensor {
    fn materialize_for_test(&self) {
        self.storage().materialize().unwrap();
    }
}

#[test]
fn views_and_clones_all_dropped_report_nothing() {
    let pool = Arc::new(PoolAllocator::builder(Arc::new(SystemAllocator::new())).build().unwrap());
    let report = {
        let check = LeakCheck::start();
        let a = Tensor::randn(&[16, 16], TensorOptions::new().allocator(pool.clone()).seed(1)).unwrap();
        let v = a.t().unwrap();
        let c = a.clone();
        let n = v.narrow(0, 2, 4).unwrap();
        let s = &c.narrow(0, 2, 4).unwrap() + &n.contiguous().unwrap();
        drop((a, v, c, n, s));
        check.finish()
    };
    assert!(report.is_empty(), "{report}");
    assert_eq!(report.to_string(), "no leaks\n");
}

#[test]
fn every_backend_and_decorator_is_seen() {
    let bfc = Arc::new(BfcAllocator::builder().memory_limit(1 << 20).build().unwrap());
    let pool = PoolAllocator::builder(Arc::new(SystemAllocator::new())).build().unwrap();
    let tracked = TrackingAllocator::new(bfc.clone());
    let report = {
        let check = LeakCheck::start();
        let a = bfc.allocate::<u8>(100).unwrap();
        let b = pool.allocate::<u8>(3000).unwrap();
        let c = tracked.allocate::<u8>(10).unwrap();
        let d = pool.allocate::<u8>(5).unwrap();
        // SAFETY: `d` came from `pool.allocate::<u8>(5)`.
        unsafe { pool.deallocate(d, 5) };
        let r = check.finish();
        // SAFETY: each came from the matching `allocate` call above.
        unsafe {
            bfc.deallocate(a, 100);
            pool.deallocate(b, 3000);
            tracked.deallocate(c, 10);
        }
        r
    };
    let got: Vec<(usize, usize)> = report.leaks.iter().map(|l| (l.requested_size, l.allocated_size)).collect();
    // BFC rounds to 256 B; the pool to its power-of-two class; the tracker forwards to BFC (reported once).
    assert_eq!(got, vec![(100, 256), (3000, 4096), (10, 256)], "{report}");
    assert_eq!(report.leaks[0].allocator, "bfc");
    assert_eq!(report.leaks[1].allocator, "pool");
}

#[test]
fn a_leak_on_a_thread_that_entered_the_check_is_caught_and_freed_elsewhere_is_not() {
    let cpu = Arc::new(SystemAllocator::new());
    let check = LeakCheck::start();
    let handle = check.handle();
    let (tx, rx) = mpsc::channel();
    let worker = {
        let cpu = cpu.clone();
        let handle = handle.clone();
        thread::spawn(move || {
            let _g = handle.enter();
            let _s = scope("worker");
            let leaked = cpu.allocate::<u8>(777).unwrap();
            let shipped = cpu.allocate::<u8>(555).unwrap();
            tx.send(shipped.as_ptr() as usize).unwrap();
            leaked.as_ptr() as usize
        })
    };
    let leaked = worker.join().unwrap();
    let shipped = rx.recv().unwrap();
    // Freed on this thread, allocated on the worker: no longer a leak.
    // SAFETY: the worker allocated `shipped` with `allocate::<u8>(555)` on `cpu` and gave it to us.
    unsafe { cpu.deallocate(std::ptr::NonNull::new(shipped as *mut u8).unwrap(), 555) };
    let report = check.finish();
    assert!(!handle.is_active());
    assert_eq!(report.leaks.len(), 1, "{report}");
    assert_eq!((report.leaks[0].address, report.leaks[0].requested_size), (leaked, 777));
    assert_eq!(report.leaks[0].tag.as_deref(), Some("worker"));
    // SAFETY: the worker allocated `leaked` with `allocate::<u8>(777)` on `cpu`.
    unsafe { cpu.deallocate(std::ptr::NonNull::new(leaked as *mut u8).unwrap(), 777) };
    // Entering a finished check does nothing.
    let _g = handle.enter();
    let p = cpu.allocate::<u8>(1).unwrap();
    // SAFETY: `p` came from `allocate::<u8>(1)` on `cpu`.
    unsafe { cpu.deallocate(p, 1) };
}

/// Runs with the other tests of this file in parallel: their leaks must never show here, and
/// this test's leak thread must never show there.
#[test]
fn concurrent_tests_do_not_see_each_other() {
    let cpu = Arc::new(SystemAllocator::new());
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // Another "test": a thread with its own check that leaks while ours runs.
    let other = {
        let cpu = cpu.clone();
        thread::spawn(move || {
            let check = LeakCheck::start();
            let p = cpu.allocate::<u8>(4242).unwrap();
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let r = check.finish();
            // SAFETY: `p` came from `allocate::<u8>(4242)` on `cpu`.
            unsafe { cpu.deallocate(p, 4242) };
            r
        })
    };
    ready_rx.recv().unwrap();
    let mine = assert_no_leaks(|| {
        let p = cpu.allocate::<u64>(8).unwrap();
        // SAFETY: `p` came from `allocate::<u64>(8)` on `cpu`.
        unsafe { cpu.deallocate(p, 8) };
        7
    });
    assert_eq!(mine, 7);
    go_tx.send(()).unwrap();
    let theirs = other.join().unwrap();
    assert_eq!(theirs.leaks.iter().map(|l| l.requested_size).collect::<Vec<_>>(), vec![4242]);
}

#[test]
fn nested_checks_inner_leaks_are_also_the_outers() {
    let cpu = SystemAllocator::new();
    let outer = LeakCheck::start();
    let a = cpu.allocate::<u8>(11).unwrap();
    let inner = LeakCheck::start();
    let b = cpu.allocate::<u8>(22).unwrap();
    let inner_report = inner.finish();
    let c = cpu.allocate::<u8>(33).unwrap();
    let outer_live = outer.live();
    // SAFETY: each came from the matching `allocate` call on `cpu`.
    unsafe {
        cpu.deallocate(a, 11);
        cpu.deallocate(c, 33);
    }
    let outer_report = outer.finish();
    let sizes = |r: &tensormem::testing::LeakReport| r.leaks.iter().map(|l| l.requested_size).collect::<Vec<_>>();
    assert_eq!(sizes(&inner_report), vec![22]);
    assert_eq!(sizes(&outer_live), vec![11, 22, 33]);
    assert_eq!(sizes(&outer_report), vec![22]);
    // SAFETY: `b` came from `allocate::<u8>(22)` on `cpu`.
    unsafe { cpu.deallocate(b, 22) };
}

#[test]
fn dropping_an_armed_check_with_leaks_panics_and_disarm_does_not() {
    let cpu = Arc::new(SystemAllocator::new());
    let c2 = cpu.clone();
    let panicked = thread::spawn(move || {
        let check = LeakCheck::start();
        let _leaked = c2.allocate::<u8>(99).unwrap();
        drop(check);
    })
    .join();
    let msg = panicked.unwrap_err();
    let msg = msg.downcast_ref::<String>().unwrap();
    assert!(msg.contains("leak check dropped with leaks") && msg.contains("99"), "{msg}");

    let check = LeakCheck::start();
    let p = cpu.allocate::<u8>(5).unwrap();
    check.disarm();
    // SAFETY: `p` came from `allocate::<u8>(5)` on `cpu`.
    unsafe { cpu.deallocate(p, 5) };

    let r = std::panic::catch_unwind(|| assert_no_leaks(|| SystemAllocator::new().allocate::<u8>(3).map(|_| ())));
    assert!(r.is_err());
}

#[test]
fn with_default_allocator_routes_every_default_use() {
    let tracker = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
    let t = with_default_allocator(tracker.clone(), || {
        let a = Tensor::ones(&[8], DType::F32).unwrap();
        let b = Tensor::scalar(1.0, DType::F32).unwrap();
        let c = &a + &b;
        assert!(Arc::ptr_eq(&AllocatorRegistry::global().get(), &(tracker.clone() as Arc<dyn tensormem::Allocator>)));
        c
    });
    // a, b and c were allocated by the tracker; a and b are gone, c lives.
    assert_eq!(tracker.live_chunks().len(), 1);
    assert_eq!(tracker.sizes().total_bytes, 32 + 4 + 32);
    drop(t);
    assert_eq!(tracker.live_chunks().len(), 0);
    // Outside the closure the registry's own choice is back, and other threads never saw it.
    assert!(!Arc::ptr_eq(&AllocatorRegistry::global().get(), &(tracker.clone() as Arc<dyn tensormem::Allocator>)));
    let local = tensormem::AllocatorRegistry::new();
    let seen = with_default_allocator(tracker.clone(), || local.try_get().map(|a| a.name().to_owned()));
    assert!(seen.is_err(), "a registry of one's own is not overridden");
}

#[test]
fn scopes_nest_tag_tracking_chunks_and_tag_stats() {
    let tracker = TrackingAllocator::new(Arc::new(SystemAllocator::new()));
    assert_eq!(tensormem::current_scope(), None);
    let p = {
        let _a = scope("t.encoder.layer3");
        let _b = scope("attn");
        assert_eq!(tensormem::current_scope().as_deref(), Some("t.encoder.layer3/attn"));
        tracker.allocate::<u8>(1000).unwrap()
    };
    assert_eq!(tensormem::current_scope(), None);
    let chunk = tracker.chunk(p).unwrap();
    assert_eq!(chunk.tag.map(|t| t.as_str()), Some("t.encoder.layer3/attn"));
    assert_eq!(tracker.live_chunks()[0].tag.map(|t| t.to_string()).as_deref(), Some("t.encoder.layer3/attn"));
    let stats = tensormem::tag_stats().into_iter().find(|t| t.tag == "t.encoder.layer3/attn").unwrap();
    assert_eq!((stats.bytes_in_use, stats.num_allocs, stats.num_frees), (1000, 1, 0));
    // SAFETY: `p` came from `allocate::<u8>(1000)` on `tracker`.
    unsafe { tracker.deallocate(p, 1000) };
    let stats = tensormem::tag_stats().into_iter().find(|t| t.tag == "t.encoder.layer3/attn").unwrap();
    assert_eq!((stats.bytes_in_use, stats.peak_bytes_in_use, stats.num_frees), (0, 1000, 1));
}

#[test]
fn a_scope_guard_dropped_on_another_thread_closes_its_scope() {
    let cpu = SystemAllocator::new();
    let outer = scope("t.sent.outer");
    let guard = scope("inner");
    assert_eq!(tensormem::current_scope().as_deref(), Some("t.sent.outer/inner"));
    thread::spawn(move || {
        assert_eq!(tensormem::current_scope(), None, "scopes are per thread");
        drop(guard);
        assert_eq!(tensormem::current_scope(), None);
    })
    .join()
    .unwrap();
    // This thread stops using the closed tag at once; its outer scope is intact.
    assert_eq!(tensormem::current_scope().as_deref(), Some("t.sent.outer"));
    let check = LeakCheck::start();
    let p = cpu.allocate::<u8>(1).unwrap();
    let r = check.live();
    assert_eq!(r.leaks[0].tag.as_deref(), Some("t.sent.outer"));
    check.disarm();
    // SAFETY: `p` came from `allocate::<u8>(1)` on `cpu`.
    unsafe { cpu.deallocate(p, 1) };
    // Out-of-order drop on the owning thread closes just that scope.
    let a = scope("a");
    let b = scope("b");
    drop(a);
    assert_eq!(tensormem::current_scope().as_deref(), Some("t.sent.outer/a/b"));
    drop(b);
    assert_eq!(tensormem::current_scope().as_deref(), Some("t.sent.outer"));
    drop(outer);
    assert_eq!(tensormem::current_scope(), None);
}

#[test]
fn history_capacity_zero_is_an_error() {
    let err = history::start(HistoryOptions { capacity: 0, backtraces: false }).unwrap_err();
    assert!(matches!(err, HistoryError::ZeroCapacity));
    assert_eq!(err.to_string(), "history capacity must be at least 1 event (got 0)");
}

/// History is process-wide; tests that record run one at a time.
static HISTORY_LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

#[test]
fn a_leak_check_started_while_history_records_both_work() {
    let _one = HISTORY_LOCK.lock();
    let cpu = SystemAllocator::builder().name("t.hist.cpu").build().unwrap();
    let bfc = BfcAllocator::builder().name("t.hist.bfc").memory_limit(4 << 20).build().unwrap();
    history::start(HistoryOptions { capacity: 1000, backtraces: false }).unwrap();
    let check = LeakCheck::start();
    let _s = scope("t.hist");
    let a = cpu.allocate::<u8>(64).unwrap();
    let b = bfc.allocate::<u8>(1000).unwrap();
    let leaked = cpu.allocate::<u8>(32).unwrap();
    // SAFETY: each came from the matching `allocate` call.
    unsafe {
        cpu.deallocate(a, 64);
        bfc.deallocate(b, 1000);
    }
    let report = check.finish();
    history::stop();
    bfc.release_cached();
    let h = history::recorded();
    assert_eq!(report.leaks.iter().map(|l| l.requested_size).collect::<Vec<_>>(), vec![32]);
    let mine: Vec<(Action, u64, &str, Option<&str>)> = h
        .events
        .iter()
        .filter(|e| e.allocator.starts_with("t.hist."))
        .map(|e| (e.action, e.size, &*e.allocator, e.tag.as_deref()))
        .collect();
    assert_eq!(
        mine,
        vec![
            (Action::Alloc, 64, "t.hist.cpu", Some("t.hist")),
            (Action::SegmentAlloc, 2 << 20, "t.hist.bfc", None), // BFC's first region
            (Action::Alloc, 1000, "t.hist.bfc", Some("t.hist")),
            (Action::Alloc, 32, "t.hist.cpu", Some("t.hist")),
            (Action::Free, 64, "t.hist.cpu", None),
            (Action::Free, 1000, "t.hist.bfc", None),
        ]
    );
    // Nothing after stop() is recorded (the release above came after).
    assert!(h.events.iter().all(|e| e.action != Action::SegmentFree || &*e.allocator != "t.hist.bfc"));
    assert!(h.events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    // SAFETY: `leaked` came from `allocate::<u8>(32)` on `cpu`.
    unsafe { cpu.deallocate(leaked, 32) };
}

/// The segments a BFC reports add up to what it has reserved, also when a peak headroom moves
/// free pages from a trapped chunk to where the region grows (the move reports the chunk's pages
/// as freed and the destination as taken; the growth reports only what it commits fresh).
#[cfg(target_os = "linux")]
#[test]
fn segments_add_up_to_reserved_when_a_peak_headroom_moves_pages() {
    let _one = HISTORY_LOCK.lock();
    let bfc =
        BfcAllocator::builder().name("t.move.bfc").memory_limit(1 << 30).peak_headroom(Some(0.0)).build().unwrap();
    history::start(HistoryOptions { capacity: 1000, backtraces: false }).unwrap();
    let mib = 1 << 20;
    let a = bfc.allocate::<u8>(100 * mib).unwrap();
    let b = bfc.allocate::<u8>(mib).unwrap();
    // SAFETY: each came from the matching `allocate` call.
    unsafe { bfc.deallocate(a, 100 * mib) };
    let c = bfc.allocate::<u8>(200 * mib).unwrap(); // 100 MiB of it moved from `a`'s chunk
    history::stop();
    let reserved = bfc.stats().unwrap().bytes_reserved;
    let h = history::recorded();
    let segments: i64 = h
        .events
        .iter()
        .filter(|e| &*e.allocator == "t.move.bfc")
        .map(|e| match e.action {
            Action::SegmentAlloc => e.size as i64,
            Action::SegmentFree => -(e.size as i64),
            _ => 0,
        })
        .sum();
    assert_eq!(reserved, 202 << 20);
    assert_eq!(segments, reserved as i64, "segment events against reserved");
    // SAFETY: each came from the matching `allocate` call.
    unsafe {
        bfc.deallocate(b, mib);
        bfc.deallocate(c, 200 * mib);
    }
}

#[test]
fn a_pool_reports_its_inner_calls_as_segments() {
    let _one = HISTORY_LOCK.lock();
    let sys = Arc::new(SystemAllocator::builder().name("t.seg.sys").build().unwrap());
    let pool = PoolAllocator::builder(sys).name("t.seg.pool").build().unwrap();
    history::start(HistoryOptions::default()).unwrap();
    let p = pool.allocate::<u8>(100).unwrap();
    // SAFETY: `p` came from `allocate::<u8>(100)` on `pool`.
    unsafe { pool.deallocate(p, 100) };
    let q = pool.allocate::<u8>(100).unwrap(); // from the pool's cache: no segment
    // SAFETY: `q` came from `allocate::<u8>(100)` on `pool`.
    unsafe { pool.deallocate(q, 100) };
    pool.release_cached();
    history::stop();
    let h = history::recorded();
    let mine: Vec<(Action, &str)> =
        h.events.iter().filter(|e| e.allocator.starts_with("t.seg.")).map(|e| (e.action, &*e.allocator)).collect();
    assert_eq!(
        mine,
        vec![
            (Action::SegmentAlloc, "t.seg.sys"),
            (Action::Alloc, "t.seg.pool"),
            (Action::Free, "t.seg.pool"),
            (Action::Alloc, "t.seg.pool"),
            (Action::Free, "t.seg.pool"),
            (Action::SegmentFree, "t.seg.sys"),
        ]
    );
}

#[test]
fn history_of_a_million_events_stays_bounded() {
    let _one = HISTORY_LOCK.lock();
    let cpu = SystemAllocator::builder().name("t.million").build().unwrap();
    history::start(HistoryOptions { capacity: 50_000, backtraces: false }).unwrap();
    for _ in 0..500_000 {
        let p = cpu.allocate::<u8>(16).unwrap();
        // SAFETY: `p` came from `allocate::<u8>(16)` on `cpu`.
        unsafe { cpu.deallocate(p, 16) };
    }
    history::stop();
    let h = history::recorded();
    assert_eq!(h.events.len(), 50_000);
    assert!(h.dropped >= 950_000, "dropped {}", h.dropped);
    assert_eq!(h.capacity, 50_000);
    let html = tensormem::timeline::render_html(&h);
    assert!(html.len() < 8 << 20, "page of {} bytes", html.len());
}

/// 48 bytes from `cpu`, in a frame of this test binary that a release build keeps (the test
/// function itself is inlined into the harness's `call_once` there, and its name leaves the
/// backtrace).
#[inline(never)]
fn allocate_48(cpu: &SystemAllocator) -> core::ptr::NonNull<u8> {
    cpu.allocate::<u8>(48).unwrap()
}

#[test]
fn history_files_round_trip_and_bad_files_are_errors() {
    let _one = HISTORY_LOCK.lock();
    let cpu = SystemAllocator::builder().name("t.json").build().unwrap();
    history::start(HistoryOptions { capacity: 100, backtraces: true }).unwrap();
    let p = allocate_48(&cpu);
    history::stop();
    // SAFETY: `p` came from `allocate::<u8>(48)` on `cpu`.
    unsafe { cpu.deallocate(p, 48) };
    let h = history::recorded();
    let e = h.events.iter().find(|e| &*e.allocator == "t.json").unwrap();
    assert!(e.backtrace.as_deref().is_some_and(|b| b.contains("leaks")), "{:?}", e.backtrace);
    let json = h.to_json();
    assert_eq!(history::History::from_json(&json).unwrap(), h);
    let dir_guard = tempdir("json");
    let dir = dir_guard.path();
    h.save(dir.join("h.json")).unwrap();
    assert_eq!(history::History::load(dir.join("h.json")).unwrap(), h);

    let truncated = &json[..json.len() / 2];
    let err = history::History::from_json(truncated).unwrap_err();
    assert!(matches!(err, HistoryError::Malformed { .. }), "{err}");
    assert!(err.to_string().starts_with("not a tensormem history file"), "{err}");
    let err = history::History::from_json(r#"{"version":1,"events":[{"action":"explode"}]}"#).unwrap_err();
    assert!(matches!(err, HistoryError::Malformed { .. }), "{err}");
    let err = history::History::from_json(r#"{"version":7,"events":[]}"#).unwrap_err();
    assert_eq!(err.to_string(), "history file version 7 is not supported (this build reads version 1)");
    let err = history::History::load(dir.join("missing.json")).unwrap_err();
    assert!(matches!(err, HistoryError::Io { .. }) && err.to_string().contains("missing.json"), "{err}");
}

#[test]
fn memory_summary_has_every_allocator_and_scope() {
    let registry = Arc::new(AllocatorRegistry::new());
    let bfc = Arc::new(BfcAllocator::builder().name("t.sum.bfc").memory_limit(8 << 20).build().unwrap());
    registry.register("t.sum.bfc", 5, bfc.clone()).unwrap();
    let p = {
        let _s = scope("t.sum.scope");
        bfc.allocate::<u8>(5000).unwrap()
    };
    let table = tensormem::telemetry::memory_summary(&registry);
    let row = table.lines().find(|l| l.trim_start().starts_with("t.sum.bfc")).unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    // allocator, in use, peak, allocated, freed, reserved, peak reserved, cached, allocs, frees, ooms, retries
    assert_eq!(
        cells,
        vec!["t.sum.bfc", "5.0 KiB", "5.0 KiB", "5.0 KiB", "0 B", "2.0 MiB", "2.0 MiB", "2.0 MiB", "1", "0", "0", "0"],
        "{table}"
    );
    assert!(table.contains("per scope:") && table.contains("t.sum.scope"), "{table}");
    #[cfg(feature = "prometheus")]
    {
        let text = tensormem::telemetry::AllocatorCollector::for_registry(registry.clone())
            .with_scope_metrics(10_000)
            .render();
        assert!(text.contains("tensormem_scope_in_use_bytes{scope=\"t.sum.scope\"} 5120"), "{text}");
        let none = tensormem::telemetry::AllocatorCollector::for_registry(registry.clone()).render();
        assert!(!none.contains("tensormem_scope_"), "scope series are opt-in");
        let one = tensormem::telemetry::AllocatorCollector::for_registry(registry).with_scope_metrics(1).render();
        let series = one.lines().filter(|l| l.starts_with("tensormem_scope_in_use_bytes{")).count();
        assert!(series <= 2, "top 1 and other: {one}");
    }
    // SAFETY: `p` came from `allocate::<u8>(5000)` on `bfc`.
    unsafe { bfc.deallocate(p, 5000) };
}

#[test]
fn histories_that_cannot_exist_are_refused_on_load_and_forged_ones_render_consistently() {
    let event = |t: u64, action: &str, address: u64, size: u64| {
        format!(r#"{{"time_ns":{t},"action":"{action}","address":{address},"size":{size},"allocator":"cpu"}}"#)
    };
    let file = |events: &[String]| {
        format!(r#"{{"version":1,"start_unix_ms":0,"capacity":8,"dropped":0,"events":[{}]}}"#, events.join(","))
    };
    let err = |events: &[String]| tensormem::history::History::from_json(&file(events)).unwrap_err().to_string();
    assert_eq!(
        err(&[event(0, "alloc", 4096, u64::MAX)]),
        format!("event 0: a size of {} bytes is more than any process can hold ({})", u64::MAX, isize::MAX)
    );
    assert_eq!(
        err(&[event(5, "alloc", 4096, 64), event(4, "free", 4096, 64)]),
        "event 1: its time 4 ns is before the event ahead of it (5 ns)"
    );
    let half = 1u64 << 62;
    let msg = err(&[event(0, "alloc", 4096, half), event(1, "alloc", 8192, half)]);
    assert!(msg.starts_with("event 1: live bytes add up to 9223372036854775808"), "{msg}");
    // A free of an address allocated before recording started is allowed.
    assert!(tensormem::history::History::from_json(&file(&[event(0, "free", 4096, 64)])).is_ok());

    // Built in code (not validated), the page sums in wide integers: header and chart agree.
    let h = tensormem::history::History {
        version: 1,
        start_unix_ms: 0,
        capacity: 8,
        dropped: 0,
        events: [(0, 4096), (1, 8192)]
            .iter()
            .map(|&(t, address)| tensormem::history::HistoryEvent {
                time_ns: t,
                action: Action::Alloc,
                address,
                size: 1 << 62,
                allocator: "cpu".into(),
                tag: None,
                description: None,
                backtrace: None,
            })
            .collect(),
    };
    let html = tensormem::timeline::render_html(&h);
    assert!(html.contains("peak in use 8.0 EiB"), "two live 4 EiB blocks are 8 EiB");
}
