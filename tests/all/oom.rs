//! OOM reports: what a refusal reports with nothing watching, with scopes and with a leak check; callbacks that panic or run out of memory themselves; the `tracing` event.
//! Callbacks are process-wide and this binary's tests run in parallel, so each test names its
//! allocators uniquely and keeps only their reports.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use tensormem::allocators::observe;
use tensormem::oom::{OomObserverId, OomReport};
use tensormem::testing::LeakCheck;
use tensormem::{AllocErrorKind, Allocator, AllocatorExt, BfcAllocator, PoolAllocator, SystemAllocator};

type Reports = Arc<Mutex<Vec<OomReport>>>;

/// Collects the reports of the allocator called `name`.
fn collect(name: &'static str) -> (OomObserverId, Reports) {
    let reports: Reports = Arc::default();
    let sink = Arc::clone(&reports);
    let id = tensormem::on_oom(move |r| {
        if r.allocator == name {
            sink.lock().unwrap().push(r.clone());
        }
    });
    (id, reports)
}

fn taken(reports: &Reports) -> Vec<OomReport> {
    std::mem::take(&mut *reports.lock().unwrap())
}

fn bfc(name: &str, limit: u64) -> BfcAllocator {
    BfcAllocator::builder().name(name).memory_limit(limit).build().unwrap()
}

/// Frees `blocks` (each `(pointer, bytes)` from `allocate::<u8>(bytes)` on `a`).
fn free_all(a: &dyn Allocator, blocks: Vec<(NonNull<u8>, usize)>) {
    for (p, n) in blocks {
        // SAFETY: the caller passes blocks from `allocate::<u8>(n)` on `a`, each once.
        unsafe { a.deallocate(p, n) };
    }
}

#[test]
fn with_nothing_watching_a_bfc_reports_its_own_tables() {
    let (id, reports) = collect("oom-bfc-plain");
    let a = bfc("oom-bfc-plain", 6 << 20);
    // Fill 6 MiB in blocks of growing size, free every other one: free memory in pieces.
    let mut held = Vec::new();
    for i in 0..12usize {
        let n = ((i + 1) * 64) << 10;
        held.push((a.allocate::<u8>(n).unwrap(), n));
    }
    let (keep, drop_): (Vec<_>, Vec<_>) = held.into_iter().enumerate().partition(|(i, _)| i % 2 == 1);
    free_all(&a, drop_.into_iter().map(|(_, b)| b).collect());
    // 2.6 MiB live of 6 MiB: 4 MiB does not fit.
    let err = a.allocate::<u8>(4 << 20).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::OutOfMemory);

    let got = taken(&reports);
    assert_eq!(got.len(), 1, "one report per refusal: {got:?}");
    let r = &got[0];
    assert_eq!((r.allocator.as_str(), r.kind.as_str()), ("oom-bfc-plain", "out of memory"));
    assert_eq!(r.message, err.to_string());
    assert_eq!((r.requested_bytes, r.rounded_bytes), (4 << 20, Some(4 << 20)));
    let stats = a.stats().unwrap();
    assert_eq!(r.in_use_bytes, Some(stats.bytes_in_use));
    assert_eq!(r.reserved_bytes, Some(stats.bytes_reserved));
    assert_eq!(r.limit_bytes, Some(6 << 20));
    assert_eq!(r.largest_free_bytes, stats.largest_free_block_bytes);
    let free = stats.bytes_reserved - stats.bytes_in_use;
    let frag = 1.0 - stats.largest_free_block_bytes.unwrap() as f64 / free as f64;
    assert!((r.fragmentation.unwrap() - frag).abs() < 1e-12, "{r:?}");
    assert!(r.fragmentation.unwrap() > 0.0, "the free memory is in pieces");
    // The ten largest of the six live blocks (2, 4, .. 12 x 64 KiB), largest first, from the
    // BFC's own tables; nothing names them.
    let sizes: Vec<u64> = r.largest_allocations.iter().map(|a| a.requested_bytes).collect();
    assert_eq!(sizes, [12u64, 10, 8, 6, 4, 2].map(|k| (k * 64) << 10));
    for (b, (p, n)) in r.largest_allocations.iter().zip(keep.iter().rev().map(|(_, b)| b)) {
        assert_eq!((b.address, b.requested_bytes), (p.as_ptr() as u64, *n as u64));
        assert_eq!((&b.scope, &b.description, &b.backtrace), (&None, &None, &None));
    }
    assert!(r.top_scopes.is_empty());
    assert_eq!(r.sources, ["allocator"]);
    assert_eq!(r.scope, None);
    let text = r.to_string();
    assert!(text.starts_with(&format!("OOM report #{}: {err}\n", r.sequence)), "{text}");
    assert!(text.contains("fragmentation"), "{text}");
    assert!(text.contains("768.0 KiB"), "the largest live block is listed: {text}");
    // The JSON round-trips.
    assert_eq!(&serde_json::from_str::<OomReport>(&r.to_json()).unwrap(), r);
    tensormem::remove_oom_observer(id);
    free_all(&a, keep.into_iter().map(|(_, b)| b).collect());
}

