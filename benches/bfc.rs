//! Caching allocators on the recorded and shipped traces, pool hits, and fresh-page faulting.
//!
//! - `replay_<trace>/*`: one replay per iteration (throughput in operations) of every trace in
//!   `benches/traces/` (the two PyTorch streams, the transformer trace, the KV-cache stress), on
//!   the default BFC (`memory_limit` + `allow_growth`, nothing else set), TensorFlow's BFC
//!   (regions doubling from 2 MiB, its split rule, best fit: the BFC before expandable memory),
//!   the default BFC with `peak_headroom(None)` (no headroom: reserved follows the placement),
//!   the pool over the system allocator (large requests to its BFC, over transparent huge pages;
//!   `pool_4k_pages` with `huge_pages(false)`), jemalloc, and `stream_bfc`: the default BFC as
//!   the legacy stream's arena of a `StreamOrderedBfc` (what `cuda:N` is), the cost of the
//!   stream layer for callers that name no stream.
//! - `replay_written_torch_gpt2_train_varlen/*`: the training stream with every 4 KiB page of
//!   every block written, on the default BFC, the same without a peak headroom, TensorFlow's
//!   BFC and the two pools: the page faults an allocator causes or saves.
//! - `pool_hit_pair/*`: a warm pool hit (alloc+free of a cached size) against a
//!   `JemallocAllocator` pair of the same size.
//! - `fresh_pages_16MiB/*`: allocate 16 MiB, write every 4 KiB page, free; the system allocator
//!   maps and unmaps it each time (page faults), BFC keeps its memory.
//!
//! Memory figures (peak reserved / peak requested): `cargo run --release --example replay`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::Layout;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tensormem::allocators::{StreamEvents, StreamId, StreamOrderedBfc};
use tensormem::{
    AllocationAttributes, AllocationTrace, Allocator, BfcAllocator, PoolAllocator, PreparedTrace, SystemAllocator,
};

const TRACES: [&str; 4] =
    ["torch_gpt2_inference", "torch_gpt2_train_varlen", "transformer_inference", "kv_cache_stress"];

fn trace(name: &str) -> PreparedTrace {
    let path = format!("{}/benches/traces/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let json = std::fs::read_to_string(&path).expect("a shipped trace");
    PreparedTrace::new(&AllocationTrace::from_json(&json).expect("a valid trace"))
}

/// The default BFC: a limit and room to grow, nothing else set.
fn default_bfc() -> BfcAllocator {
    BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).build().unwrap()
}

/// The default BFC without a peak headroom: reserved follows the placement.
fn no_headroom_bfc() -> BfcAllocator {
    BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).peak_headroom(None).build().unwrap()
}

/// TensorFlow's BFC as it was before expandable memory.
fn tensorflow_bfc() -> BfcAllocator {
    BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).tensorflow_policies().build().unwrap()
}

/// The default pool over the system allocator (its large blocks in a BFC over transparent
/// huge pages), or the same with 4 KiB pages.
fn pool(huge_pages: bool) -> PoolAllocator {
    PoolAllocator::builder(Arc::new(SystemAllocator::new())).huge_pages(huge_pages).build().unwrap()
}

/// Host memory has no streams: single-stream replays record no event.
#[derive(Debug)]
struct NoEvents;

impl StreamEvents for NoEvents {
    type Event = ();

    fn record(&self, _stream: StreamId) -> std::io::Result<()> {
        Ok(())
    }

    fn query(&self, _event: &()) -> std::io::Result<bool> {
        Ok(true)
    }

    fn wait(&self, _event: &()) -> std::io::Result<()> {
        Ok(())
    }

    fn destroy(&self, _event: ()) {}
}

fn subjects() -> Vec<(&'static str, Arc<dyn Allocator>)> {
    #[allow(unused_mut)] // jemalloc is pushed only with its feature
    let mut v: Vec<(&'static str, Arc<dyn Allocator>)> = vec![
        ("bfc", Arc::new(default_bfc())),
        ("bfc_tensorflow", Arc::new(tensorflow_bfc())),
        ("bfc_no_headroom", Arc::new(no_headroom_bfc())),
        ("pool", Arc::new(pool(true))),
        ("pool_4k_pages", Arc::new(pool(false))),
        (
            "stream_bfc",
            Arc::new(
                StreamOrderedBfc::new(BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true), NoEvents)
                    .unwrap(),
            ),
        ),
    ];
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    v.push(("jemalloc", Arc::new(tensormem::JemallocAllocator::new())));
    v
}

