//! The memory-efficiency targets on real request streams: PyTorch's own GPT-2 inference and
//! training streams (recorded on an H100), the shipped transformer trace and the KV-cache stress,
//! replayed on the allocators as a user gets them by default; plus the configuration keys and
//! `release_cached` through decorators and the registry.

use std::sync::Arc;

use tensormem::allocators::{ExpandableMemory, SplitPolicy};
use tensormem::{
    AllocConf, AllocationTrace, Allocator, AllocatorExt, AllocatorRegistry, AllocatorWrapper, BfcAllocator,
    PoolAllocator, ReplayReport, RetryAllocator, SystemAllocator, TrackingAllocator, replay,
};

fn trace(name: &str) -> AllocationTrace {
    let path = format!("{}/benches/traces/{name}.json", env!("CARGO_MANIFEST_DIR"));
    AllocationTrace::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The default growth configuration: a limit and allow_growth, nothing else.
fn default_bfc() -> BfcAllocator {
    BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).build().unwrap()
}

fn tensorflow_bfc() -> BfcAllocator {
    BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).tensorflow_policies().build().unwrap()
}

fn ratios(r: &ReplayReport) -> (f64, f64) {
    (r.reserved_over_requested().unwrap(), r.in_use_over_requested().unwrap())
}

#[test]
fn gpt2_inference_meets_the_targets_by_default() {
    let t = trace("torch_gpt2_inference");
    let r = replay(&t, &default_bfc());
    let (reserved, in_use) = ratios(&r);
    assert_eq!(r.failed_allocations, 0);
    assert!(reserved <= 1.05, "peak reserved / peak requested {reserved:.3} (PyTorch: 1.125, expandable 1.050)");
    assert!(in_use <= 1.02, "peak in use / peak requested {in_use:.3}");
    // TensorFlow's doubling regions and split rule, for comparison: the baseline.
    let tf = replay(&t, &tensorflow_bfc());
    let (tf_reserved, tf_in_use) = ratios(&tf);
    assert!((tf_reserved - 1.477).abs() < 0.01 && (tf_in_use - 1.296).abs() < 0.01, "{tf:?}");
}

/// The same without a peak headroom: reserved follows the placement, as with PyTorch's
/// expandable segments.
fn no_headroom_bfc() -> BfcAllocator {
    BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).peak_headroom(None).build().unwrap()
}

#[test]
#[cfg(target_os = "linux")]
fn gpt2_training_with_variable_lengths_meets_the_targets_by_default() {
    let t = trace("torch_gpt2_train_varlen");
    let bfc = default_bfc();
    assert_eq!(bfc.peak_headroom(), Some(tensormem::allocators::DEFAULT_PEAK_HEADROOM));
    let r = replay(&t, &bfc);
    bfc.check_invariants().unwrap();
    let (reserved, in_use) = ratios(&r);
    assert_eq!(r.failed_allocations, 0);
    assert!(in_use <= 1.02, "peak in use / peak requested {in_use:.3}");
    // 1.040 measured: the chunk trapped between live blocks makes room where the region would
    // grow, instead of the region growing (its pages move there if they were written; in this
    // replay, one byte per block, they are given back and fresh ones committed). PyTorch: 1.124,
    // expandable 1.069.
    assert!(reserved <= 1.045, "peak reserved / peak requested {reserved:.3}");
    // Without the headroom, placement alone leaves 1.068 (no placement rule tried does better
    // on this stream: `docs/peak-headroom.md`).
    let plain = ratios(&replay(&t, &no_headroom_bfc())).0;
    assert!(plain > 1.06 && plain < 1.075, "{plain:.3}");
    let tf = replay(&t, &tensorflow_bfc());
    assert!(ratios(&tf).0 > 1.25, "{tf:?}");
}

#[test]
fn the_default_headroom_leaves_streams_with_nothing_trapped_alone() {
    // Nothing trapped that is worth a move on the inference streams: the same as without it.
    for name in ["torch_gpt2_inference", "kv_cache_stress", "transformer_inference"] {
        let t = trace(name);
        let (default, plain) = (ratios(&replay(&t, &default_bfc())).0, ratios(&replay(&t, &no_headroom_bfc())).0);
        assert!((default - plain).abs() < 1e-9, "{name}: {default} vs {plain}");
    }
}

#[test]
fn a_peak_headroom_is_off_where_pages_cannot_move_and_can_be_turned_off() {
    // TensorFlow's regions: nothing to move.
    assert_eq!(tensorflow_bfc().peak_headroom(), None);
    assert_eq!(no_headroom_bfc().peak_headroom(), None);
    let set = BfcAllocator::builder().memory_limit(1 << 30).peak_headroom(Some(0.1)).build().unwrap();
    assert_eq!(set.peak_headroom(), Some(0.1));
    // Through the configuration keys as well.
    let off = AllocConf::parse("bfc.memory_limit=1GiB,bfc.peak_headroom=none").unwrap();
    assert_eq!(off.build_bfc().unwrap().peak_headroom(), None);
    let on = AllocConf::parse("bfc.memory_limit=1GiB,bfc.peak_headroom=0.02").unwrap();
    assert_eq!(on.build_bfc().unwrap().peak_headroom(), Some(0.02));
}

