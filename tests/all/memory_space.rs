//! Memory spaces in the allocator contract, checked on the CPU with a fake device: regions of
//! address space mapped with no access at all (`PROT_NONE`), reported as `cuda:0`. Any host read
//! or write of them would crash the test, so passing proves that the BFC, the decorators, the
//! pool and trace replay never touch device memory, and that tensors refuse it.

#![cfg(unix)]

use std::ptr::NonNull;
use std::sync::Arc;

use tensormem::allocators::{MemorySpace, SubAllocator};
use tensormem::{
    AllocationTrace, Allocator, AllocatorExt, BfcAllocator, PoolAllocator, RetryAllocator, SystemAllocator,
    TrackingAllocator, replay,
};
use tensormem_tensor::{DType, Tensor, TensorError, TensorOptions};

/// Regions of inaccessible memory that say they are device 0's.
#[derive(Debug)]
struct FakeDevice;

// SAFETY: regions come from `mmap` (page-aligned, `min_bytes` rounded up to pages, valid until
// `munmap`); "valid for reads and writes" holds in the device's sense: nothing on the host may
// touch them, which is what the test checks.
unsafe impl SubAllocator for FakeDevice {
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)> {
        let bytes = min_bytes.div_ceil(4096) * 4096;
        if alignment > 4096 {
            return None;
        }
        // SAFETY: an anonymous private mapping with no access: no file, no existing memory.
        let p = unsafe {
            libc::mmap(core::ptr::null_mut(), bytes, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(p.cast()).map(|p| (p, bytes))
    }

    unsafe fn free_region(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the caller gives back a region `alloc_region` mapped with this size.
        unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    }

    fn max_alignment(&self) -> usize {
        4096
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Device { ordinal: 0 }
    }

    fn device_memory_info(&self) -> Option<(u64, u64)> {
        Some((96 << 20, 80 << 30))
    }
}

fn device_bfc() -> Arc<BfcAllocator> {
    Arc::new(
        BfcAllocator::builder()
            .name("fake-cuda")
            .memory_limit(64 << 20)
            .sub_allocator(Arc::new(FakeDevice))
            .build()
            .unwrap(),
    )
}

#[test]
fn the_space_is_reported_and_forwarded() {
    let bfc = device_bfc();
    let dev = MemorySpace::Device { ordinal: 0 };
    assert_eq!(bfc.memory_space(), dev);
    assert_eq!(TrackingAllocator::new(bfc.clone()).memory_space(), dev);
    assert_eq!(RetryAllocator::new(bfc.clone()).memory_space(), dev);
    assert_eq!(tensormem::AllocatorWrapper::new(bfc.clone()).memory_space(), dev);
    let pool = PoolAllocator::builder(bfc.clone()).build().unwrap();
    assert_eq!(pool.memory_space(), dev);
    // No host memory behind a device pool: large requests stay on the device.
    assert!(pool.large_allocator().is_none());
    assert_eq!(SystemAllocator::new().memory_space(), MemorySpace::Host);
    assert_eq!(serde_json::to_string(&dev).unwrap(), r#"{"device":{"ordinal":0}}"#);
}

#[test]
fn allocators_hand_out_device_memory_without_touching_it() {
    let bfc = device_bfc();
    let tracked = TrackingAllocator::new(bfc.clone());
    let pool = PoolAllocator::builder(bfc.clone()).build().unwrap();
    let mut held = Vec::new();
    for n in [1usize, 255, 256, 4096, 100_000, 3 << 20] {
        held.push((tracked.allocate::<u8>(n).unwrap(), n, 0));
        held.push((pool.allocate::<u8>(n).unwrap(), n, 1));
    }
    assert_eq!(tracked.live_chunks().len(), 6);
    for (p, n, which) in held {
        // SAFETY: each came from the matching allocator's `allocate::<u8>(n)`.
        unsafe { if which == 0 { tracked.deallocate(p, n) } else { pool.deallocate(p, n) } }
    }
    assert_eq!(tracked.sizes().live_bytes, 0);
    assert!(pool.release_cached() > 0);
    assert!(bfc.release_cached() > 0);
}

#[test]
fn replay_skips_the_host_write_on_device_memory() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/traces/kv_cache_stress.json");
    let trace = AllocationTrace::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    let bfc = BfcAllocator::builder()
        .name("fake-cuda")
        .memory_limit(16 << 30)
        .sub_allocator(Arc::new(FakeDevice))
        .build()
        .unwrap();
    let r = replay(&trace, &bfc);
    assert_eq!(r.failed_allocations, 0);
    assert!(r.peak_in_use >= r.peak_requested && r.peak_requested > 0);
}

#[test]
fn device_tensors_are_created_but_host_code_refuses_them() {
    let fake = device_bfc();
    let bfc: Arc<dyn Allocator> = fake.clone();
    // Creation on a device allocator is lazy and touches nothing.
    let x = Tensor::zeros(&[4, 4], TensorOptions::new().dtype(DType::F32).allocator(bfc.clone())).unwrap();
    assert_eq!(x.storage().memory_space(), MemorySpace::Device { ordinal: 0 });
    // Host kernels and element access: an error naming the op, the allocator and the device.
    let host = Tensor::ones(&[4, 4], DType::F32).unwrap();
    for (op, result) in [
        ("to_vec", x.to_vec::<f32>().map(|_| ())),
        ("get", x.get::<f32>(&[0, 0]).map(|_| ())),
        ("set", x.set(&[0, 0], 1.0f32)),
        ("add_", x.add_(&host).map(|_| ())),
        ("as_slice", x.as_slice::<f32>().map(|_| ())),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, TensorError::DeviceMemory { device: MemorySpace::Device { ordinal: 0 }, .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.starts_with(op) && msg.contains("fake-cuda") && msg.contains("cuda:0"), "{msg}");
    }
    // A kernel with a fresh output is refused where the output would go: the device.
    let err = x.add(&host).unwrap_err();
    assert!(matches!(err, TensorError::DeviceMemory { op: "add", .. }), "{err}");
    let err = host.add(&x).unwrap_err();
    assert!(matches!(err, TensorError::DeviceMemory { .. }), "{err}");
    // Zero-filling and copying need the device's driver, which this fake has not: a clear
    // error, and nothing left allocated on the device.
    let err = x.materialize().unwrap_err();
    assert!(matches!(err, TensorError::Transfer { op: "materialize", .. }), "{err}");
    assert!(!x.storage().is_materialized());
    let err = host.to_allocator(&bfc).unwrap_err();
    assert!(matches!(err, TensorError::Transfer { op: "to_allocator", .. }), "{err}");
    assert!(err.to_string().to_lowercase().contains("cuda"), "{err}");
    let err = Tensor::full(&[3], 1.0, TensorOptions::new().allocator(bfc.clone())).unwrap_err();
    assert!(matches!(err, TensorError::Transfer { .. }), "{err}");
    // Still lazy, so it reads as zeros without the driver: shown from host zeros.
    assert!(x.to_string().starts_with("tensor([[0., 0.,") && x.to_string().ends_with("device='cuda:0')"), "{x}");
    let cpu: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    assert_eq!(x.select(1, 2).unwrap().to_allocator(&cpu).unwrap().to_vec::<f32>().unwrap(), [0.0; 4]);
    assert!(!x.storage().is_materialized());
    assert_eq!(bfc_in_use(&fake), 0);
    // Inside with_default_allocator(device), values built on the host have nowhere to go.
    let on_device =
        tensormem::with_default_allocator(bfc, || Tensor::scalar(2.0, DType::F32).and_then(|s| s.add(&host)));
    assert!(matches!(on_device, Err(TensorError::DeviceMemory { .. })), "{on_device:?}");
    assert_eq!(bfc_in_use(&fake), 0);
}

fn bfc_in_use(b: &BfcAllocator) -> u64 {
    b.stats().unwrap().bytes_in_use
}

#[test]
fn a_device_pointer_freed_into_a_host_tracker_is_refused() {
    let bfc = device_bfc();
    let p = bfc.allocate::<u8>(512).unwrap();
    let host = TrackingAllocator::new(Arc::new(SystemAllocator::new()));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: deliberately broken (the pointer is not the tracker's); the tracker refuses it
        // before anything reaches the system allocator.
        unsafe { host.deallocate(p, 512) }
    }));
    let msg = r.unwrap_err();
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("refusing"), "{msg}");
    // SAFETY: `p` came from `bfc.allocate::<u8>(512)` and was not freed (the tracker refused it).
    unsafe { bfc.deallocate(p, 512) };
    assert_eq!(bfc.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn a_device_out_of_memory_error_names_the_device_and_the_drivers_numbers() {
    let bfc = device_bfc();
    let held = bfc.allocate::<u8>(40 << 20).unwrap();
    let err = bfc.allocate::<u8>(30 << 20).unwrap_err();
    assert_eq!(err.device_memory(), Some((0, 96 << 20, 80 << 30)));
    assert_eq!(err.in_use(), Some(40 << 20));
    assert_eq!(err.limit(), Some(64 << 20));
    assert!(err.reserved().is_some_and(|r| r >= 40 << 20));
    assert!(err.largest_free_block().is_some());
    let msg = err.to_string();
    for part in ["'fake-cuda'", "30.0 MiB", "40.0 MiB in use of a 64.0 MiB limit", "reserved", "largest free block"] {
        assert!(msg.contains(part), "{part} missing: {msg}");
    }
    assert!(msg.ends_with("device cuda:0 has 96.0 MiB free of 80.0 GiB"), "{msg}");
    // SAFETY: `held` came from `allocate::<u8>(40 MiB)` on `bfc`.
    unsafe { bfc.deallocate(held, 40 << 20) };
    assert_eq!(bfc_in_use(&bfc), 0);
}