fn replay(c: &mut Criterion) {
    for name in TRACES {
        let trace = trace(name);
        let mut group = c.benchmark_group(format!("replay_{name}"));
        group.throughput(Throughput::Elements(trace.len() as u64));
        group.sample_size(20);
        for (subject, a) in subjects() {
            // Warm: caching allocators keep their memory between runs, and the pages it lands on
            // are touched once here.
            trace.run_timed(&*a);
            trace.run_timed(&*a);
            group.bench_function(BenchmarkId::from_parameter(subject), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| trace.run_timed(&*a)).sum())
            });
        }
        group.finish();
    }
}

/// The training stream with every 4 KiB page of every block written, as a workload that uses
/// its memory does: here the page faults an allocator causes or saves count, where the
/// one-byte replay above sees only the allocator's own work (and the system calls of a peak
/// headroom's moves). Seconds per replay: ten samples, one replay each.
fn replay_written(c: &mut Criterion) {
    let name = "torch_gpt2_train_varlen";
    let trace = trace(name);
    let mut group = c.benchmark_group(format!("replay_written_{name}"));
    group.throughput(Throughput::Elements(trace.len() as u64));
    group.sample_size(10).warm_up_time(Duration::from_millis(1)).measurement_time(Duration::from_secs(30));
    let subjects: [(&str, Arc<dyn Allocator>); 5] = [
        ("bfc", Arc::new(default_bfc())),
        ("bfc_no_headroom", Arc::new(no_headroom_bfc())),
        ("bfc_tensorflow", Arc::new(tensorflow_bfc())),
        ("pool", Arc::new(pool(true))),
        ("pool_4k_pages", Arc::new(pool(false))),
    ];
    for (subject, a) in subjects {
        // Warm: the first replay grows the allocator and faults its pages in.
        trace.run_timed_writing_pages(&*a);
        group.bench_function(BenchmarkId::from_parameter(subject), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| trace.run_timed_writing_pages(&*a)).sum())
        });
    }
    group.finish();
}

fn pair(a: &dyn Allocator, layout: Layout) {
    let p = a.allocate_raw(layout, &AllocationAttributes::DEFAULT).unwrap();
    // SAFETY: `p` was just allocated with `layout`.
    unsafe { a.deallocate_raw(black_box(p), layout) };
}

fn pool_hit_pair(c: &mut Criterion) {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    let (baseline_name, baseline): (&str, Arc<dyn Allocator>) =
        ("jemalloc_allocator", Arc::new(tensormem::JemallocAllocator::new()));
    #[cfg(not(all(feature = "jemalloc", not(target_env = "msvc"))))]
    let (baseline_name, baseline): (&str, Arc<dyn Allocator>) = ("system_allocator", Arc::new(SystemAllocator::new()));
    for (size, label) in [(64usize, "64B"), (4096, "4KiB")] {
        let layout = Layout::from_size_align(size, 16).unwrap();
        let mut group = c.benchmark_group(format!("pool_hit_pair_{label}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function(baseline_name, |b| b.iter(|| pair(&*baseline, layout)));
        let pool = PoolAllocator::builder(Arc::clone(&baseline)).build().unwrap();
        pair(&pool, layout); // now cached: every pair below is a hit
        group.bench_function("pool_hit", |b| b.iter(|| pair(&pool, layout)));
        group.finish();
    }
}

fn fresh_pages(c: &mut Criterion) {
    const SIZE: usize = 16 << 20;
    let layout = Layout::from_size_align(SIZE, 256).unwrap();
    let mut group = c.benchmark_group("fresh_pages_16MiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    let subjects: [(&str, Arc<dyn Allocator>); 2] = [
        ("system", Arc::new(SystemAllocator::new())),
        ("bfc", Arc::new(BfcAllocator::builder().memory_limit(64 << 20).allow_growth(true).build().unwrap())),
    ];
    for (name, a) in subjects {
        group.bench_function(name, |b| {
            b.iter(|| {
                let p = a.allocate_raw(layout, &AllocationAttributes::DEFAULT).unwrap();
                for page in (0..SIZE).step_by(4096) {
                    // SAFETY: `p` is valid for SIZE bytes.
                    unsafe { p.as_ptr().add(page).write(1) };
                }
                // SAFETY: `p` was just allocated with `layout`.
                unsafe { a.deallocate_raw(black_box(p), layout) };
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = replay, replay_written, pool_hit_pair, fresh_pages
}
criterion_main!(benches);
