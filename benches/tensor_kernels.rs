//! Tensor kernels against memory-copy baselines of the same bytes, in the same run, at 1 and 2
//! threads (a rayon pool of that size), f32.
//!
//! 1. `a + b`, 4M contiguous, output allocated through a caching allocator (pool) and, for
//!    reference, the system allocator; baseline: a copy moving the same 12 bytes per element
//!    (6 read, 6 written).
//! 2. 2048x2048 + a 2048-vector broadcast along rows; baseline: a copy moving 8 bytes per
//!    element.
//! 3. `a.t() + b`, 2048x2048, against `a + b` at the same size.
//! 4. `sum` of 4M against a read-only pass over the same 16 MB.
//! 5. `matmul` 512x512x512 against calling the gemm crate directly.
//! 6. `contiguous()` of a transposed 2048x2048 against a copy of 16 MB.
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench tensor_kernels`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime};
use rayon::prelude::*;
use tensormem::tensor::{Tensor, TensorOptions};
use tensormem::{Allocator, PoolAllocator, SystemAllocator};

const N4M: usize = 4 << 20;
const SIDE: usize = 2048;

fn pool() -> Arc<dyn Allocator> {
    let sys: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    Arc::new(PoolAllocator::builder(sys).build().expect("pool"))
}

fn threads(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("rayon pool")
}

/// Copies `src` into `dst`, split across the current rayon pool.
fn par_copy(src: &[u8], dst: &mut [u8]) {
    let chunk = src.len().div_ceil(rayon::current_num_threads());
    dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
}

/// Reads every word of `src`, split across the current rayon pool.
fn par_read(src: &[u64]) -> u64 {
    let chunk = src.len().div_ceil(rayon::current_num_threads());
    src.par_chunks(chunk).map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v))).reduce(|| 0, u64::wrapping_add)
}

fn copy_baseline(g: &mut BenchmarkGroup<'_, WallTime>, pool: &rayon::ThreadPool, bytes: usize, name: &str) {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    g.bench_function(name, |b| b.iter(|| pool.install(|| par_copy(black_box(&src), &mut dst))));
}

fn config(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
}

fn add_contiguous(c: &mut Criterion) {
    for t in [1, 2] {
        let tp = threads(t);
        let mut g = c.benchmark_group(format!("add_4M_{t}t"));
        config(&mut g);
        g.throughput(Throughput::Bytes((N4M * 12) as u64));
        copy_baseline(&mut g, &tp, N4M * 6, "copy");
        for (name, alloc) in [("tensor_pool", pool()), ("tensor_system", Arc::new(SystemAllocator::new()) as _)] {
            let opts = TensorOptions::new().allocator(alloc).seed(1);
            let (a, b) = (Tensor::rand(&[N4M], &opts).unwrap(), Tensor::rand(&[N4M], &opts).unwrap());
            g.bench_function(name, |bch| bch.iter(|| tp.install(|| black_box(a.add(&b).unwrap()))));
        }
        g.finish();
    }
}

fn add_broadcast_and_transposed(c: &mut Criterion) {
    let opts = TensorOptions::new().allocator(pool()).seed(2);
    let a = Tensor::rand(&[SIDE, SIDE], &opts).unwrap();
    let b = Tensor::rand(&[SIDE, SIDE], &opts).unwrap();
    let row = Tensor::rand(&[SIDE], &opts).unwrap();
    let at = a.t().unwrap();
    for t in [1, 2] {
        let tp = threads(t);
        let mut g = c.benchmark_group(format!("broadcast_2048_{t}t"));
        config(&mut g);
        g.throughput(Throughput::Bytes((SIDE * SIDE * 8) as u64));
        copy_baseline(&mut g, &tp, SIDE * SIDE * 4, "copy");
        g.bench_function("tensor", |bch| bch.iter(|| tp.install(|| black_box(a.add(&row).unwrap()))));
        g.finish();

        let mut g = c.benchmark_group(format!("transposed_2048_{t}t"));
        config(&mut g);
        g.throughput(Throughput::Bytes((SIDE * SIDE * 12) as u64));
        copy_baseline(&mut g, &tp, SIDE * SIDE * 6, "copy");
        g.bench_function("contiguous_add", |bch| bch.iter(|| tp.install(|| black_box(a.add(&b).unwrap()))));
        g.bench_function("transposed_add", |bch| bch.iter(|| tp.install(|| black_box(at.add(&b).unwrap()))));
        g.finish();

        let mut g = c.benchmark_group(format!("contiguous_of_transposed_2048_{t}t"));
        config(&mut g);
        g.throughput(Throughput::Bytes((SIDE * SIDE * 8) as u64));
        copy_baseline(&mut g, &tp, SIDE * SIDE * 4, "copy");
        g.bench_function("tensor", |bch| bch.iter(|| tp.install(|| black_box(at.contiguous().unwrap()))));
        g.finish();
    }
}

fn sum(c: &mut Criterion) {
    let opts = TensorOptions::new().allocator(pool()).seed(3);
    let x = Tensor::rand(&[N4M], &opts).unwrap();
    let words = vec![1u64; N4M / 2];
    for t in [1, 2] {
        let tp = threads(t);
        let mut g = c.benchmark_group(format!("sum_4M_{t}t"));
        config(&mut g);
        g.throughput(Throughput::Bytes((N4M * 4) as u64));
        g.bench_function("read", |bch| bch.iter(|| tp.install(|| black_box(par_read(black_box(&words))))));
        g.bench_function("tensor", |bch| bch.iter(|| tp.install(|| black_box(x.sum().unwrap()))));
        g.finish();
    }
}

fn matmul(c: &mut Criterion) {
    const M: usize = 512;
    let opts = TensorOptions::new().allocator(pool()).seed(4);
    let a = Tensor::rand(&[M, M], &opts).unwrap();
    let b = Tensor::rand(&[M, M], &opts).unwrap();
    let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let mut dst = vec![0f32; M * M];
    for t in [1, 2] {
        let tp = threads(t);
        let mut g = c.benchmark_group(format!("matmul_512_{t}t"));
        config(&mut g);
        g.throughput(Throughput::Elements((2 * M * M * M) as u64));
        g.bench_function("gemm_direct", |bch| {
            bch.iter(|| {
                tp.install(|| {
                    let par = if t > 1 { gemm::Parallelism::Rayon(t) } else { gemm::Parallelism::None };
                    // SAFETY: all three are M x M row-major buffers of f32; dst is separate.
                    unsafe {
                        gemm::gemm(
                            M,
                            M,
                            M,
                            dst.as_mut_ptr(),
                            1,
                            M as isize,
                            false,
                            av.as_ptr(),
                            1,
                            M as isize,
                            bv.as_ptr(),
                            1,
                            M as isize,
                            0.0f32,
                            1.0f32,
                            false,
                            false,
                            false,
                            par,
                        )
                    };
                    black_box(&dst);
                })
            })
        });
        g.bench_function("tensor", |bch| bch.iter(|| tp.install(|| black_box(a.matmul(&b).unwrap()))));
        g.finish();
    }
}

criterion_group!(benches, add_contiguous, add_broadcast_and_transposed, sum, matmul);
criterion_main!(benches);
