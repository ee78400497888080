//! What the observation hooks cost: a 64-byte alloc+free pair on the system backend,
//! through the path users get (`hooked`, nothing watching) against the same backend with the
//! hooks compiled out (`unobserved`, the allocation path before the hooks existed); and, for
//! the cost per event when something watches, the same pair inside a scope, inside a leak
//! check, and with history recording. Target: `hooked` within 2% of `unobserved`.
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench observe`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::Layout;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensormem::history::{self, HistoryOptions};
use tensormem::testing::LeakCheck;
use tensormem::{AllocationAttributes, Allocator, SystemAllocator};

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

criterion_group!(benches, bench);
criterion_main!(benches);