#[test]
fn a_limited_system_allocator_reports_usage_and_limit() {
    let (id, reports) = collect("oom-sys-limit");
    let a = SystemAllocator::builder().name("oom-sys-limit").bytes_limit(1 << 20).build().unwrap();
    let p = a.allocate::<u8>(700 << 10).unwrap();
    let err = a.allocate::<u8>(400 << 10).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::LimitExceeded);
    let got = taken(&reports);
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.kind, "limit exceeded");
    assert_eq!((r.in_use_bytes, r.limit_bytes, r.reserved_bytes), (Some(700 << 10), Some(1 << 20), None));
    assert_eq!((r.largest_free_bytes, r.fragmentation), (None, None));
    assert!(r.largest_allocations.is_empty() && r.sources.is_empty(), "nothing watches: {r:?}");
    tensormem::remove_oom_observer(id);
    free_all(&a, vec![(p, 700 << 10)]);
}

#[test]
fn scopes_name_the_allocations_and_rank_the_scopes() {
    let (id, reports) = collect("oom-scoped");
    let a = bfc("oom-scoped", 4 << 20);
    let mut held = Vec::new();
    {
        let _s = tensormem::scope("weights");
        held.push((a.allocate::<u8>(1 << 20).unwrap(), 1 << 20));
        held.push((a.allocate::<u8>(512 << 10).unwrap(), 512 << 10));
    }
    {
        let _s = tensormem::scope("activations");
        held.push((a.allocate::<u8>(768 << 10).unwrap(), 768 << 10));
    }
    held.push((a.allocate::<u8>(256 << 10).unwrap(), 256 << 10));
    let err = {
        let _s = tensormem::scope("step");
        a.allocate::<u8>(2 << 20).unwrap_err()
    };
    let got = taken(&reports);
    assert_eq!(got.len(), 1, "{got:?}");
    let r = &got[0];
    assert_eq!(r.message, err.to_string());
    assert_eq!(r.scope.as_deref(), Some("step"));
    let listed: Vec<(u64, Option<&str>)> =
        r.largest_allocations.iter().map(|a| (a.requested_bytes >> 10, a.scope.as_deref())).collect();
    assert_eq!(listed, [(1024, Some("weights")), (768, Some("activations")), (512, Some("weights")), (256, None)]);
    let scopes: Vec<(&str, u64, u64)> =
        r.top_scopes.iter().map(|s| (s.scope.as_str(), s.bytes >> 10, s.allocations)).collect();
    assert_eq!(scopes, [("weights", 1536, 2), ("activations", 768, 1)]);
    assert_eq!(r.sources, ["allocator", "observer"]);
    assert!(r.to_string().contains("scope 'weights'"), "{r}");
    tensormem::remove_oom_observer(id);
    free_all(&a, held);
}

