//! Telemetry costs: rendering the exposition of 16 allocators, and the allocation path of a
//! registered allocator with and without a collector (the collector reads stats only when
//! scraped, so the two should be the same). The process heap's counting is measured with
//! `GlobalAllocator` in `global_allocator.rs`.
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench telemetry`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::Layout;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tensormem::telemetry::AllocatorCollector;
use tensormem::{AllocationAttributes, Allocator, AllocatorExt, AllocatorRegistry, SystemAllocator};

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
    targets = render, alloc_path_with_collector
}
criterion_main!(benches);
