//! CUDA allocators on a real device (feature `cuda`). Without a driver or device each test prints
//! one line saying it skips and why, unless `TENSORMEM_REQUIRE_CUDA=1`, which makes that a
//! failure (run them so on a GPU machine: `../shared/gpu/README.md`).

#![cfg(feature = "cuda")]

use std::sync::Arc;

use tensormem::allocators::cuda::{CudaAsyncAllocator, CudaDevice, CudaError, CudaHostAllocator, CudaSubAllocator};
use tensormem::{Allocator, AllocatorExt, BfcAllocator, MemorySpace, TrackingAllocator};

/// Device 0, or `None` after printing why the test skips.
fn device() -> Option<Arc<CudaDevice>> {
    let required = std::env::var("TENSORMEM_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(!required, "TENSORMEM_REQUIRE_CUDA=1 but: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn without_a_driver_or_device_constructors_fail_cleanly() {
    match CudaDevice::open(10_000) {
        Err(CudaError::NoDriver) => assert!(!tensormem::allocators::cuda::driver_present()),
        Err(CudaError::NoDevice { ordinal, count }) => {
            assert_eq!(ordinal, 10_000);
            assert_eq!(count, tensormem::allocators::cuda::device_count());
        }
        other => panic!("device 10000 opened: {other:?}"),
    }
    if !tensormem::allocators::cuda::driver_present() {
        assert!(tensormem::AllocatorRegistry::global().get_by_name("cuda:0").is_none());
        assert!(tensormem::device::devices().is_empty());
    }
}

#[test]
fn a_bfc_over_expandable_device_memory_gives_everything_back() {
    let Some(dev) = device() else { return };
    let (free_before, total) = dev.memory_info().unwrap();
    {
        let bfc = BfcAllocator::builder()
            .name("cuda:0-test")
            .memory_limit(total / 4)
            .sub_allocator(Arc::new(CudaSubAllocator::new(dev.clone())))
            .build()
            .unwrap();
        assert_eq!(bfc.memory_space(), MemorySpace::Device { ordinal: 0 });
        let tracked = TrackingAllocator::new(Arc::new(bfc));
        let mut held = Vec::new();
        for i in 0..64usize {
            let n = 1 + i * 37_000;
            held.push((tracked.allocate::<u8>(n).unwrap(), n));
        }
        let host = vec![7u8; 1 << 20];
        let mut back = vec![0u8; 1 << 20];
        let big = tracked.allocate::<u8>(1 << 20).unwrap();
        // SAFETY: `big` is 1 MiB of device 0's memory; the host buffers are 1 MiB each.
        unsafe {
            dev.copy_to_device(big.as_ptr(), host.as_ptr(), 1 << 20).unwrap();
            dev.copy_to_host(back.as_mut_ptr(), big.as_ptr(), 1 << 20).unwrap();
            tracked.deallocate(big, 1 << 20);
        }
        assert_eq!(back, host);
        for (p, n) in held {
            // SAFETY: each came from `allocate::<u8>(n)` on `tracked`.
            unsafe { tracked.deallocate(p, n) };
        }
        let err = tracked.allocate::<u8>(total as usize).unwrap_err();
        assert!(err.to_string().contains("cuda:0-test"), "{err}");
    }
    let (free_after, _) = dev.memory_info().unwrap();
    // Everything reserved, mapped and committed went back to the driver.
    assert!(free_after + (4 << 20) >= free_before, "free before {free_before}, after {free_after}");
}

#[test]
fn async_and_pinned_allocators_work_and_release() {
    let Some(dev) = device() else { return };
    let a = CudaAsyncAllocator::new(dev.clone(), 0).unwrap();
    assert_eq!(a.memory_space(), MemorySpace::Device { ordinal: 0 });
    let p = a.allocate::<f32>(1 << 20).unwrap();
    // SAFETY: `p` came from `allocate::<f32>(1 << 20)` on `a`.
    unsafe { a.deallocate(p, 1 << 20) };
    let h = CudaHostAllocator::new(dev);
    assert_eq!(h.memory_space(), MemorySpace::HostPinned);
    let q = h.allocate::<u32>(1024).unwrap();
    // SAFETY: pinned host memory is host-accessible: 1024 u32 were allocated.
    unsafe {
        q.as_ptr().write_bytes(0xab, 1024);
        assert_eq!(*q.as_ptr().add(1023), 0xabab_abab);
        h.deallocate(q, 1024);
    }
    assert_eq!(h.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn tensors_move_between_host_and_device() {
    use tensormem::tensor::{DType, Tensor, TensorError, TensorOptions};
    let Some(dev) = device() else { return };
    let (free_before, total) = dev.memory_info().unwrap();
    {
        let gpu: Arc<dyn Allocator> = Arc::new(
            BfcAllocator::builder()
                .name("cuda:0-tensors")
                .memory_limit(total / 8)
                .sub_allocator(Arc::new(CudaSubAllocator::new(dev.clone())))
                .build()
                .unwrap(),
        );
        let cpu: Arc<dyn Allocator> = Arc::new(tensormem::SystemAllocator::new());
        // Host -> device -> host, from a strided (transposed) host view.
        let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32).unwrap().view(&[3, 4]).unwrap().t().unwrap();
        let d = x.to_allocator(&gpu).unwrap();
        assert_eq!(d.storage().memory_space(), MemorySpace::Device { ordinal: 0 });
        assert_eq!(d.sizes(), [4, 3]);
        let back = d.to_allocator(&cpu).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        // A strided view of a device tensor comes back gathered.
        let col = d.select(1, 2).unwrap();
        assert_eq!(col.to_allocator(&cpu).unwrap().to_vec::<f32>().unwrap(), [8.0, 9.0, 10.0, 11.0]);
        // Device to device, and zeros created on the device.
        let d2 = d.to_allocator(&gpu).unwrap();
        assert_eq!(d2.to_allocator(&cpu).unwrap().to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        let z = Tensor::zeros(&[1000], TensorOptions::new().dtype(DType::I32).allocator(gpu.clone())).unwrap();
        assert_eq!(z.to_allocator(&cpu).unwrap().to_vec::<i32>().unwrap(), vec![0; 1000]);
        let full = Tensor::full(&[2, 2], 3.5, TensorOptions::new().allocator(gpu.clone())).unwrap();
        assert_eq!(full.to_allocator(&cpu).unwrap().to_vec::<f32>().unwrap(), [3.5; 4]);
        // Host kernels refuse the device tensor, naming the op and the device; Display copies.
        let err = d.add(&d).unwrap_err();
        assert!(matches!(err, TensorError::DeviceMemory { op: "add", .. }), "{err}");
        assert!(err.to_string().contains("cuda:0"), "{err}");
        assert!(full.to_string().ends_with("device='cuda:0')"), "{full}");
        // Out of device memory: an allocation error naming the allocator.
        let err = Tensor::zeros(&[total as usize], TensorOptions::new().dtype(DType::U8).allocator(gpu.clone()))
            .and_then(|t| t.materialize().map(|_| t))
            .unwrap_err();
        assert!(err.to_string().contains("cuda:0-tensors"), "{err}");
    }
    let (free_after, _) = dev.memory_info().unwrap();
    assert!(free_after + (4 << 20) >= free_before, "free before {free_before}, after {free_after}");
}
