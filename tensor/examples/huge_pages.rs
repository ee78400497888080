//! Memory-bound tensor ops on the default pool's large blocks in transparent huge pages against
//! the same pool with 4 KiB pages (`PoolBuilder::huge_pages(false)`), in one process: each op's
//! calls alternate between the two sets of tensors, 300 calls each, and the medians are printed
//! with their ratio. Two processes cannot be compared so: on a VM, where a process's memory lands
//! moved these ops by up to 30% between processes.
//!
//! ```text
//! cargo run --release --example huge_pages [-- THREADS [4k_first]]
//! ```
use std::sync::Arc;
use std::time::Instant;

use tensormem::{Allocator, PoolAllocator, SystemAllocator};
use tensormem_tensor::{DType, Result, Tensor, TensorOptions, set_num_threads};

/// Operands of 4M f32 elements (16 MiB each) and an output, from a pool with or without huge pages.
struct Set {
    huge: bool,
    a: Tensor,
    b: Tensor,
    out: Tensor,
}

impl Set {
    fn new(huge: bool) -> std::result::Result<Self, Box<dyn std::error::Error>> {
        let pool = PoolAllocator::builder(Arc::new(SystemAllocator::new())).huge_pages(huge).build()?;
        let opts = TensorOptions::new().dtype(DType::F32).allocator(Arc::new(pool) as Arc<dyn Allocator>);
        let a = Tensor::rand(&[4 << 20], opts.clone().seed(1))?;
        let b = Tensor::rand(&[4 << 20], opts.clone().seed(2))?;
        let out = Tensor::zeros(&[4 << 20], &opts)?;
        Ok(Self { huge, a, b, out })
    }
}

type Op = fn(&Set) -> Result<()>;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(Ok(1), |s| s.parse())?;
    set_num_threads(threads);
    // The set made first may get different memory: `4k_first` swaps the order.
    let sets = if args.get(2).is_some_and(|s| s == "4k_first") {
        [Set::new(false)?, Set::new(true)?]
    } else {
        [Set::new(true)?, Set::new(false)?]
    };
    let ops: [(&str, Op); 4] = [
        ("a += b", |s| s.out.add_(&s.b).map(drop)),
        ("a + b", |s| s.a.add(&s.b).map(drop)),
        ("a + b, out=", |s| s.a.add_out(&s.b, &s.out).map(drop)),
        ("sum", |s| s.a.sum().map(drop)),
    ];
    println!("| op, 4M f32, {threads} thread(s) | huge pages, ms | 4 KiB pages, ms | huge / 4 KiB |");
    println!("|---|---:|---:|---:|");
    for (name, op) in ops {
        let mut times = [Vec::new(), Vec::new()];
        for round in 0..300 {
            for i in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                let start = Instant::now();
                op(&sets[i])?;
                times[i].push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        let [m0, m1] = times.map(|mut t| median(&mut t));
        let (huge, small) = if sets[0].huge { (m0, m1) } else { (m1, m0) };
        println!("| {name} | {huge:.3} | {small:.3} | {:.3} |", huge / small);
    }
    Ok(())
}