#[test]
fn the_shipped_transformer_trace_meets_the_targets() {
    let r = replay(&trace("transformer_inference"), &default_bfc());
    let (reserved, in_use) = ratios(&r);
    assert!(reserved <= 1.05 && in_use <= 1.02, "{reserved:.3} {in_use:.3}");
    assert_eq!(r.failed_allocations, 0);
}

#[test]
fn on_the_kv_cache_stress_doubling_loses_and_expandable_wins() {
    let t = trace("kv_cache_stress");
    let expandable = ratios(&replay(&t, &default_bfc())).0;
    let doubling = ratios(&replay(&t, &tensorflow_bfc())).0;
    assert!(expandable < 1.06, "{expandable:.3}");
    assert!(doubling > 1.5 * expandable.min(1.1), "doubling {doubling:.3} vs expandable {expandable:.3}");
}

#[test]
fn the_pool_wastes_at_most_a_quarter_on_gpt2_inference() {
    let pool = PoolAllocator::builder(Arc::new(SystemAllocator::new())).build().unwrap();
    let r = replay(&trace("torch_gpt2_inference"), &pool);
    let (reserved, _) = ratios(&r);
    assert!(reserved <= 1.25, "pool reserved / requested {reserved:.3} (power-of-two classes alone: 1.80)");
    // TensorFlow's pool (every size in power-of-two free lists) for comparison.
    let tf = PoolAllocator::builder(Arc::new(SystemAllocator::new())).large_threshold(None).build().unwrap();
    assert!(ratios(&replay(&trace("torch_gpt2_inference"), &tf)).0 > 1.7);
}

#[test]
fn release_cached_goes_through_every_decorator_and_the_registry() {
    let bfc: Arc<dyn Allocator> = Arc::new(default_bfc());
    let stacked: Arc<dyn Allocator> = Arc::new(RetryAllocator::new(Arc::new(AllocatorWrapper::new(Arc::new(
        TrackingAllocator::new(Arc::clone(&bfc)),
    )))));
    let p = stacked.allocate::<u8>(8 << 20).unwrap();
    // SAFETY: freed once with its count.
    unsafe { stacked.deallocate(p, 8 << 20) };
    assert_eq!(bfc.stats().unwrap().bytes_reserved, 8 << 20);
    assert_eq!(stacked.release_cached(), 8 << 20);
    assert_eq!(bfc.stats().unwrap().bytes_reserved, 0);

    let registry = AllocatorRegistry::new();
    let pool: Arc<dyn Allocator> = Arc::new(PoolAllocator::builder(Arc::new(SystemAllocator::new())).build().unwrap());
    registry.register("bfc", 0, Arc::clone(&bfc)).unwrap();
    registry.register("bfc-again", 1, Arc::clone(&bfc)).unwrap();
    registry.register("pool", 2, Arc::clone(&pool)).unwrap();
    registry.register("cpu", 3, Arc::new(SystemAllocator::new())).unwrap();
    let a = bfc.allocate::<u8>(3 << 20).unwrap();
    let b = pool.allocate::<u8>(4000).unwrap();
    // SAFETY: freed once with their counts.
    unsafe {
        bfc.deallocate(a, 3 << 20);
        pool.deallocate(b, 4000);
    }
    // The BFC's 4 MiB once (though registered twice), the pool's cached 4 KiB buffer.
    assert_eq!(registry.release_cached(), (4 << 20) + 4096);
    assert_eq!(registry.release_cached(), 0);
}

#[test]
fn the_configuration_keys_of_the_caching_allocators() {
    let c = AllocConf::parse(
        "bfc.memory_limit=1GiB, bfc.expandable=false, bfc.growth_granule=4MiB, bfc.split=pytorch, \
         bfc.release_threshold=64MiB, bfc.first_fit_above=none, bfc.peak_headroom=0.04, pool.large_threshold=none",
    )
    .unwrap();
    assert_eq!(c.bfc_expandable, Some(false));
    assert_eq!(c.bfc_growth_granule, Some(4 << 20));
    assert_eq!(c.bfc_split, Some(SplitPolicy::PyTorch));
    assert_eq!(c.bfc_release_threshold, Some(Some(64 << 20)));
    assert_eq!(c.bfc_first_fit_above, Some(None));
    assert_eq!(c.bfc_peak_headroom, Some(Some(0.04)));
    assert_eq!(AllocConf::parse("bfc.peak_headroom=none").unwrap().bfc_peak_headroom, Some(None));
    assert_eq!(c.pool_large_threshold, Some(None));
    assert!(!c.build_bfc().unwrap().is_expandable());
    assert!(c.build_pool(Arc::new(SystemAllocator::new())).unwrap().large_allocator().is_none());
    let split = AllocConf::parse("bfc.split=remainder:1MiB").unwrap().bfc_split;
    assert_eq!(split, Some(SplitPolicy::Remainder(1 << 20)));
    assert_eq!(AllocConf::parse("bfc.split=TensorFlow").unwrap().bfc_split, Some(SplitPolicy::TensorFlow));
    for bad in [
        "bfc.split=best",
        "bfc.growth_granule=0",
        "bfc.release_threshold=lots",
        "pool.large_threshold=0",
        "bfc.peak_headroom=-0.1",
        "bfc.peak_headroom=inf",
        "bfc.peak_headroom=4%",
    ] {
        let err = AllocConf::parse(bad).unwrap_err().to_string();
        let key = bad.split('=').next().unwrap();
        assert!(err.contains(&format!("for {key}: expected")), "{bad}: {err}");
    }
    // The default BFC from the configuration is expandable with the default split.
    let bfc = AllocConf::parse("bfc.memory_limit=1GiB").unwrap().build_bfc().unwrap();
    assert!(bfc.is_expandable());
    let memory = tensormem::allocators::OsMemory;
    assert_eq!(memory.granule(), 4096);
}

