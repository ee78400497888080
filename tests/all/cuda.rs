//! CUDA allocators on a real device (feature `cuda`). Without a driver or device each test prints
//! one line saying it skips and why, unless `TENSORMEM_REQUIRE_CUDA=1`, which makes that a
//! failure (run them so on a GPU machine: `../shared/gpu/README.md`).

#![cfg(feature = "cuda")]

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tensormem::allocators::cuda::{CudaAsyncAllocator, CudaDevice, CudaError, CudaHostAllocator, CudaSubAllocator};
use tensormem::{Allocator, AllocatorExt, BfcAllocator, MemorySpace, TrackingAllocator};

/// Held by each test while it uses the device: the tests compare the driver's free memory before
/// and after, which another test's allocations in between would upset.
static DEVICE_IN_USE: Mutex<()> = Mutex::new(());

/// Device 0 with the device lock held, or `None` after printing why the test skips.
fn device() -> Option<(Arc<CudaDevice>, MutexGuard<'static, ()>)> {
    let required = std::env::var("TENSORMEM_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match CudaDevice::open(0) {
        Ok(d) => Some((d, DEVICE_IN_USE.lock().unwrap_or_else(PoisonError::into_inner))),
        Err(e) => {
            assert!(!required, "TENSORMEM_REQUIRE_CUDA=1 but: {e}");
            skip("a CUDA test", &e.to_string());
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
    let Some((dev, _in_use)) = device() else { return };
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
    let Some((dev, _in_use)) = device() else { return };
    let a = CudaAsyncAllocator::new(dev.clone(), 0).unwrap();
    assert_eq!(a.memory_space(), MemorySpace::Device { ordinal: 0 });
    let p = a.allocate::<f32>(4 << 20).unwrap();
    // The pool's own reserved bytes: at least what is held.
    let held = a.stats().unwrap();
    assert_eq!(held.bytes_in_use, 16 << 20);
    assert!(held.bytes_reserved >= 16 << 20 && held.peak_bytes_reserved >= held.bytes_reserved, "{held:?}");
    // SAFETY: `p` came from `allocate::<f32>(4 << 20)` on `a`.
    unsafe { a.deallocate(p, 4 << 20) };
    // Freed memory stays in the pool up to the release threshold; release_cached trims it.
    let cached = CudaAsyncAllocator::new(dev.clone(), u64::MAX).unwrap();
    let p = cached.allocate::<u8>(48 << 20).unwrap();
    // SAFETY: `p` came from `allocate::<u8>(48 << 20)` on `cached`.
    unsafe { cached.deallocate(p, 48 << 20) };
    let (free_cached, _) = dev.memory_info().unwrap();
    let s = cached.stats().unwrap();
    assert!(s.bytes_in_use == 0 && s.bytes_reserved >= 48 << 20, "{s:?}");
    assert!(cached.release_cached() >= 48 << 20);
    let s = cached.stats().unwrap();
    assert!(s.bytes_reserved == 0 && s.peak_bytes_reserved >= 48 << 20, "{s:?}");
    assert!(dev.memory_info().unwrap().0 >= free_cached + (48 << 20), "the driver got the memory back");
    assert!(cached.clear_stats());
    assert_eq!(cached.stats().unwrap().peak_bytes_reserved, 0);
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
    use tensormem_tensor::{DType, Tensor, TensorError, TensorOptions};
    let Some((dev, _in_use)) = device() else { return };
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

/// The value of the sample of `family` whose labels include `label` in a Prometheus text page.
fn sample(page: &str, family: &str, label: &str) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{') && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn the_registry_routes_to_the_device_and_telemetry_reports_it() {
    use tensormem::telemetry::AllocatorCollector;
    use tensormem::{AllocatorAttributes, AllocatorRegistry};
    let Some((dev, _in_use)) = device() else { return };
    let (_, total) = dev.memory_info().unwrap();
    let registry = AllocatorRegistry::global();
    let gpu = registry.get_by_name("cuda:0").expect("cuda:0 is registered when a device exists");
    assert_eq!(gpu.memory_space(), MemorySpace::Device { ordinal: 0 });
    assert_eq!(registry.get_by_name("cuda_async:0").unwrap().memory_space(), MemorySpace::Device { ordinal: 0 });
    assert_eq!(registry.get_by_name("cuda_host").unwrap().memory_space(), MemorySpace::HostPinned);
    // Host memory stays the default; pinned memory is chosen by attributes; spaces by name.
    assert_eq!(registry.get().memory_space(), MemorySpace::Host);
    let pinned = AllocatorAttributes::new().with_on_host(true).with_gpu_compatible(true);
    assert_eq!(registry.get_for(&pinned).unwrap().memory_space(), MemorySpace::HostPinned);
    assert_eq!(registry.get_for(&AllocatorAttributes::new()).unwrap().memory_space(), MemorySpace::Host);
    assert_eq!(registry.get_for_space(MemorySpace::Device { ordinal: 0 }).unwrap().memory_space(), gpu.memory_space());
    assert!(registry.get_by_name(&format!("cuda:{}", tensormem::allocators::cuda::device_count())).is_none());
    // The default limit leaves room for the driver (TensorFlow's default fraction).
    let limit = gpu.stats().unwrap().bytes_limit.unwrap();
    assert_eq!(limit, tensormem::AllocConf::default().cuda_limit(total));

    let held = gpu.allocate::<u8>(3 << 20).unwrap();
    let page = AllocatorCollector::global().render();
    assert_eq!(sample(&page, "tensormem_device_memory_total_bytes", "device=\"cuda:0\""), Some(total as f64), "{page}");
    let free = sample(&page, "tensormem_device_memory_free_bytes", "device=\"cuda:0\"").unwrap();
    assert!(free > 0.0 && free < total as f64, "free {free} of {total}");
    let in_use = sample(&page, "tensormem_allocator_in_use_bytes", "allocator=\"cuda:0\"").unwrap();
    assert!(in_use >= (3 << 20) as f64, "{in_use}");
    assert!(sample(&page, "tensormem_allocator_reserved_bytes", "allocator=\"cuda:0\"").unwrap() >= in_use);
    // SAFETY: `held` came from `allocate::<u8>(3 MiB)` on `gpu`.
    unsafe { gpu.deallocate(held, 3 << 20) };
    assert_eq!(gpu.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn the_drivers_out_of_memory_is_a_clear_error_and_cached_memory_goes_back() {
    use tensormem::allocators::SubAllocator;
    let Some((dev, _in_use)) = device() else { return };
    let sub = CudaSubAllocator::new(dev.clone());
    let granule = sub.expandable().expect("the device supports virtual memory management").granule();
    assert!(granule.is_power_of_two() && granule >= 4096, "{granule}");
    let (free_before, total) = dev.memory_info().unwrap();
    {
        // A limit above the device's memory: the driver (`cuMemCreate`) is what refuses.
        let bfc = BfcAllocator::builder()
            .name("cuda:0-oom")
            .memory_limit(total * 2)
            .allow_growth(true)
            .sub_allocator(Arc::new(sub))
            .build()
            .unwrap();
        let small = bfc.allocate::<u8>(5 << 20).unwrap();
        let ask = (total + (1 << 30)) as usize;
        let err = bfc.allocate::<u8>(ask).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("'cuda:0-oom'") && msg.contains("device cuda:0 has"), "{msg}");
        let (ordinal, _, driver_total) = err.device_memory().expect("the driver's numbers");
        assert_eq!((ordinal, driver_total >> 10), (0, total >> 10));
        assert_eq!(err.in_use(), Some(5 << 20));
        // Nothing changed: the held block is intact and more memory can still be had.
        assert_eq!(bfc.stats().unwrap().bytes_in_use, 5 << 20);
        let more = bfc.allocate::<u8>(64 << 20).unwrap();
        // SAFETY: both came from `bfc` with these sizes.
        unsafe {
            bfc.deallocate(more, 64 << 20);
            bfc.deallocate(small, 5 << 20);
        }
        // release_cached gives the device's memory back while the allocator lives.
        let (free_held, _) = dev.memory_info().unwrap();
        assert!(bfc.release_cached() > 0);
        let (free_released, _) = dev.memory_info().unwrap();
        assert!(free_released > free_held, "held {free_held}, released {free_released}");
        assert_eq!(bfc.stats().unwrap().bytes_reserved, 0);
    }
    let (free_after, _) = dev.memory_info().unwrap();
    assert!(free_after + (4 << 20) >= free_before, "free before {free_before}, after {free_after}");
}

/// Says that a test skips, and why, where `cargo test` shows it without `--nocapture`: straight
/// to the process's standard error (the test harness captures only `print!` and `eprint!`).
fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

#[test]
fn blocks_lent_to_cudarc_come_back_on_drop() {
    use tensormem::allocators::cuda::{SliceError, TensormemSlice};
    let Some((dev, _in_use)) = device() else { return };
    let stream = tensormem::allocators::cuda::cudarc::driver::CudaContext::new(0).unwrap().default_stream();
    let gpu: Arc<dyn Allocator> = Arc::new(
        BfcAllocator::builder()
            .name("cuda:0-cudarc")
            .memory_limit(256 << 20)
            .sub_allocator(Arc::new(CudaSubAllocator::new(dev)))
            .build()
            .unwrap(),
    );
    let check = tensormem::testing::LeakCheck::start();
    {
        let mut s = TensormemSlice::<u32>::alloc(&gpu, &stream, 1000).unwrap();
        assert_eq!(s.len(), 1000);
        assert_eq!(gpu.stats().unwrap().bytes_in_use, 4096, "rounded to the BFC's chunk");
        let data: Vec<u32> = (0..1000).collect();
        stream.memcpy_htod(&data, &mut *s).unwrap();
        assert_eq!(stream.clone_dtoh(&*s).unwrap(), data);
        let held = check.live();
        assert_eq!(held.leaks.len(), 1, "the lent block is live while cudarc holds it: {held}");
    }
    assert!(check.finish().is_empty(), "dropping the slice returned the block");
    assert_eq!(gpu.stats().unwrap().bytes_in_use, 0);
    // A host allocator's memory cannot be lent; a size that overflows is refused.
    let host: Arc<dyn Allocator> = Arc::new(tensormem::SystemAllocator::new());
    let e = TensormemSlice::<f32>::alloc(&host, &stream, 4).unwrap_err();
    assert!(matches!(e, SliceError::WrongDevice { ordinal: 0, .. }), "{e}");
    let e = TensormemSlice::<u64>::alloc(&gpu, &stream, usize::MAX / 4).unwrap_err();
    assert!(matches!(e, SliceError::Alloc(_)), "{e}");
}

/// Kernels of the two-stream test: `spin_copy` waits until `*flag != 0`, then copies `n` u32
/// from `src` to `dst`; `fill` writes `value` to `n` u32 at `dst`. One block each.
const STREAM_KERNELS: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin_copy(.param .u64 flag, .param .u64 src, .param .u64 dst, .param .u32 n)
{
    .reg .pred p, q;
    .reg .b32 r<6>;
    .reg .b64 rd<10>;
    ld.param.u64 rd1, [flag];
    ld.param.u64 rd2, [src];
    ld.param.u64 rd3, [dst];
    ld.param.u32 r1, [n];
    cvta.to.global.u64 rd4, rd1;
    cvta.to.global.u64 rd5, rd2;
    cvta.to.global.u64 rd6, rd3;
SPIN:
    ld.volatile.global.u32 r2, [rd4];
    setp.eq.u32 q, r2, 0;
    @q bra SPIN;
    mov.u32 r3, %tid.x;
    mov.u32 r4, %ntid.x;
LOOP:
    setp.ge.u32 p, r3, r1;
    @p bra DONE;
    mul.wide.u32 rd7, r3, 4;
    add.s64 rd8, rd5, rd7;
    add.s64 rd9, rd6, rd7;
    ld.global.u32 r5, [rd8];
    st.global.u32 [rd9], r5;
    add.u32 r3, r3, r4;
    bra LOOP;
DONE:
    ret;
}

.visible .entry fill(.param .u64 dst, .param .u32 value, .param .u32 n)
{
    .reg .pred p;
    .reg .b32 r<5>;
    .reg .b64 rd<5>;
    ld.param.u64 rd1, [dst];
    ld.param.u32 r1, [value];
    ld.param.u32 r2, [n];
    cvta.to.global.u64 rd2, rd1;
    mov.u32 r3, %tid.x;
    mov.u32 r4, %ntid.x;
LOOP:
    setp.ge.u32 p, r3, r2;
    @p bra DONE;
    mul.wide.u32 rd3, r3, 4;
    add.s64 rd4, rd2, rd3;
    st.global.u32 [rd4], r1;
    add.u32 r3, r3, r4;
    bra LOOP;
DONE:
    ret;
}
"#;

/// A kernel on stream A waits on a flag, then reads block X, which stream B owns; the host
/// frees X while A's kernel waits and allocates again for B, whose kernel writes `0xBBBB` into
/// what it gets; then the flag is set. Returns what A read and whether B got X's address.
fn two_stream_race(dev: &Arc<CudaDevice>, record: bool) -> (u32, bool) {
    use core::alloc::Layout;
    use tensormem::allocators::cuda::CudaEvents;
    use tensormem::allocators::cuda::cudarc::driver::sys;
    use tensormem::allocators::cuda::cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};
    use tensormem::allocators::{AllocationAttributes, StreamId, StreamOrdered, StreamOrderedBfc};

    const N: u32 = 1024;
    let ctx = CudaContext::new(0).unwrap();
    let (a, b, c) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let module = ctx.load_module(tensormem::allocators::cuda::cudarc::nvrtc::Ptx::from_src(STREAM_KERNELS)).unwrap();
    let (spin_copy, fill) = (module.load_function("spin_copy").unwrap(), module.load_function("fill").unwrap());
    let template = BfcAllocator::builder()
        .name("cuda:0-streams")
        .memory_limit(256 << 20)
        .allow_growth(true)
        .sub_allocator(Arc::new(CudaSubAllocator::new(dev.clone())));
    let alloc = StreamOrderedBfc::new(template, CudaEvents::new(dev.clone())).unwrap();
    let on = |s: &Arc<CudaStream>| AllocationAttributes::DEFAULT.on_stream(StreamId::from_raw(s.cu_stream() as u64));
    let layout = Layout::from_size_align(N as usize * 4, 256).unwrap();
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };

    let flag = alloc.allocate_raw(Layout::from_size_align(256, 256).unwrap(), &on(&c)).unwrap();
    let out = alloc.allocate_raw(layout, &on(&a)).unwrap();
    let x = alloc.allocate_raw(layout, &on(&b)).unwrap();
    let addr = |p: core::ptr::NonNull<u8>| p.as_ptr() as u64;
    // SAFETY: `flag` is 256 bytes of device memory; the stream is alive.
    unsafe { sys::cuMemsetD32Async(addr(flag), 0, 1, c.cu_stream()) };
    c.synchronize().unwrap();
    // SAFETY: `fill` takes (u64 dst, u32 value, u32 n) and writes n u32 at `x`, which holds N.
    unsafe { b.launch_builder(&fill).arg(&addr(x)).arg(&0xAAAAu32).arg(&N).launch(one) }.unwrap();
    b.synchronize().unwrap();
    // SAFETY: `spin_copy` takes (u64 flag, u64 src, u64 dst, u32 n), reads the flag's first
    // u32 and copies n u32 between blocks that hold N.
    unsafe { a.launch_builder(&spin_copy).arg(&addr(flag)).arg(&addr(x)).arg(&addr(out)).arg(&N).launch(one) }.unwrap();
    /// Sets the flag however this function ends, so the spinning kernel always finishes.
    struct Release(u64, sys::CUstream);
    impl Drop for Release {
        fn drop(&mut self) {
            // SAFETY: the flag is live device memory until after this guard; the stream is alive.
            unsafe {
                sys::cuMemsetD32Async(self.0, 1, 1, self.1);
                sys::cuStreamSynchronize(self.1);
            }
        }
    }
    let release = Release(addr(flag), c.cu_stream());
    if record {
        alloc.record_stream(x, StreamId::from_raw(a.cu_stream() as u64)).unwrap();
    }
    // SAFETY: `x` came from `alloc` with `layout`; A's kernel still reads it (the point).
    unsafe { alloc.deallocate_raw(x, layout) };
    let y = alloc.allocate_raw(layout, &on(&b)).unwrap();
    // SAFETY: `fill` as above, on `y`, which holds N u32.
    unsafe { b.launch_builder(&fill).arg(&addr(y)).arg(&0xBBBBu32).arg(&N).launch(one) }.unwrap();
    b.synchronize().unwrap();
    drop(release);
    a.synchronize().unwrap();
    let mut seen = 0u32;
    // SAFETY: `out` holds N u32 written by A's kernel, which has finished; one u32 is read.
    unsafe { sys::cuMemcpyDtoH_v2((&mut seen as *mut u32).cast(), addr(out), 4) };
    // SAFETY: each block came from `alloc` with its layout and is freed once.
    unsafe {
        alloc.deallocate_raw(y, layout);
        alloc.deallocate_raw(out, layout);
        alloc.deallocate_raw(flag, Layout::from_size_align(256, 256).unwrap());
    }
    alloc.synchronize();
    (seen, y == x)
}

#[test]
fn a_block_used_on_another_stream_is_reused_only_after_that_work() {
    let Some((dev, _in_use)) = device() else { return };
    // Recorded: the free waits for A's kernel, B gets other memory, A reads its own bytes.
    let (seen, reused) = two_stream_race(&dev, true);
    assert!(!reused, "B must not get the block while A's kernel may read it");
    assert_eq!(seen, 0xAAAA, "A read what was written for it");
    // Left out on purpose: B reuses the block at once and A reads B's bytes, so the test can
    // see the race it guards against.
    let (seen, reused) = two_stream_race(&dev, false);
    assert!(reused, "without the recording B gets the same block back");
    assert_eq!(seen, 0xBBBB, "A's read lands after B's write");
}
