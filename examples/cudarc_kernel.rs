//! A cudarc kernel on memory from tensormem's `cuda:0`: blocks of the registry's device allocator
//! lent to cudarc as `CudaSlice`s (`TensormemSlice`), a SAXPY kernel launched on them through
//! cudarc, the result checked on the host, and a leak check and the allocator's figures around it.
//!
//! ```text
//! cargo run --release --features cuda --example cudarc_kernel
//! ```
//!
//! Without a CUDA driver or device it says so and exits with status 0 (set
//! `TENSORMEM_REQUIRE_CUDA=1` to make that a failure).

use std::process::ExitCode;
use std::sync::Arc;

use tensormem::allocators::cuda::TensormemSlice;
use tensormem::allocators::cuda::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use tensormem::allocators::cuda::cudarc::nvrtc::Ptx;
use tensormem::testing::LeakCheck;
use tensormem::{Allocator, AllocatorRegistry};

/// `y[i] = a * x[i] + y[i]` for `i < n`, one thread per element.
const SAXPY_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry saxpy(
    .param .u64 x_ptr,
    .param .u64 y_ptr,
    .param .f32 a,
    .param .u32 n
)
{
    .reg .pred p;
    .reg .b32 r<6>;
    .reg .b64 rd<8>;
    .reg .f32 f<5>;

    ld.param.u64 rd1, [x_ptr];
    ld.param.u64 rd2, [y_ptr];
    ld.param.f32 f1, [a];
    ld.param.u32 r1, [n];
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.s32 r5, r2, r3, r4;
    setp.ge.u32 p, r5, r1;
    @p bra DONE;
    cvta.to.global.u64 rd3, rd1;
    cvta.to.global.u64 rd4, rd2;
    mul.wide.u32 rd5, r5, 4;
    add.s64 rd6, rd3, rd5;
    add.s64 rd7, rd4, rd5;
    ld.global.f32 f2, [rd6];
    ld.global.f32 f3, [rd7];
    fma.rn.f32 f4, f1, f2, f3;
    st.global.f32 [rd7], f4;
DONE:
    ret;
}
"#;

const N: usize = 1 << 20;

fn main() -> ExitCode {
    let required = std::env::var("TENSORMEM_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    let Some(cuda0) = AllocatorRegistry::global().get_by_name("cuda:0") else {
        eprintln!(
            "no CUDA device: the registry has no cuda:0 (driver present: {})",
            tensormem::allocators::cuda::driver_present()
        );
        return if required { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    };
    match run(&cuda0) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cuda0: &Arc<dyn Allocator>) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let saxpy = ctx.load_module(Ptx::from_src(SAXPY_PTX))?.load_function("saxpy")?;

    let check = LeakCheck::start();
    {
        let xs: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let mut x = TensormemSlice::<f32>::alloc(cuda0, &stream, N)?;
        let mut y = TensormemSlice::<f32>::alloc(cuda0, &stream, N)?;
        stream.memcpy_htod(&xs, &mut *x)?;
        stream.memcpy_htod(&vec![1.0f32; N], &mut *y)?;
        let held = cuda0.stats().map(|s| s.bytes_in_use).unwrap_or(0);
        println!(
            "cuda:0 holds {held} bytes for two slices of {N} f32 (at {:#x} and {:#x})",
            x.device_ptr(),
            y.device_ptr()
        );

        let (a, n) = (2.0f32, N as u32);
        let mut launch = stream.launch_builder(&saxpy);
        launch.arg(&*x).arg(&mut *y).arg(&a).arg(&n);
        // SAFETY: the kernel takes (const float*, float*, float, unsigned) and touches only the
        // first `n` elements of both slices, which hold `N` elements each.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
        let out = stream.clone_dtoh(&*y)?;
        let wrong = (0..N).filter(|&i| out[i] != 2.0 * i as f32 + 1.0).count();
        if wrong > 0 {
            return Err(format!("{wrong} of {N} results are wrong (y[1] = {})", out[1]).into());
        }
        println!("saxpy on tensormem memory: all {N} results right (y[{}] = {})", N - 1, out[N - 1]);
        // Dropping the slices returns the blocks to cuda:0 (same stream: safe to reuse at once).
    }
    let report = check.finish();
    if !report.is_empty() {
        return Err(format!("leaks:\n{report}").into());
    }
    let s = cuda0.stats().ok_or("cuda:0 keeps no figures")?;
    println!(
        "after: cuda:0 in use {} bytes, peak {} bytes, reserved {} bytes",
        s.bytes_in_use, s.peak_bytes_in_use, s.bytes_reserved
    );
    Ok(())
}