#[test]
fn a_leak_check_adds_descriptions() {
    let (id, reports) = collect("oom-described");
    let a = bfc("oom-described", 2 << 20);
    let check = LeakCheck::start();
    let p = a.allocate::<u8>(1 << 20).unwrap();
    observe::describe(p.as_ptr() as usize, || "tensor f32 [512, 512]".to_owned());
    assert!(a.allocate::<u8>(3 << 20).is_err());
    let r = taken(&reports).pop().unwrap();
    assert_eq!(r.largest_allocations[0].description.as_deref(), Some("tensor f32 [512, 512]"));
    assert!(r.to_string().contains("tensor f32 [512, 512]"), "{r}");
    free_all(&a, vec![(p, 1 << 20)]);
    assert!(check.finish().is_empty());
    tensormem::remove_oom_observer(id);
}

#[test]
fn a_pool_reports_its_own_refusal_once() {
    let (inner_id, inner_reports) = collect("oom-pool-inner");
    let (id, reports) = collect("oom-pool");
    let inner = Arc::new(SystemAllocator::builder().name("oom-pool-inner").bytes_limit(1 << 20).build().unwrap());
    let pool = PoolAllocator::builder(inner).name("oom-pool").build().unwrap();
    let p = pool.allocate::<u8>(800 << 10).unwrap();
    let err = pool.allocate::<u8>(800 << 10).unwrap_err();
    let got = taken(&reports);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].message, err.to_string());
    assert!(taken(&inner_reports).is_empty(), "the pool's source is not reported on its own");
    tensormem::remove_oom_observer(id);
    tensormem::remove_oom_observer(inner_id);
    free_all(&pool, vec![(p, 800 << 10)]);
}

#[test]
fn a_panicking_callback_does_not_take_the_allocator_down() {
    let (id, reports) = collect("oom-panic");
    let bad = tensormem::on_oom(|r| {
        if r.allocator == "oom-panic" {
            panic!("callback bug");
        }
    });
    let a = bfc("oom-panic", 1 << 20);
    for _ in 0..2 {
        assert_eq!(a.allocate::<u8>(2 << 20).unwrap_err().kind(), AllocErrorKind::LimitExceeded);
    }
    assert_eq!(taken(&reports).len(), 2, "the other callbacks still run");
    let p = a.allocate::<u8>(1000).unwrap();
    free_all(&a, vec![(p, 1000)]);
    assert!(tensormem::remove_oom_observer(bad));
    assert!(!tensormem::remove_oom_observer(bad), "removed already");
    tensormem::remove_oom_observer(id);
}

#[test]
fn an_oom_inside_a_callback_is_not_reported_again() {
    let a = Arc::new(bfc("oom-recursive", 1 << 20));
    let (id, reports) = collect("oom-recursive");
    let inner = Arc::clone(&a);
    let failures = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&failures);
    let cb = tensormem::on_oom(move |r| {
        if r.allocator == "oom-recursive" {
            // The callback allocates from the allocator that just refused, and is refused too.
            assert!(inner.allocate::<u8>(4 << 20).is_err());
            *seen.lock().unwrap() += 1;
        }
    });
    assert!(a.allocate::<u8>(2 << 20).is_err());
    assert_eq!(taken(&reports).len(), 1);
    assert_eq!(*failures.lock().unwrap(), 1);
    tensormem::remove_oom_observer(cb);
    tensormem::remove_oom_observer(id);
}

#[test]
fn report_entries_bound_the_lists() {
    let (id, reports) = collect("oom-entries");
    let a = bfc("oom-entries", 4 << 20);
    let held: Vec<_> = (0..30).map(|_| (a.allocate::<u8>(100 << 10).unwrap(), 100 << 10)).collect();
    assert!(a.allocate::<u8>(2 << 20).is_err());
    let r = taken(&reports).pop().unwrap();
    assert_eq!(r.largest_allocations.len(), observe::DEFAULT_REPORT_ENTRIES);
    tensormem::remove_oom_observer(id);
    free_all(&a, held);
}
