//! What the observation hooks cost: a 64-byte alloc+free pair on the system backend,
//! through the path users get (`hooked`, nothing watching) against the same backend with the
//! hooks compiled out (`unobserved`, the allocation path before the hooks existed); and, for
//! the cost per event when something watches, the same pair inside a scope, inside a leak
//! check, and with history recording. Target: `hooked` within 2% of `unobserved`.
//!
//! `oom_report_100k`: a refused request to a BFC holding 100 000 live blocks, with an OOM
//! callback registered, so that every refusal builds and delivers an `OomReport`: with nothing
//! watching (the largest live blocks come from the BFC's tables) and with the blocks allocated
//! in four scopes (per-scope totals from the hub's ledger). Target: at most 1 ms.
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench observe`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::Layout;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensormem::history::{self, HistoryOptions};
use tensormem::testing::LeakCheck;
use tensormem::{AllocationAttributes, Allocator, AllocatorExt, BfcAllocator, SystemAllocator};

fn pair(cpu: &SystemAllocator, layout: Layout) {
    let p = cpu.allocate_raw(layout, &AllocationAttributes::default()).unwrap();
    // SAFETY: `p` was just allocated by `cpu` with `layout` and is freed once.
    unsafe { cpu.deallocate_raw(black_box(p), layout) };
}

fn bench(c: &mut Criterion) {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let cpu = SystemAllocator::new();
    let mut g = c.benchmark_group("observe_pair_64B");
    g.throughput(Throughput::Elements(1));
    g.bench_function("unobserved", |b| {
        b.iter(|| {
            let p = cpu.allocate_unobserved(layout).unwrap();
            // SAFETY: `p` was just allocated with `layout` by the unobserved path and is freed once.
            unsafe { cpu.deallocate_unobserved(black_box(p), layout) };
        })
    });
    g.bench_function("hooked", |b| b.iter(|| pair(&cpu, layout)));
    g.bench_function("scoped", |b| {
        let _s = tensormem::scope("bench");
        b.iter(|| pair(&cpu, layout))
    });
    g.bench_function("leak_check", |b| {
        let check = LeakCheck::start();
        b.iter(|| pair(&cpu, layout));
        check.assert_no_leaks();
    });
    g.bench_function("history", |b| {
        history::start(HistoryOptions { capacity: 1 << 16, backtraces: false }).unwrap();
        b.iter(|| pair(&cpu, layout));
        history::stop();
    });
    g.finish();
}

fn oom_report(c: &mut Criterion) {
    const LIVE: usize = 100_000;
    let reports = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = std::sync::Arc::clone(&reports);
    let id = tensormem::on_oom(move |r| {
        seen.fetch_add(r.largest_allocations.len() as u64, std::sync::atomic::Ordering::Relaxed);
    });
    let mut g = c.benchmark_group("oom_report_100k");
    g.sample_size(20);
    for scoped in [false, true] {
        let bfc = BfcAllocator::builder().name("bench-oom").memory_limit(32 << 20).build().unwrap();
        let held: Vec<_> = (0..LIVE)
            .map(|i| {
                let _s = scoped.then(|| tensormem::scope(["a", "b", "c", "d"][i % 4]));
                bfc.allocate::<u8>(256).unwrap()
            })
            .collect();
        g.bench_function(if scoped { "refused_scoped" } else { "refused_nothing_watching" }, |b| {
            b.iter(|| black_box(bfc.allocate::<u8>(16 << 20)).unwrap_err())
        });
        for p in held {
            // SAFETY: every `p` came from `allocate::<u8>(256)` on `bfc` and is freed once.
            unsafe { bfc.deallocate(p, 256) };
        }
    }
    g.finish();
    tensormem::remove_oom_observer(id);
    assert!(reports.load(std::sync::atomic::Ordering::Relaxed) > 0, "the reports listed live blocks");
}

criterion_group!(benches, bench, oom_report);
criterion_main!(benches);
