//! What `GlobalAllocator` costs over its bare backend, calling both directly (neither is this
//! bench's `#[global_allocator]`): a malloc-heavy step of 256 allocations then their frees in
//! another order, small (16 B to 2 KiB) and large (64 KiB to 1 MiB) sizes, on 1 and 2 threads
//! (each thread runs its own steps; the time is wall time per step). The backend is what
//! `TENSORMEM_GLOBAL_ALLOCATOR` picks (system by default; run again with `=jemalloc`), the bare
//! subject the same backend called directly. Target: `global` within 1.05x of `bare` with
//! nothing watching. `global_leak_check` runs the small step inside a leak check on the calling
//! thread: the cost per allocation when something watches.
//!
//! Ratios: `python3 benches/ratios.py` after `cargo bench --bench global_allocator`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::System;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensormem::testing::LeakCheck;
use tensormem::{GlobalAllocator, GlobalBackend};

static GLOBAL: GlobalAllocator = GlobalAllocator::new();

#[path = "common/heap_step.rs"]
mod heap_step;
use heap_step::step;

/// `iters` steps on each of `threads` threads at once; the wall time.
fn timed(threads: usize, iters: u64, run: impl Fn() + Sync) -> Duration {
    if threads == 1 {
        let t = Instant::now();
        (0..iters).for_each(|_| run());
        return t.elapsed();
    }
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..iters).for_each(|_| run());
                })
            })
            .collect();
        barrier.wait();
        let t = Instant::now();
        hs.into_iter().for_each(|h| h.join().unwrap());
        t.elapsed()
    })
}

/// The backend `GLOBAL` uses, called directly.
enum Bare {
    System,
    #[cfg(not(target_env = "msvc"))]
    Jemalloc(tikv_jemallocator::Jemalloc),
}

impl Bare {
    fn run(&self, base: usize, spread: usize) {
        match self {
            Bare::System => step(&System, base, spread),
            #[cfg(not(target_env = "msvc"))]
            Bare::Jemalloc(j) => step(j, base, spread),
        }
    }
}

fn bench(c: &mut Criterion) {
    let bare = match GLOBAL.backend() {
        #[cfg(not(target_env = "msvc"))]
        GlobalBackend::Jemalloc => Bare::Jemalloc(tikv_jemallocator::Jemalloc),
        _ => Bare::System,
    };
    let backend = format!("{:?}", GLOBAL.backend()).to_lowercase();
    for (size, base, spread) in [("small", 16, 2000), ("large", 64 << 10, 960 << 10)] {
        for threads in [1, 2] {
            let mut g = c.benchmark_group(format!("global_{backend}_{size}_{threads}t"));
            g.throughput(Throughput::Elements(256));
            g.bench_function("bare", |b| b.iter_custom(|n| timed(threads, n, || bare.run(base, spread))));
            g.bench_function("global", |b| b.iter_custom(|n| timed(threads, n, || step(&GLOBAL, base, spread))));
            if size == "small" && threads == 1 {
                g.bench_function("global_leak_check", |b| {
                    let check = LeakCheck::start();
                    b.iter_custom(|n| timed(1, n, || step(&GLOBAL, base, spread)));
                    check.assert_no_leaks();
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
