//! Tensor kernels on the path a user gets by default (tensors made with no allocator chosen,
//! so the registry's default allocates their outputs), beside a memory-copy baseline of the
//! same bytes in the same run, at 1 and 2 threads, f32.
//!
//! Every group has `copy` (the baseline: a plain copy moving the bytes the kernel moves, on a
//! rayon pool of the same size), `default` (fresh output, default allocator), `pool` (fresh
//! output from an explicit `PoolAllocator`: the reference the targets name), and where PyTorch
//! has them `inplace` (`a.add_(&b)`) and `out` (`a.add_out(&b, &out)`). The `out` groups also
//! have `out_beside`: `out` and `default` calls in rotation, out / default of those calls written
//! to `tensor_side_by_side.json`.
//!
//! 1. `a + b`, 4M elements: 12 bytes of traffic per element (8 read, 4 written); the copy
//!    baseline copies 6 bytes per element (6 read, 6 written), the same traffic.
//!    The same at 256K elements (3 MiB in all, cache-resident): the scaling without the memory
//!    bandwidth limit.
//! 2. 2048x2048 + a 2048 row vector (8 bytes per element; the copy: 4).
//! 3. `a.t() + b`, 2048x2048 (12 bytes per element), beside `a + b` of the same size.
//! 4. `sum` of 4M against a read-only pass over the same 16 MB.
//! 5. `matmul` 512x512x512 against the gemm crate called directly (on a rayon pool of the same
//!    size), also call by call side by side (`beside_gemm`: the row's time is the default
//!    calls', and default / gemm of those calls goes to `tensor_side_by_side.json`).
//! 6. `contiguous()` of a transposed 2048x2048 against a copy of 16 MB.
//!
//! 7. Half precision (`half_256K_1t`): f16 and bf16 adds, casts and sums of 256K elements
//!    beside the f32 add of the same elements, at 1 thread.
//!
//! 8. Half-precision matmul (`matmul_half_512_1t`): 512^3 in f32, f16 and bf16, a GPT-2 MLP
//!    layer in bf16 and f16, and bf16 and f16 on their default route (AMX tiles, or AVX512-BF16
//!    registers for bf16) beside the f32 route, call by call.
//!
//! 9. `a + b` on 1M elements at 2 threads, each call 200 µs after the last (sleeping, untimed):
//!    a kernel issued shortly after another, as in a model's forward pass, with the kernel
//!    threads spinning between kernels (`spin_1ms`, the default) and sleeping at once
//!    (`spin_0`), against the same calls back to back (`back_to_back`).
//!
//! 10. The element-wise and row ops of a GPT-2 block (`transformer_ops_1t`), at 1 thread,
//!     beside a copy of the 12 MB of a 1024x3072 activation: GELU of that activation in f32,
//!     bf16 and f16 (and of it times 1e-20, whose squares are subnormal), its tanh
//!     approximation, `silu`, `exp`, `sigmoid`, `tanh` and `log` (of its absolute value) of it, softmax of 12x256x256 attention scores, `log_softmax` of 16 rows
//!     of next-token logits over GPT-2's 50257-token vocabulary, and
//!     `layer_norm` / `rms_norm` of 1024x768 with a weight (and a bias), `layer_norm` in bf16 too;
//!     the activation's sum over its tokens (dimension 0, a bias's gradient) and over its
//!     features, its maximum and argmax over its tokens; and GELU, its tanh
//!     form, `silu`, `tanh`, `log` and bf16 GELU on the AVX-512 blocks (the AVX2 ones where the
//!     kernels run AVX2: no bf16 there) beside the one-vector loop (`set_avx512_blocks`,
//!     `set_avx2_blocks`), call by call (`*_blocks_beside_one_vector`); and GELU, SiLU, `tanh`
//!     and `exp` of the bf16 or f16 activation by their lookup tables (the default) beside the
//!     same computed element by element (`set_half_tables`), call by call
//!     (`*_tables_beside_computed`).
//!
//! The `pool` rows call the default path beside each pool call, on the same tensors and on a
//! second set allocated from the default allocator (the control), and write default / pool and
//! default / default-again of those side-by-side calls to
//! `target/criterion/tensor_side_by_side.json`: the target "within 5% of a `PoolAllocator`
//! output" compared on the same seconds of a machine whose speed drifts between rows.
//!
//! Each 2-thread group also has a `scaling` row: the default path at 2 threads and at 1 and the
//! group's baseline at 2 and at 1, in turn, whose 1-thread / 2-thread ratios go to
//! `tensor_side_by_side.json`: 2-thread scaling from the same seconds of the machine, not from
//! two rows run seconds apart. Each takes its turn as a block of calls back to back (see
//! `scaling_block`), not one call at a time: a lone 2-thread call wakes a sleeping kernel thread
//! whenever the calls before it outlast the kernel threads' spin (`set_kernel_spin`), and on a
//! machine with as many cores as threads that spin takes a core from the baseline's calls, so
//! such a row under-reads both scalings (figures: `tensor/benches/README.md`).
//!
//! Page faults: every benchmark is timed with `iter_custom`, which also reads `getrusage`'s
//! minor-fault count around the timed loop; the count per call of the last sample (steady
//! state) is written to `target/criterion/tensor_faults.json`.
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench tensor_kernels`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, measurement::WallTime};
use rayon::prelude::*;
use tensormem::{Allocator, AllocatorRegistry, PoolAllocator};
use tensormem_tensor::{
    DEFAULT_KERNEL_SPIN, DType, Tensor, TensorOptions, amx_enabled, avx2_blocks_enabled, avx512_bf16_enabled,
    avx512_blocks_enabled, half_tables_enabled, kernel_spin, set_amx, set_avx2_blocks, set_avx512_bf16,
    set_avx512_blocks, set_half_tables, set_kernel_spin, set_num_threads,
};

const N4M: usize = 4 << 20;
const SIDE: usize = 2048;

/// Minor page faults per call of each benchmark's last sample, by "group/name".
static FAULTS: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

fn minor_faults() -> i64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given; RUSAGE_SELF is always valid.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_minflt
    }
}

/// Records the minor page faults per call since `before` (a [`minor_faults`] reading) under `key`.
fn record_faults(key: &str, before: i64, calls: u64) {
    let per_call = (minor_faults() - before) as f64 / calls as f64;
    FAULTS.lock().unwrap().insert(key.to_owned(), per_call);
}

/// Benchmarks `f`, timing it and counting the page faults of its timed loop.
fn bench<R>(g: &mut BenchmarkGroup<'_, WallTime>, group: &str, name: &str, mut f: impl FnMut() -> R) {
    let key = format!("{group}/{name}");
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let faults = minor_faults();
            let start = Instant::now();
            for _ in 0..iters {
                black_box(f());
            }
            let elapsed = start.elapsed();
            record_faults(&key, faults, iters);
            elapsed
        })
    });
}

/// Time in the calls made side by side by each side-by-side row ("group/row"), in ns, call by
/// call: for a `pool` row the pool calls, the default calls, and the default calls on a second
/// set of tensors; for `matmul`'s `beside_gemm` row the default calls and gemm's; for an
/// `out_beside` row the `out=` calls and the default ones; for a
/// `scaling` row the default calls at 2 threads and at 1, then the baseline's at 2 and at 1.
static SIDE_BY_SIDE: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// Benchmarks the row `row`: `calls` in rotating order, one of each per iteration, adding each
/// call's time to [`SIDE_BY_SIDE`]; the row's own time is that of `calls[0]` alone.
///
/// Criterion's rows run seconds apart, on shared machines whose speed drifts between rows (see
/// `tensor/benches/README.md`); calls side by side see the same machine.
fn bench_side_by_side(g: &mut BenchmarkGroup<'_, WallTime>, group: &str, row: &str, calls: &mut [&mut dyn FnMut()]) {
    bench_side_by_side_in_blocks(g, group, row, 1, calls);
}

/// `call` on the default route (after `route(true)`) beside the same call on the other one
/// (after `route(false)`), call by call: the row's ratio is default / other.
fn bench_route_beside(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    row: &str,
    route: &dyn Fn(bool),
    call: &dyn Fn(),
) {
    bench_side_by_side(
        g,
        group,
        row,
        &mut [
            &mut || {
                route(true);
                call()
            },
            &mut || {
                route(false);
                call()
            },
        ],
    );
}

/// As [`bench_side_by_side`], each call made `block` times in a row before the next one's turn;
/// the row's time is still that of one call of `calls[0]`. With `block > 1` the turns keep the
/// order of `calls`: only a block's first call follows another call, so a rotation would have
/// little to even out, and a fixed order lets the caller choose what follows what.
fn bench_side_by_side_in_blocks(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    row: &str,
    block: u32,
    calls: &mut [&mut dyn FnMut()],
) {
    let key = format!("{group}/{row}");
    let n = calls.len();
    g.bench_function(row, |b| {
        b.iter_custom(|iters| {
            let mut spent = vec![Duration::ZERO; n];
            let faults = minor_faults();
            for i in 0..iters {
                for k in 0..n {
                    let which = if block == 1 { (i as usize + k) % n } else { k };
                    let start = Instant::now();
                    for _ in 0..block {
                        calls[which]();
                    }
                    spent[which] += start.elapsed();
                }
            }
            record_faults(&key, faults, n as u64 * iters * u64::from(block));
            let mut all = SIDE_BY_SIDE.lock().unwrap();
            let e = all.entry(key.clone()).or_insert_with(|| vec![0.0; n]);
            for (sum, d) in e.iter_mut().zip(&spent) {
                *sum += d.as_nanos() as f64;
            }
            spent[0] / block
        })
    });
}

/// Benchmarks `pool` as the `pool` row, each call beside a call of `default` and of
/// `default_again` (the same op on tensors allocated separately from the same default
/// allocator): see [`bench_side_by_side`]. `default` / `default_again` is the control: what the
/// physical pages two allocations happen to get make of a ratio, with no allocator difference at
/// all.
fn bench_pool_beside<R, S, T>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    mut default: impl FnMut() -> R,
    mut default_again: impl FnMut() -> S,
    mut pool: impl FnMut() -> T,
) {
    bench_side_by_side(
        g,
        group,
        "pool",
        &mut [&mut || drop(black_box(pool())), &mut || drop(black_box(default())), &mut || {
            drop(black_box(default_again()))
        }],
    );
}

/// The `out_beside` row: the `out=` form and the fresh-output form of one op, call by call in
/// rotation (see [`bench_side_by_side`]), for the target "`out=` forms no slower than the
/// fresh-output form" from the same seconds of the machine. The row's time is the `out=` calls'.
fn bench_out_beside<R>(g: &mut BenchmarkGroup<'_, WallTime>, group: &str, out: impl Fn(), default: impl Fn() -> R) {
    bench_side_by_side(g, group, "out_beside", &mut [&mut || out(), &mut || drop(black_box(default()))]);
}

/// In a 2-thread group, the `scaling` row: the op on the default path at 2 threads and at 1,
/// and `baseline(threads)` (the group's copy, read or gemm on a rayon pool of that many
/// workers) at 2 and at 1, in rotation (see [`bench_side_by_side`]). The target "2-thread
/// rows scaling at least 1.7x" from the same seconds of the machine, for the kernel and for its
/// baseline, rather than from two rows run seconds apart. The row's time is the default calls'
/// at 2 threads.
fn bench_scaling_beside<R>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    default: impl Fn() -> R,
    baseline: impl FnMut(usize),
) {
    let baseline = std::cell::RefCell::new(baseline);
    let at = |threads: usize| {
        set_num_threads(threads);
        drop(black_box(default()));
    };
    let block = scaling_block(|| at(2));
    bench_side_by_side_in_blocks(
        g,
        group,
        "scaling",
        block,
        &mut [&mut || at(2), &mut || at(1), &mut || (baseline.borrow_mut())(2), &mut || (baseline.borrow_mut())(1)],
    );
    set_num_threads(2);
}

/// How many calls of `call` (the op at 2 threads) a `scaling` row makes in a row before the
/// next call's turn: enough for a block to take twice the kernel threads' spin (2 ms at the
/// least), at most 256.
///
/// Calls one at a time in rotation measured wake-ups, not scaling: a 2-thread call found its
/// second thread asleep wherever the three calls before it took longer than the spin, and on a
/// 2-core machine the spin after it took a core from the calls that followed. In blocks, the
/// threads are awake from a block's second call on, as in a model's forward pass where
/// kernels come back to back, and the spin after a block ends during the 1-thread block that
/// follows it (the turns are always 2 threads, 1 thread, baseline at 2, baseline at 1).
fn scaling_block(mut call: impl FnMut()) -> u32 {
    let least = (kernel_spin() * 2).max(Duration::from_millis(2));
    call();
    let start = Instant::now();
    for _ in 0..3 {
        call();
    }
    let one = start.elapsed() / 3;
    (least.as_nanos() / one.as_nanos().max(1)).clamp(1, 256) as u32
}

/// A pool for the reference rows: TensorFlow's caching pool over the system allocator.
fn pool() -> Arc<dyn Allocator> {
    let sys: Arc<dyn Allocator> = Arc::new(tensormem::SystemAllocator::new());
    Arc::new(PoolAllocator::builder(sys).build().expect("pool"))
}

fn rayon_pool(n: usize) -> rayon::ThreadPool {
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

fn group<'a>(c: &'a mut Criterion, name: &str, t: usize, bytes: usize) -> BenchmarkGroup<'a, WallTime> {
    set_num_threads(t);
    let mut g = c.benchmark_group(name);
    g.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes(bytes as u64));
    g
}

fn copy_baseline(g: &mut BenchmarkGroup<'_, WallTime>, group: &str, t: usize, bytes: usize) {
    let mut copy = copier(bytes);
    bench(g, group, "copy", || copy(t));
}

/// `copy(threads)`: copies `bytes` between two buffers of its own on a rayon pool of `threads`
/// (1 or 2) workers. The buffers are byte tensors from the default allocator, so the copy runs
/// on the memory the kernels beside it use (above 1 MiB: the pool's blocks in transparent huge
/// pages, where Linux gives them).
fn copier(bytes: usize) -> impl FnMut(usize) {
    let pools = [rayon_pool(1), rayon_pool(2)];
    let src = Tensor::ones(&[bytes], DType::U8).expect("copy source");
    let dst = Tensor::zeros(&[bytes], DType::U8).expect("copy destination");
    move |t| {
        let (src, mut dst) = (src.as_slice::<u8>().expect("u8"), dst.as_mut_slice::<u8>().expect("u8"));
        let (src, dst): (&[u8], &mut [u8]) = (&src, &mut dst);
        pools[t - 1].install(|| par_copy(black_box(src), dst))
    }
}

/// A copy of `t` in memory of its own, from the default allocator: the control rows' tensors.
fn another(t: &Tensor) -> Tensor {
    let copy = Tensor::empty_like(t).unwrap();
    copy.copy_(t).unwrap();
    copy
}

fn default_opts(seed: u64) -> TensorOptions {
    TensorOptions::new().dtype(DType::F32).seed(seed)
}

fn add_contiguous(c: &mut Criterion) {
    let (a, b) = (Tensor::rand(&[N4M], default_opts(1)).unwrap(), Tensor::rand(&[N4M], default_opts(2)).unwrap());
    let (a2, b2) = (another(&a), another(&b));
    let popts = default_opts(1).allocator(pool());
    let (pa, pb) = (Tensor::rand(&[N4M], &popts).unwrap(), Tensor::rand(&[N4M], &popts).unwrap());
    let out = Tensor::zeros(&[N4M], DType::F32).unwrap();
    for t in [1, 2] {
        let name = format!("add_4M_{t}t");
        let mut g = group(c, &name, t, N4M * 12);
        copy_baseline(&mut g, &name, t, N4M * 6);
        bench(&mut g, &name, "default", || a.add(&b).unwrap());
        bench_pool_beside(&mut g, &name, || a.add(&b).unwrap(), || a2.add(&b2).unwrap(), || pa.add(&pb).unwrap());
        bench(&mut g, &name, "inplace", || out.add_(&b).map(|_| ()).unwrap());
        bench(&mut g, &name, "out", || a.add_out(&b, &out).map(|_| ()).unwrap());
        bench_out_beside(&mut g, &name, || a.add_out(&b, &out).map(|_| ()).unwrap(), || a.add(&b).unwrap());
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || a.add(&b).unwrap(), copier(N4M * 6));
        }
        g.finish();
    }
}

/// `a + b` on 256K elements (1 MiB per operand, 3 MiB together: in this machine's caches), to
/// show how the kernel itself scales when memory bandwidth does not bound it.
fn add_cached(c: &mut Criterion) {
    const N: usize = 256 << 10;
    let (a, b) = (Tensor::rand(&[N], default_opts(9)).unwrap(), Tensor::rand(&[N], default_opts(10)).unwrap());
    let (a2, b2) = (another(&a), another(&b));
    let popts = default_opts(9).allocator(pool());
    let (pa, pb) = (Tensor::rand(&[N], &popts).unwrap(), Tensor::rand(&[N], &popts).unwrap());
    let out = Tensor::zeros(&[N], DType::F32).unwrap();
    for t in [1, 2] {
        let name = format!("add_256K_{t}t");
        let mut g = group(c, &name, t, N * 12);
        copy_baseline(&mut g, &name, t, N * 6);
        bench(&mut g, &name, "default", || a.add(&b).unwrap());
        bench_pool_beside(&mut g, &name, || a.add(&b).unwrap(), || a2.add(&b2).unwrap(), || pa.add(&pb).unwrap());
        bench(&mut g, &name, "inplace", || out.add_(&b).map(|_| ()).unwrap());
        bench(&mut g, &name, "out", || a.add_out(&b, &out).map(|_| ()).unwrap());
        bench_out_beside(&mut g, &name, || a.add_out(&b, &out).map(|_| ()).unwrap(), || a.add(&b).unwrap());
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || a.add(&b).unwrap(), copier(N * 6));
        }
        g.finish();
    }
}

fn add_broadcast_and_transposed(c: &mut Criterion) {
    let a = Tensor::rand(&[SIDE, SIDE], default_opts(3)).unwrap();
    let b = Tensor::rand(&[SIDE, SIDE], default_opts(4)).unwrap();
    let row = Tensor::rand(&[SIDE], default_opts(5)).unwrap();
    let at = a.t().unwrap();
    let (a2, b2, row2) = (another(&a), another(&b), another(&row));
    let at2 = a2.t().unwrap();
    let popts = default_opts(3).allocator(pool());
    let (pa, pb, prow) = (
        Tensor::rand(&[SIDE, SIDE], &popts).unwrap(),
        Tensor::rand(&[SIDE, SIDE], &popts).unwrap(),
        Tensor::rand(&[SIDE], &popts).unwrap(),
    );
    let pat = pa.t().unwrap();
    let out = Tensor::zeros(&[SIDE, SIDE], DType::F32).unwrap();
    for t in [1, 2] {
        let name = format!("broadcast_2048_{t}t");
        let mut g = group(c, &name, t, SIDE * SIDE * 8);
        copy_baseline(&mut g, &name, t, SIDE * SIDE * 4);
        bench(&mut g, &name, "default", || a.add(&row).unwrap());
        bench_pool_beside(&mut g, &name, || a.add(&row).unwrap(), || a2.add(&row2).unwrap(), || pa.add(&prow).unwrap());
        bench(&mut g, &name, "inplace", || out.add_(&row).map(|_| ()).unwrap());
        bench(&mut g, &name, "out", || a.add_out(&row, &out).map(|_| ()).unwrap());
        bench_out_beside(&mut g, &name, || a.add_out(&row, &out).map(|_| ()).unwrap(), || a.add(&row).unwrap());
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || a.add(&row).unwrap(), copier(SIDE * SIDE * 4));
        }
        g.finish();

        let name = format!("transposed_2048_{t}t");
        let mut g = group(c, &name, t, SIDE * SIDE * 12);
        copy_baseline(&mut g, &name, t, SIDE * SIDE * 6);
        bench(&mut g, &name, "contiguous_add", || a.add(&b).unwrap());
        bench(&mut g, &name, "default", || at.add(&b).unwrap());
        bench_pool_beside(&mut g, &name, || at.add(&b).unwrap(), || at2.add(&b2).unwrap(), || pat.add(&pb).unwrap());
        bench(&mut g, &name, "out", || at.add_out(&b, &out).map(|_| ()).unwrap());
        bench_out_beside(&mut g, &name, || at.add_out(&b, &out).map(|_| ()).unwrap(), || at.add(&b).unwrap());
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || at.add(&b).unwrap(), copier(SIDE * SIDE * 6));
        }
        g.finish();

        let name = format!("contiguous_of_transposed_2048_{t}t");
        let mut g = group(c, &name, t, SIDE * SIDE * 8);
        copy_baseline(&mut g, &name, t, SIDE * SIDE * 4);
        bench(&mut g, &name, "default", || at.contiguous().unwrap());
        bench_pool_beside(
            &mut g,
            &name,
            || at.contiguous().unwrap(),
            || at2.contiguous().unwrap(),
            || pat.contiguous().unwrap(),
        );
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || at.contiguous().unwrap(), copier(SIDE * SIDE * 4));
        }
        g.finish();
    }
}

fn sum(c: &mut Criterion) {
    let x = Tensor::rand(&[N4M], default_opts(6)).unwrap();
    let x2 = another(&x);
    let px = Tensor::rand(&[N4M], default_opts(6).allocator(pool())).unwrap();
    let words = vec![1u64; N4M / 2];
    let pools = [rayon_pool(1), rayon_pool(2)];
    let read = |t: usize| {
        black_box(pools[t - 1].install(|| par_read(black_box(&words))));
    };
    for t in [1, 2] {
        let name = format!("sum_4M_{t}t");
        let mut g = group(c, &name, t, N4M * 4);
        bench(&mut g, &name, "read", || read(t));
        bench(&mut g, &name, "default", || x.sum().unwrap());
        bench_pool_beside(&mut g, &name, || x.sum().unwrap(), || x2.sum().unwrap(), || px.sum().unwrap());
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || x.sum().unwrap(), read);
        }
        g.finish();
    }
}

fn matmul(c: &mut Criterion) {
    const M: usize = 512;
    let a = Tensor::rand(&[M, M], default_opts(7)).unwrap();
    let b = Tensor::rand(&[M, M], default_opts(8)).unwrap();
    let (a2, b2) = (another(&a), another(&b));
    let popts = default_opts(7).allocator(pool());
    let (pa, pb) = (Tensor::rand(&[M, M], &popts).unwrap(), Tensor::rand(&[M, M], &popts).unwrap());
    let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let mut dst = vec![0f32; M * M];
    let pools = [rayon_pool(1), rayon_pool(2)];
    // gemm's f32 kernel on a rayon pool of `t` workers, with `t` threads. Its arguments are
    // those `gemm::gemm` passes it for a row-major product: the transpose, `b^T * a^T`, into a
    // destination by columns (the kernels' preferred layout).
    let mut gemm_at = |t: usize| {
        pools[t - 1].install(|| {
            let par = if t > 1 { gemm_common::Parallelism::Rayon(t) } else { gemm_common::Parallelism::None };
            // SAFETY: all three are M x M row-major buffers of f32; dst is separate.
            unsafe {
                gemm_f32::gemm::f32::get_gemm_fn()(
                    M,
                    M,
                    M,
                    dst.as_mut_ptr(),
                    M as isize,
                    1,
                    false,
                    bv.as_ptr(),
                    M as isize,
                    1,
                    av.as_ptr(),
                    M as isize,
                    1,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    par,
                )
            };
        })
    };
    for t in [1, 2] {
        let name = format!("matmul_512_{t}t");
        let mut g = group(c, &name, t, 0);
        g.throughput(Throughput::Elements((2 * M * M * M) as u64));
        bench(&mut g, &name, "gemm_direct", || gemm_at(t));
        bench(&mut g, &name, "default", || a.matmul(&b).unwrap());
        bench_side_by_side(
            &mut g,
            &name,
            "beside_gemm",
            &mut [&mut || drop(black_box(a.matmul(&b).unwrap())), &mut || gemm_at(t)],
        );
        bench_pool_beside(
            &mut g,
            &name,
            || a.matmul(&b).unwrap(),
            || a2.matmul(&b2).unwrap(),
            || pa.matmul(&pb).unwrap(),
        );
        if t == 2 {
            bench_scaling_beside(&mut g, &name, || a.matmul(&b).unwrap(), &mut gemm_at);
        }
        g.finish();
    }
}

/// Half precision on 256K elements at 1 thread (cache-resident): the f16 and bf16 add, casts and
/// sum against the f32 add of the same elements and a copy of the f16 add's bytes, with the
/// f16 and f32 adds also side by side (`f16_beside_f32`: f16 / f32 of those calls); and the
/// same elements as a transposed 512x512 f16 matrix, made contiguous and cast to f32.
fn half_precision(c: &mut Criterion) {
    const N: usize = 256 << 10;
    let name = "half_256K_1t";
    let a = Tensor::rand(&[N], default_opts(11)).unwrap();
    let b = Tensor::rand(&[N], default_opts(12)).unwrap();
    let (ah, bh) = (a.to_dtype(DType::F16).unwrap(), b.to_dtype(DType::F16).unwrap());
    let (ab, bb) = (a.to_dtype(DType::BF16).unwrap(), b.to_dtype(DType::BF16).unwrap());
    let mut g = group(c, name, 1, N * 6);
    copy_baseline(&mut g, name, 1, N * 3);
    bench(&mut g, name, "f32_add", || a.add(&b).unwrap());
    bench(&mut g, name, "f16_add", || ah.add(&bh).unwrap());
    bench(&mut g, name, "bf16_add", || ab.add(&bb).unwrap());
    bench(&mut g, name, "f16_add_f32", || ah.add(&b).unwrap());
    bench(&mut g, name, "f16_strided_add", || {
        ah.slice(0, 0, N as isize, 2).unwrap().add(&bh.slice(0, 1, N as isize, 2).unwrap()).unwrap()
    });
    bench(&mut g, name, "f16_to_f32", || ah.to_dtype(DType::F32).unwrap());
    bench(&mut g, name, "f32_to_f16", || a.to_dtype(DType::F16).unwrap());
    bench(&mut g, name, "bf16_to_f32", || ab.to_dtype(DType::F32).unwrap());
    bench(&mut g, name, "f32_to_bf16", || a.to_dtype(DType::BF16).unwrap());
    let aht = ah.reshape(&[512, -1]).unwrap().t().unwrap();
    bench(&mut g, name, "f16_transposed_contiguous", || aht.contiguous().unwrap());
    bench(&mut g, name, "f16_transposed_to_f32", || aht.to_dtype(DType::F32).unwrap());
    bench(&mut g, name, "f16_sum", || ah.sum().unwrap());
    bench(&mut g, name, "bf16_sum", || ab.sum().unwrap());
    bench_side_by_side(
        &mut g,
        name,
        "f16_beside_f32",
        &mut [&mut || drop(black_box(ah.add(&bh).unwrap())), &mut || drop(black_box(a.add(&b).unwrap()))],
    );
    g.finish();
}

/// The ops of a GPT-2 block that compute more than they move, at 1 thread (item 10 above).
fn transformer_ops(c: &mut Criterion) {
    let name = "transformer_ops_1t";
    let x = Tensor::randn(&[1024, 3072], default_opts(13)).unwrap();
    let (xb, xh) = (x.to_dtype(DType::BF16).unwrap(), x.to_dtype(DType::F16).unwrap());
    let positive = x.abs().unwrap();
    let scores = Tensor::randn(&[12, 256, 256], default_opts(14)).unwrap();
    let logits = Tensor::randn(&[16, 50257], default_opts(18)).unwrap();
    let h = Tensor::randn(&[1024, 768], default_opts(15)).unwrap();
    let (w, b) = (Tensor::rand(&[768], default_opts(16)).unwrap(), Tensor::rand(&[768], default_opts(17)).unwrap());
    // The activation's 12 MB, read and written.
    let bytes = x.numel() * 4;
    let mut g = group(c, name, 1, bytes * 2);
    copy_baseline(&mut g, name, 1, bytes);
    bench(&mut g, name, "gelu", || x.gelu().unwrap());
    bench(&mut g, name, "gelu_bf16", || xb.gelu().unwrap());
    bench(&mut g, name, "gelu_f16", || xh.gelu().unwrap());
    // Arguments whose square is subnormal (multiply-adds keep the steps normal numbers).
    let small = x.mul_scalar(1e-20).unwrap();
    bench(&mut g, name, "gelu_of_1e-20_x", || small.gelu().unwrap());
    bench(&mut g, name, "gelu_tanh", || x.gelu_tanh().unwrap());
    bench(&mut g, name, "silu", || x.silu().unwrap());
    bench(&mut g, name, "exp", || x.exp().unwrap());
    bench(&mut g, name, "sigmoid", || x.sigmoid().unwrap());
    bench(&mut g, name, "tanh", || x.tanh().unwrap());
    bench(&mut g, name, "log", || positive.log().unwrap());
    bench(&mut g, name, "softmax_12x256x256", || scores.softmax(-1).unwrap());
    bench(&mut g, name, "log_softmax_16x50257", || logits.log_softmax(-1).unwrap());
    bench(&mut g, name, "layer_norm_1024x768", || h.layer_norm(&[768], Some(&w), Some(&b), 1e-5).unwrap());
    bench(&mut g, name, "rms_norm_1024x768", || h.rms_norm(&[768], Some(&w), None).unwrap());
    let (hb, wb, bb) =
        (h.to_dtype(DType::BF16).unwrap(), w.to_dtype(DType::BF16).unwrap(), b.to_dtype(DType::BF16).unwrap());
    bench(&mut g, name, "layer_norm_bf16_1024x768", || hb.layer_norm(&[768], Some(&wb), Some(&bb), 1e-5).unwrap());
    // Reductions over the tokens (a bias's gradient; dimension 0, read in place as columns) and
    // over the features (rows).
    bench(&mut g, name, "sum_over_tokens_1024x3072", || x.sum_dim(0, false).unwrap());
    bench(&mut g, name, "sum_over_features_1024x3072", || x.sum_dim(1, false).unwrap());
    bench(&mut g, name, "max_over_tokens_1024x3072", || x.max_dim(0, false).unwrap());
    bench(&mut g, name, "argmax_over_tokens_1024x3072", || x.argmax_dim(0, false).unwrap());
    // The f16 column sums (widened by F16C in the loop), and 49152 tasks of 16 columns.
    bench(&mut g, name, "sum_over_tokens_1024x3072_f16", || xh.sum_dim(0, false).unwrap());
    let narrow = x.view(&[49152, 4, 16]).unwrap();
    bench(&mut g, name, "sum_over_dim1_49152x4x16", || narrow.sum_dim(1, false).unwrap());
    // Mixed dtypes: f16 + f32 computes in f32 (converting blocks, the f32 operand and output
    // read and written where they lie).
    bench(&mut g, name, "add_f16_f32_1024x3072", || xh.add(&x).unwrap());
    // Rows read by blocks with a NaN flag beside the lanes (`kernels/extreme.rs`): greedy
    // decoding's argmax over the vocabulary, in f32 and f16, and the largest of all the values
    // (halves compared as integer keys).
    let logits_h = logits.to_dtype(DType::F16).unwrap();
    bench(&mut g, name, "argmax_logits_16x50257", || logits.argmax_dim(-1, false).unwrap());
    bench(&mut g, name, "argmax_logits_16x50257_f16", || logits_h.argmax_dim(-1, false).unwrap());
    bench(&mut g, name, "max_1024x3072", || x.max().unwrap());
    bench(&mut g, name, "max_1024x3072_bf16", || xb.max().unwrap());
    bench(&mut g, name, "max_1024x3072_f16", || xh.max().unwrap());
    // The AVX-512 blocks (the default where the CPU has AVX-512) or the AVX2 ones (the default
    // where it has AVX2 only, or under `TENSORMEM_CPU_CAPABILITY=avx2`) beside the one-vector
    // loop, call by call: blocks / one vector (1.0 on CPUs without AVX2, where both are the
    // loop, and for `tanh` on AVX2, which keeps the loop).
    let blocks = avx512_blocks_enabled();
    let blocks2 = avx2_blocks_enabled();
    // The bf16 row measures the blocks, not the tables (see below).
    let tables = half_tables_enabled();
    set_half_tables(false);
    let ops: [(&str, UnaryOp, &Tensor); 6] = [
        ("gelu_blocks_beside_one_vector", Tensor::gelu, &x),
        ("gelu_tanh_blocks_beside_one_vector", Tensor::gelu_tanh, &x),
        ("silu_blocks_beside_one_vector", Tensor::silu, &x),
        ("tanh_blocks_beside_one_vector", Tensor::tanh, &x),
        ("log_blocks_beside_one_vector", Tensor::log, &positive),
        ("gelu_bf16_blocks_beside_one_vector", Tensor::gelu, &xb),
    ];
    ops_beside(&mut g, name, &ops, &|on| {
        set_avx512_blocks(on && blocks);
        set_avx2_blocks(on && blocks2);
    });
    set_avx512_blocks(blocks);
    set_avx2_blocks(blocks2);
    // bf16 and f16 by their tables (the default) beside the same functions computed element by
    // element (`set_half_tables`), call by call: tables / computed.
    let ops: [(&str, UnaryOp, &Tensor); 5] = [
        ("gelu_bf16_tables_beside_computed", Tensor::gelu, &xb),
        ("gelu_f16_tables_beside_computed", Tensor::gelu, &xh),
        ("silu_bf16_tables_beside_computed", Tensor::silu, &xb),
        ("tanh_bf16_tables_beside_computed", Tensor::tanh, &xb),
        ("exp_f16_tables_beside_computed", Tensor::exp, &xh),
    ];
    ops_beside(&mut g, name, &ops, &|on| {
        set_half_tables(on && tables);
    });
    set_half_tables(tables);
    g.finish();
}

/// A unary op of the tensors, for [`ops_beside`].
type UnaryOp = fn(&Tensor) -> tensormem_tensor::Result<Tensor>;

/// [`bench_route_beside`] for each `(row, op, tensor)` of `ops`: `op(tensor)` on the route
/// `route(true)` chooses beside the route `route(false)` chooses.
fn ops_beside(
    g: &mut BenchmarkGroup<'_, WallTime>,
    group: &str,
    ops: &[(&str, UnaryOp, &Tensor)],
    route: &dyn Fn(bool),
) {
    for &(row, op, t) in ops {
        bench_route_beside(g, group, row, route, &|| drop(black_box(op(t).unwrap())));
    }
}

/// Half-precision matmul at 1 thread, beside the f32 product of the same sizes: 512^3 in f32,
/// f16 and bf16; bf16 and f16 also as a GPT-2 MLP layer (128 tokens x 768 by a 3072 x 768
/// weight, transposed, as `Linear` stores it); a decode step's token by a 768 x 3072 weight
/// with contiguous rows (GPT-2's `Conv1D`) in f32, bf16 and f16; and bf16 and f16 on their default route and
/// through f32 call by call (`*_default_beside_f32_route`: default / f32 route of those calls).
/// The default is AMX tiles where the CPU has them, else AVX512-BF16 registers for bf16, else
/// the f32 route (then both calls take it).
fn matmul_half(c: &mut Criterion) {
    const M: usize = 512;
    let name = "matmul_half_512_1t";
    let a = Tensor::rand(&[M, M], default_opts(7)).unwrap();
    let b = Tensor::rand(&[M, M], default_opts(8)).unwrap();
    let (ah, bh) = (a.to_dtype(DType::F16).unwrap(), b.to_dtype(DType::F16).unwrap());
    let (ab, bb) = (a.to_dtype(DType::BF16).unwrap(), b.to_dtype(DType::BF16).unwrap());
    let x = Tensor::randn(&[128, 768], default_opts(9)).unwrap().to_dtype(DType::BF16).unwrap();
    let w = Tensor::randn(&[3072, 768], default_opts(10)).unwrap().to_dtype(DType::BF16).unwrap();
    let (xh, wh) = (x.to_dtype(DType::F16).unwrap(), w.to_dtype(DType::F16).unwrap());
    let mut g = group(c, name, 1, 0);
    g.throughput(Throughput::Elements((2 * M * M * M) as u64));
    bench(&mut g, name, "f32", || a.matmul(&b).unwrap());
    bench(&mut g, name, "f16", || ah.matmul(&bh).unwrap());
    bench(&mut g, name, "bf16", || ab.matmul(&bb).unwrap());
    g.throughput(Throughput::Elements((2 * 128 * 768 * 3072) as u64));
    bench(&mut g, name, "bf16_gpt2_mlp", || x.matmul(&w.t().unwrap()).unwrap());
    bench(&mut g, name, "f16_gpt2_mlp", || xh.matmul(&wh.t().unwrap()).unwrap());
    // A decode step's token by a weight stored `[in, out]`, rows contiguous (GPT-2's `Conv1D`):
    // bf16 and f16 add its rows into f32 sums (`amx/few_rows_by_rows.rs`) on AVX2 CPUs; f32
    // (gemm) beside them.
    let tok = Tensor::randn(&[1, 768], default_opts(11)).unwrap();
    let conv = Tensor::randn(&[768, 3072], default_opts(12)).unwrap();
    let half = |t: &Tensor, dt| t.to_dtype(dt).unwrap();
    let (tokb, convb, tokh, convh) =
        (half(&tok, DType::BF16), half(&conv, DType::BF16), half(&tok, DType::F16), half(&conv, DType::F16));
    g.throughput(Throughput::Elements((2 * 768 * 3072) as u64));
    bench(&mut g, name, "f32_decode_conv1d", || tok.matmul(&conv).unwrap());
    bench(&mut g, name, "bf16_decode_conv1d", || tokb.matmul(&convb).unwrap());
    bench(&mut g, name, "f16_decode_conv1d", || tokh.matmul(&convh).unwrap());
    g.throughput(Throughput::Elements((2 * M * M * M) as u64));
    let routes = (amx_enabled(), avx512_bf16_enabled());
    let set = |(amx, dots): (bool, bool)| {
        set_amx(amx);
        set_avx512_bf16(dots);
    };
    for (row, l, r) in [("bf16_default_beside_f32_route", &ab, &bb), ("f16_default_beside_f32_route", &ah, &bh)] {
        bench_route_beside(&mut g, name, row, &|on| set(if on { routes } else { (false, false) }), &|| {
            drop(black_box(l.matmul(r).unwrap()))
        });
    }
    set(routes);
    g.finish();
}

/// Kernels 200 µs apart: whether the second thread is awake when the next kernel comes.
fn after_a_gap(c: &mut Criterion) {
    const N: usize = 1 << 20;
    let (a, b) = (Tensor::rand(&[N], default_opts(11)).unwrap(), Tensor::rand(&[N], default_opts(12)).unwrap());
    let name = "add_1M_after_200us_2t";
    let mut g = group(c, name, 2, N * 12);
    let before = kernel_spin();
    for (label, spin, gap) in [
        ("back_to_back", DEFAULT_KERNEL_SPIN, Duration::ZERO),
        ("spin_1ms", DEFAULT_KERNEL_SPIN, Duration::from_micros(200)),
        ("spin_0", Duration::ZERO, Duration::from_micros(200)),
    ] {
        set_kernel_spin(spin);
        g.bench_function(label, |bencher| {
            bencher.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    if !gap.is_zero() {
                        std::thread::sleep(gap);
                    }
                    let start = Instant::now();
                    black_box(a.add(&b).unwrap());
                    timed += start.elapsed();
                }
                timed
            })
        });
    }
    set_kernel_spin(before);
    g.finish();
}

criterion_group!(
    benches,
    add_contiguous,
    add_cached,
    add_broadcast_and_transposed,
    sum,
    matmul,
    half_precision,
    matmul_half,
    transformer_ops,
    after_a_gap
);

/// Where criterion writes its results, and so where `benches/ratios.py` reads this bench's
/// files beside them: `CRITERION_HOME`, else the target directory's `criterion` folder (this
/// binary runs from `<target>/<profile>/deps/`).
fn criterion_dir() -> std::path::PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return std::path::Path::new(&target).join("criterion");
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(|target| target.join("criterion")))
        .unwrap_or_else(|| "target/criterion".into())
}

fn main() {
    eprintln!("default allocator: {}", AllocatorRegistry::global().get().name());
    benches();
    Criterion::default().configure_from_args().final_summary();
    let dir = criterion_dir();
    let faults = FAULTS.lock().unwrap();
    if !faults.is_empty() {
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let json = serde_json::to_string_pretty(&*faults).expect("json");
        std::fs::write(dir.join("tensor_faults.json"), json).expect("write tensor_faults.json");
    }
    let side = SIDE_BY_SIDE.lock().unwrap();
    if !side.is_empty() {
        // By "group/row", of the calls side by side: for "group/pool", default / pool and
        // default / default_again; for "matmul_512_<t>t/beside_gemm", default / gemm; for
        // "group/out_beside", out / default; for
        // "group/scaling", the default's 1-thread time / its 2-thread time, and the baseline's.
        let ratios: BTreeMap<&String, Vec<f64>> = side
            .iter()
            .map(|(k, t)| {
                let r = match k.rsplit('/').next() {
                    Some("pool") => vec![t[1] / t[0], t[1] / t[2]],
                    Some("scaling") => vec![t[1] / t[0], t[3] / t[2]],
                    _ => vec![t[0] / t[1]],
                };
                (k, r)
            })
            .collect();
        let json = serde_json::to_string_pretty(&ratios).expect("json");
        std::fs::write(dir.join("tensor_side_by_side.json"), json).expect("write tensor_side_by_side.json");
    }
}
