//! Alloc+free pairs of 64 B, 4 KiB and 1 MiB at 1 and 2 threads, for the raw allocators, our
//! backends, the TrackingAllocator, and a tracker built like TensorFlow's (one Mutex<HashMap>).
//!
//! Each benchmark's element is one alloc+free pair per thread; at 2 threads both threads run
//! their pairs at once and the time is wall time, so throughput reads as pairs per second for the
//! whole process. Ratios: `python3 benches/ratios.py` after `cargo bench --bench allocators`.

// criterion_group! generates an undocumented `pub fn benches()`.
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tensormem::{AllocError, AllocationAttributes, Allocator, AllocatorStats, SystemAllocator, TrackingAllocator};

const SIZES: [(usize, &str); 3] = [(64, "64B"), (4096, "4KiB"), (1 << 20, "1MiB")];

/// One alloc+free pair of `layout`.
trait Pair: Sync {
    fn pair(&self, layout: Layout);
}

struct RawSystem;
impl Pair for RawSystem {
    #[inline]
    fn pair(&self, layout: Layout) {
        // SAFETY: non-zero layout; the block is freed at once with the same layout.
        unsafe {
            let p = System.alloc(layout);
            assert!(!p.is_null());
            System.dealloc(black_box(p), layout);
        }
    }
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
struct RawJemalloc;
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
impl Pair for RawJemalloc {
    #[inline]
    fn pair(&self, layout: Layout) {
        // SAFETY: non-zero layout; the block is freed at once with the same layout.
        unsafe {
            let p = tikv_jemallocator::Jemalloc.alloc(layout);
            assert!(!p.is_null());
            tikv_jemallocator::Jemalloc.dealloc(black_box(p), layout);
        }
    }
}

struct Ours<A>(A);
impl<A: Allocator> Pair for Ours<A> {
    #[inline]
    fn pair(&self, layout: Layout) {
        let p = self.0.allocate_raw(layout, &AllocationAttributes::DEFAULT).unwrap();
        // SAFETY: `p` was just allocated with `layout`.
        unsafe { self.0.deallocate_raw(black_box(p), layout) };
    }
}

/// A tracker built like TensorFlow's TrackingAllocator: one mutex over the chunk map and the
/// byte counters, held for each allocation's and free's bookkeeping.
#[derive(Debug)]
struct MutexTracker {
    inner: Arc<dyn Allocator>,
    state: Mutex<TfState>,
}

#[derive(Debug, Default)]
struct TfState {
    in_use: HashMap<usize, (usize, usize, u64), BuildHasherDefault<PtrHasher>>,
    allocated: u64,
    high_watermark: u64,
    total_bytes: u64,
    next_id: u64,
}

/// The same cheap pointer hash as the TrackingAllocator's, so that only the locking differs.
#[derive(Default)]
struct PtrHasher(u64);
impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 32)
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only usize keys are hashed")
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
}

// SAFETY: forwards to `inner`, which keeps the contract; bookkeeping only.
unsafe impl Allocator for MutexTracker {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        let p = self.inner.allocate_raw(layout, attrs)?;
        let allocated = self.inner.allocated_size_slow(p).unwrap_or(layout.size());
        let mut s = self.state.lock().unwrap();
        s.next_id += 1;
        let id = s.next_id;
        s.in_use.insert(p.as_ptr() as usize, (layout.size(), allocated, id));
        s.allocated += allocated as u64;
        s.total_bytes += allocated as u64;
        s.high_watermark = s.high_watermark.max(s.allocated);
        Ok(p)
    }
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        {
            let mut s = self.state.lock().unwrap();
            let (_, allocated, _) = s.in_use.remove(&(ptr.as_ptr() as usize)).expect("tracked");
            s.allocated -= allocated as u64;
        }
        // SAFETY: the caller's promise carries over to `inner`.
        unsafe { self.inner.deallocate_raw(ptr, layout) }
    }
    fn stats(&self) -> Option<AllocatorStats> {
        self.inner.stats()
    }
}

/// Runs `iters` pairs on each of `threads` threads and returns the wall time.
fn run(subject: &dyn Pair, layout: Layout, threads: usize, iters: u64) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        for _ in 0..iters {
            subject.pair(layout);
        }
        return start.elapsed();
    }
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..iters {
                    subject.pair(layout);
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

fn subjects() -> Vec<(&'static str, Box<dyn Pair>)> {
    let mut v: Vec<(&'static str, Box<dyn Pair>)> =
        vec![("raw_std_alloc", Box::new(RawSystem)), ("system_allocator", Box::new(Ours(SystemAllocator::new())))];
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    {
        let je = || -> Arc<dyn Allocator> { Arc::new(tensormem::JemallocAllocator::new()) };
        v.push(("raw_jemalloc", Box::new(RawJemalloc)));
        v.push(("jemalloc_allocator", Box::new(Ours(je()))));
        v.push(("tracking_over_jemalloc", Box::new(Ours(TrackingAllocator::new(je())))));
        v.push((
            "mutex_hashmap_tracker_over_jemalloc",
            Box::new(Ours(MutexTracker { inner: je(), state: Mutex::default() })),
        ));
    }
    #[cfg(not(all(feature = "jemalloc", not(target_env = "msvc"))))]
    {
        let sys = || -> Arc<dyn Allocator> { Arc::new(SystemAllocator::new()) };
        v.push(("tracking_over_system", Box::new(Ours(TrackingAllocator::new(sys())))));
        v.push((
            "mutex_hashmap_tracker_over_system",
            Box::new(Ours(MutexTracker { inner: sys(), state: Mutex::default() })),
        ));
    }
    // Create every per-thread structure (and any first-use heap allocation) before measuring, so
    // that the heap layout the raw allocators see does not change half-way through.
    for (_, subject) in &v {
        for (size, _) in SIZES {
            subject.pair(Layout::from_size_align(size, 16).unwrap());
        }
    }
    v
}

fn alloc_free_pairs(c: &mut Criterion) {
    let subjects = subjects();
    for threads in [1usize, 2] {
        for (size, label) in SIZES {
            let mut group = c.benchmark_group(format!("pair_{label}_{threads}t"));
            group.throughput(Throughput::Elements(threads as u64));
            let layout = Layout::from_size_align(size, 16).unwrap();
            for (name, subject) in &subjects {
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| run(subject.as_ref(), layout, threads, iters))
                });
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = alloc_free_pairs
}
criterion_main!(benches);