/// A BFC on device memory as `cuda:N` builds it (the default configuration over memory mapped
/// in the device's 2 MiB granules, each with a physical allocation of its own), on a fake
/// device that keeps the driver's mapping rules over host memory: it reserves what the host BFC
/// reserves on every stream, because free units move and go back as host pages do. With one
/// mapping per commit (given back only whole, never moved) it could not.
#[test]
#[cfg(target_os = "linux")]
fn device_units_reserve_what_host_pages_do_on_every_stream() {
    use tensormem::allocators::FakeDeviceSubAllocator;
    let device_bfc = |sub: Arc<dyn tensormem::allocators::SubAllocator>| {
        BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).sub_allocator(sub).build().unwrap()
    };
    for name in ["torch_gpt2_inference", "torch_gpt2_train_varlen", "transformer_inference", "kv_cache_stress"] {
        let t = trace(name);
        let host = ratios(&replay(&t, &default_bfc())).0;
        let sub = Arc::new(FakeDeviceSubAllocator::new(2 << 20, 80 << 30));
        let bfc = device_bfc(sub.clone());
        let r = replay(&t, &bfc);
        bfc.check_invariants().unwrap();
        let device = ratios(&r).0;
        assert_eq!(r.failed_allocations, 0);
        assert!(device <= host + 0.002 && device <= 1.055, "{name}: device {device:.3}, host {host:.3}");
        drop(bfc);
        let driver = sub.memory().driver();
        assert!(driver.violations().is_empty(), "{name}: {:?}", driver.violations());
        assert_eq!((driver.used_bytes(), driver.mappings()), (0, 0), "{name}: everything is given back");

        if name == "torch_gpt2_train_varlen" {
            let whole = ratios(&replay(&t, &device_bfc(Arc::new(WholeCommits::new())))).0;
            assert!(whole > device + 0.02, "one mapping per commit: {whole:.3}, units: {device:.3}");
        }
    }
}

/// Device memory as it was mapped before units: one mapping per commit, given back only whole
/// and never moved (the fake device's units behind flags that say so).
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct WholeCommits(tensormem::allocators::FakeDeviceSubAllocator);

#[cfg(target_os = "linux")]
impl WholeCommits {
    fn new() -> Self {
        Self(tensormem::allocators::FakeDeviceSubAllocator::new(2 << 20, 80 << 30))
    }
}

// SAFETY: every call goes to the fake device's unit memory, which keeps the contract; saying
// that it neither decommits partially nor relocates only makes callers ask less of it.
#[cfg(target_os = "linux")]
unsafe impl ExpandableMemory for WholeCommits {
    fn granule(&self) -> usize {
        self.0.memory().granule()
    }
    fn reserve(&self, bytes: usize) -> std::io::Result<std::ptr::NonNull<u8>> {
        self.0.memory().reserve(bytes)
    }
    unsafe fn commit(&self, ptr: std::ptr::NonNull<u8>, bytes: usize) -> std::io::Result<()> {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.0.memory().commit(ptr, bytes) }
    }
    unsafe fn decommit(&self, ptr: std::ptr::NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.0.memory().decommit(ptr, bytes) }
    }
    unsafe fn release(&self, ptr: std::ptr::NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.0.memory().release(ptr, bytes) }
    }
    fn decommits_partially(&self) -> bool {
        false
    }
    fn name(&self) -> &str {
        "whole-commits"
    }
}

// SAFETY: no plain regions; the expandable memory is the fake device's.
#[cfg(target_os = "linux")]
unsafe impl tensormem::allocators::SubAllocator for WholeCommits {
    fn alloc_region(&self, _: usize, _: usize) -> Option<(std::ptr::NonNull<u8>, usize)> {
        None
    }
    unsafe fn free_region(&self, _: std::ptr::NonNull<u8>, _: usize) {}
    fn max_alignment(&self) -> usize {
        self.granule()
    }
    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        Some(self)
    }
}
