//! Quickstart: take the allocator from the global registry (honouring `TENSORMEM_ALLOCATOR`),
//! run an inference-shaped allocation workload through a `TrackingAllocator`, and print what
//! happened.
//!
//! ```text
//! cargo run --release --example quickstart
//! TENSORMEM_ALLOCATOR=cpu cargo run --release --example quickstart
//! ```

use std::alloc::Layout;
use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use tensormem::{AllocationAttributes, Allocator, AllocatorRegistry, AllocatorStats, ByteSize, TrackingAllocator};

/// Weights kept for the whole run, activations per layer, temporaries per op.
const LAYERS: usize = 12;
const STEPS: usize = 200;

fn main() -> ExitCode {
    let registry = AllocatorRegistry::global();
    let base = match registry.try_get() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    println!("registered allocators (name, priority):");
    for e in registry.entries() {
        println!("  {:<10} {:>4}", e.name, e.priority);
    }
    match registry.selected() {
        Some(name) => println!("selected by TENSORMEM_ALLOCATOR: {name}"),
        None => println!("selected by priority: {}", base.name()),
    }

    let tracker = TrackingAllocator::new(Arc::clone(&base));
    let started = Instant::now();
    let (ops, peak_live_chunks) = match workload(&tracker) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = started.elapsed();

    let sizes = tracker.sizes();
    println!();
    println!(
        "workload: {ops} allocations and frees in {:.1} ms ({:.0} ns per alloc+free pair)",
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e9 / ops as f64
    );
    println!(
        "tracker:  total {} allocated, high watermark {}, live now {}, most live chunks at once {}",
        ByteSize(sizes.total_bytes),
        ByteSize(sizes.high_watermark),
        ByteSize(sizes.live_bytes),
        peak_live_chunks
    );
    println!();
    print_table(base.name(), &tracker.stats().unwrap_or_default(), base.stats().as_ref());
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    if let Ok(js) = tensormem::JemallocAllocator::jemalloc_stats() {
        println!();
        println!(
            "jemalloc (process): allocated {}, active {}, resident {}, mapped {}, retained {}, metadata {}",
            ByteSize(js.allocated),
            ByteSize(js.active),
            ByteSize(js.resident),
            ByteSize(js.mapped),
            ByteSize(js.retained),
            ByteSize(js.metadata)
        );
    }
    let leaked = tracker.live_chunks();
    if !leaked.is_empty() {
        eprintln!("error: {} allocations were not freed: {:?}", leaked.len(), &leaked[..leaked.len().min(5)]);
        return ExitCode::FAILURE;
    }
    println!();
    println!("no leaks: every allocation was freed");
    ExitCode::SUCCESS
}

/// A block allocated through the tracker, freed on drop.
struct Block<'a> {
    alloc: &'a TrackingAllocator,
    ptr: NonNull<u8>,
    layout: Layout,
}

impl<'a> Block<'a> {
    fn new(alloc: &'a TrackingAllocator, size: usize) -> Result<Self, tensormem::AllocError> {
        let layout = Layout::from_size_align(size, 64).expect("sizes here are small and aligned to 64");
        let ptr = alloc.allocate_raw(layout, &AllocationAttributes::default())?;
        // SAFETY: `ptr` is valid for `size` bytes; touch the first and last byte like a kernel would.
        unsafe {
            ptr.as_ptr().write(1);
            ptr.as_ptr().add(size - 1).write(1);
        }
        Ok(Self { alloc, ptr, layout })
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated in `Block::new` with `layout` and freed only here.
        unsafe { self.alloc.deallocate_raw(self.ptr, self.layout) };
    }
}

/// Returns the number of allocations and the most chunks live at once.
fn workload(t: &TrackingAllocator) -> Result<(usize, usize), tensormem::AllocError> {
    let mut ops = 0;
    let mut most_live = 0;
    // Weights: 2 matrices per layer, kept for the whole run.
    let weights: Vec<Block<'_>> =
        (0..LAYERS * 2).map(|i| Block::new(t, (256 + 64 * (i % 5)) << 10)).collect::<Result<_, _>>()?;
    ops += weights.len();
    let mut rng = 0x9e37_79b9_u64;
    for step in 0..STEPS {
        let mut activations = Vec::with_capacity(LAYERS);
        for layer in 0..LAYERS {
            activations.push(Block::new(t, (32 + (step % 8) * 8 + layer) << 10)?);
            // Temporaries of many sizes, gone by the end of the layer.
            let temps: Vec<Block<'_>> = (0..6)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    Block::new(t, 64 + (rng % 16_384) as usize)
                })
                .collect::<Result<_, _>>()?;
            ops += 1 + temps.len();
            let s = t.stats().unwrap_or_default();
            most_live = most_live.max((s.num_allocs - s.num_frees) as usize);
            // Keep only the last two layers' activations, as a forward pass does.
            if activations.len() > 2 {
                activations.remove(0);
            }
        }
    }
    drop(weights);
    Ok((ops, most_live))
}

/// A table row: label, how to read the figure, whether it is in bytes.
type Row = (&'static str, fn(&AllocatorStats) -> Option<u64>, bool);

fn print_table(name: &str, tracked: &AllocatorStats, inner: Option<&AllocatorStats>) {
    let col = |v: Option<u64>, bytes: bool| match v {
        None => "-".to_owned(),
        Some(v) if bytes => format!("{} ({v})", ByteSize(v)),
        Some(v) => v.to_string(),
    };
    println!("{:<22} {:>28} {:>28}", "figure", "through the tracker", format!("allocator '{name}'"));
    let rows: [Row; 8] = [
        ("allocations", |s| Some(s.num_allocs), false),
        ("frees", |s| Some(s.num_frees), false),
        ("bytes in use", |s| Some(s.bytes_in_use), true),
        ("peak bytes in use", |s| Some(s.peak_bytes_in_use), true),
        ("largest allocation", |s| Some(s.largest_alloc_size), true),
        ("limit", |s| s.bytes_limit, true),
        ("retries", |s| Some(s.num_alloc_retries), false),
        ("out-of-memory errors", |s| Some(s.num_ooms), false),
    ];
    for (label, get, bytes) in rows {
        println!(
            "{label:<22} {:>28} {:>28}",
            col(get(tracked), bytes),
            inner.map_or("-".to_owned(), |s| col(get(s), bytes))
        );
    }
}
