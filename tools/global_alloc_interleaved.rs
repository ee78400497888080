//! `GlobalAllocator` against its bare backend, measured in alternating windows: each round times
//! a window of steps on one subject, then on the other (which goes first alternates), and the
//! ratio of the two windows is kept; the median and quartiles of the ratios are printed. Slow
//! drifts of a shared machine hit both windows of a round alike, so the ratio is steadier than
//! two criterion runs one after the other (`benches/global_allocator.rs` is the criterion bench;
//! the step is the same: 256 allocations, then their frees in another order).
//!
//! ```text
//! cargo run --release --example global_alloc_interleaved [ROUNDS]
//! TENSORMEM_GLOBAL_ALLOCATOR=jemalloc cargo run --release --example global_alloc_interleaved
//! ```

use std::alloc::System;
use std::time::Instant;

use tensormem::{GlobalAllocator, GlobalBackend};

/// Called directly (not this program's `#[global_allocator]`), as the bare backend is.
static GLOBAL: GlobalAllocator = GlobalAllocator::new();

#[path = "../benches/common/heap_step.rs"]
mod heap_step;
use heap_step::step;

/// Seconds for `steps` steps of `f` on each of `threads` threads at once.
fn window(threads: usize, steps: usize, f: &(dyn Fn() + Sync)) -> f64 {
    let t = Instant::now();
    if threads == 1 {
        (0..steps).for_each(|_| f());
    } else {
        std::thread::scope(|s| (0..threads).for_each(|_| drop(s.spawn(|| (0..steps).for_each(|_| f())))));
    }
    t.elapsed().as_secs_f64()
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200).max(4);
    let jemalloc = GLOBAL.backend() == GlobalBackend::Jemalloc;
    let backend = if jemalloc { "jemalloc" } else { "system" };
    for (size, base, spread, steps) in [("small", 16, 2000, 400), ("large", 64 << 10, 960 << 10, 4)] {
        for threads in [1, 2] {
            let bare = || {
                #[cfg(not(target_env = "msvc"))]
                if jemalloc {
                    return step(&tikv_jemallocator::Jemalloc, base, spread);
                }
                step(&System, base, spread)
            };
            let global = || step(&GLOBAL, base, spread);
            let mut ratios: Vec<f64> = (0..rounds)
                .map(|i| {
                    let (b, g) = if i % 2 == 0 {
                        let b = window(threads, steps, &bare);
                        (b, window(threads, steps, &global))
                    } else {
                        let g = window(threads, steps, &global);
                        (window(threads, steps, &bare), g)
                    };
                    g / b
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "{backend} {size} {threads} thread(s): global / bare median {:.3} (quartiles {:.3} .. {:.3}), {rounds} rounds",
                ratios[rounds / 2],
                ratios[rounds / 4],
                ratios[3 * rounds / 4]
            );
        }
    }
}
