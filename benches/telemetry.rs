//! Telemetry costs: CountingGlobalAlloc against the plain system allocator on an
//! allocation-heavy workload; rendering the exposition of 16 allocators; and the allocation path
//! of a registered allocator with and without a collector (the collector reads stats only when
//! scraped, so the two should be the same).
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench telemetry`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensormem::telemetry::{AllocatorCollector, CountingGlobalAlloc};
use tensormem::{AllocationAttributes, Allocator, AllocatorExt, AllocatorRegistry, SystemAllocator};

/// 256 allocations of mixed sizes, then their frees in another order: an allocation-heavy step.
fn workload(a: &impl GlobalAlloc) {
    let mut ptrs = [(core::ptr::null_mut::<u8>(), Layout::new::<u8>()); 256];
    for (i, slot) in ptrs.iter_mut().enumerate() {
        let layout = Layout::from_size_align(16 + (i * 37) % 2000, 8).unwrap();
        // SAFETY: non-zero size.
        *slot = (unsafe { a.alloc(layout) }, layout);
    }
    for i in (0..256).map(|i| (i * 97) % 256) {
        let (p, layout) = ptrs[i];
        // SAFETY: allocated above with `layout`, freed once.
        unsafe { a.dealloc(black_box(p), layout) };
    }
}

fn global_alloc_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("global_alloc_workload");
    group.throughput(Throughput::Elements(256));
    group.bench_function("system", |b| b.iter(|| workload(&System)));
    let counting = CountingGlobalAlloc::new(System);
    group.bench_function("counting", |b| b.iter(|| workload(&counting)));
    group.finish();
}

fn render(c: &mut Criterion) {
    let registry = Arc::new(AllocatorRegistry::new());
    let mut live = Vec::new();
    for i in 0..16 {
        let a: Arc<dyn Allocator> =
            Arc::new(SystemAllocator::builder().name(format!("a{i}")).bytes_limit(1 << 30).build().unwrap());
        live.push((Arc::clone(&a), a.allocate::<u8>(1000 + i).unwrap(), 1000 + i));
        registry.register(&format!("a{i}"), i as i32, a).unwrap();
    }
    let collector = AllocatorCollector::for_registry(registry);
    c.bench_function("render_16_allocators", |b| b.iter(|| black_box(collector.render())));
    for (a, p, n) in live {
        // SAFETY: each freed once with its count.
        unsafe { a.deallocate(p, n) };
    }
}

fn alloc_path_with_collector(c: &mut Criterion) {
    let layout = Layout::from_size_align(64, 16).unwrap();
    let pair = |a: &dyn Allocator| {
        let p = a.allocate_raw(layout, &AllocationAttributes::DEFAULT).unwrap();
        // SAFETY: just allocated with `layout`.
        unsafe { a.deallocate_raw(black_box(p), layout) };
    };
    let mut group = c.benchmark_group("alloc_path_64B");
    let plain: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    let observed: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    let registry = Arc::new(AllocatorRegistry::new());
    registry.register("observed", 0, Arc::clone(&observed)).unwrap();
    let prom = prometheus::Registry::new();
    prom.register(Box::new(AllocatorCollector::for_registry(registry))).unwrap();
    group.bench_function("without_collector", |b| b.iter(|| pair(&*plain)));
    group.bench_function("with_collector", |b| b.iter(|| pair(&*observed)));
    group.finish();
    black_box(prom.gather());
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = global_alloc_overhead, render, alloc_path_with_collector
}
criterion_main!(benches);
