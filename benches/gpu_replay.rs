//! The recorded PyTorch streams replayed on device memory (feature `cuda`; GPU machines only):
//! `cuda:N` as the registry builds it (stream-ordered BFC arenas over expandable memory mapped
//! in 2 MiB units, the legacy stream's arena serving these single-stream replays), the plain BFC
//! on the same memory, the BFC over plain `cuMemAlloc` regions (TensorFlow's GPU
//! sub-allocator), and `cuMemAllocAsync` from a memory pool ([`CudaAsyncAllocator`], CUDA's
//! recommended baseline, allocating and freeing on the legacy stream without synchronising).
//! PyTorch's caching allocator on the same streams: `benches/torch_replay.py`, run in the same
//! call on the same machine (figures of both in `benches/README.md`; PyTorch's own figures
//! for the streams are in `../shared/traces/README.md`).
//!
//! ```text
//! cargo bench --features cuda --bench gpu_replay
//! ```
//!
//! Without a driver or device it prints one line saying so and measures nothing (or fails under
//! `TENSORMEM_REQUIRE_CUDA=1`). Before timing it prints each subject's peak reserved / peak
//! requested on each stream (one `replay`), whose target is at most 1.05.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tensormem::allocators::StreamOrderedBfc;
use tensormem::allocators::cuda::{CudaAsyncAllocator, CudaDevice, CudaEvents, CudaSubAllocator};
use tensormem::{AllocationTrace, Allocator, BfcAllocator, PreparedTrace, replay};

const TRACES: [&str; 2] = ["torch_gpt2_inference", "torch_gpt2_train_varlen"];

fn subjects(dev: &Arc<CudaDevice>) -> Vec<(&'static str, Arc<dyn Allocator>)> {
    let (_, total) = dev.memory_info().expect("cuMemGetInfo");
    let limit = total / 10 * 9;
    let template = |name: &str, sub: CudaSubAllocator| {
        BfcAllocator::builder().name(name).memory_limit(limit).allow_growth(true).sub_allocator(Arc::new(sub))
    };
    let bfc = |name: &str, sub: CudaSubAllocator| -> Arc<dyn Allocator> {
        Arc::new(template(name, sub).build().expect("a device BFC"))
    };
    let streams =
        StreamOrderedBfc::new(template("cuda:0", CudaSubAllocator::new(dev.clone())), CudaEvents::new(dev.clone()))
            .expect("a stream-ordered device BFC");
    vec![
        ("stream_bfc", Arc::new(streams)),
        ("bfc_expandable", bfc("cuda:0-plain", CudaSubAllocator::new(dev.clone()))),
        ("bfc_cumemalloc", bfc("cuda:0-regions", CudaSubAllocator::regions_only(dev.clone()))),
        ("cumemallocasync", Arc::new(CudaAsyncAllocator::new(dev.clone(), u64::MAX).expect("a memory pool"))),
    ]
}

fn gpu_replay(c: &mut Criterion) {
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            assert!(std::env::var("TENSORMEM_REQUIRE_CUDA").as_deref() != Ok("1"), "TENSORMEM_REQUIRE_CUDA=1 but: {e}");
            eprintln!("gpu_replay: skipped: {e}");
            return;
        }
    };
    for name in TRACES {
        // The binary may run from a copy of the repository elsewhere (a GPU machine): the
        // traces are found beside the sources it was built from, or under the current folder.
        let built = format!("{}/benches/traces/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let path = if std::path::Path::new(&built).exists() { built } else { format!("benches/traces/{name}.json") };
        let json = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let trace = AllocationTrace::from_json(&json).expect("a valid trace");
        let prepared = PreparedTrace::new(&trace);
        let mut group = c.benchmark_group(format!("gpu_replay_{name}"));
        group.throughput(Throughput::Elements(prepared.len() as u64));
        group.sample_size(10);
        for (subject, a) in subjects(&dev) {
            let report = replay(&trace, &*a);
            eprintln!(
                "gpu_replay {name} {subject}: peak reserved / peak requested {:.3}, peak in use / peak requested {:.3}, {} refused",
                report.reserved_over_requested().unwrap_or(f64::NAN),
                report.peak_in_use as f64 / report.peak_requested.max(1) as f64,
                report.failed_allocations
            );
            prepared.run_timed(&*a);
            group.bench_function(BenchmarkId::from_parameter(subject), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| prepared.run_timed(&*a)).sum())
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = gpu_replay
}
criterion_main!(benches);
