//! Element-wise additions whose iteration plans have runs of every length, timed at one kernel
//! thread: the shapes where the plan's call per 1-D run costs the most (a few elements per run)
//! beside ones where it is amortised (long runs, tiles, one contiguous run). It prints the best
//! mean of seven rounds of ten calls per shape, in ms; run it under
//! `valgrind --tool=callgrind` for instruction counts that do not move with the machine's load
//! (see `docs/iteration-plans.md`).
//!
//! `cargo run --release -p tensormem-tensor --example short_runs`

use std::time::Instant;
use tensormem_tensor::{Tensor, TensorOptions};

/// Prints the best mean time of `f` over seven rounds of ten calls, after three warm-up calls.
fn time(name: &str, mut f: impl FnMut()) {
    for _ in 0..3 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..10 {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / 10.0);
    }
    println!("{name:44} {:9.3} ms", best * 1e3);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tensormem_tensor::set_num_threads(1);
    let o = TensorOptions::default();
    let (a, b) = (Tensor::rand(&[1 << 22], &o)?, Tensor::rand(&[1 << 22], &o)?);
    time("a + b, 4M contiguous (one run)", || drop(a.add(&b).expect("add")));
    let (a, b) = (Tensor::rand(&[1 << 20, 3], &o)?, Tensor::rand(&[3], &o)?);
    time("[1M, 3] + [3] (runs of 3)", || drop(a.add(&b).expect("add")));
    let (a, b) = (Tensor::rand(&[1 << 19, 8], &o)?, Tensor::rand(&[8], &o)?);
    time("[512K, 8] + [8] (runs of 8)", || drop(a.add(&b).expect("add")));
    let (a, b) = (Tensor::rand(&[2048, 2048], &o)?, Tensor::rand(&[2048], &o)?);
    time("[2048, 2048] + [2048] (runs of 2048)", || drop(a.add(&b).expect("add")));
    let at = a.t()?;
    time("a.t() + a, 2048^2 (tiled)", || drop(at.add(&a).expect("add")));
    let x = Tensor::rand(&[64, 2, 4096], &o)?.select(1, 0)?;
    time("[64, 4096] slice of [64, 2, 4096] (runs of 4096)", || drop(x.add(&x).expect("add")));
    Ok(())
}
