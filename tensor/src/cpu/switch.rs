//! The switches of the hardware routes: for half-precision products AMX tiles (bf16 and f16)
//! and, on CPUs without AMX, AVX512-BF16 registers (bf16); for the elementary functions,
//! AVX-512 blocks of four vectors, and lookup tables on bf16 and f16 tensors. Each is on where
//! the CPU (and the OS) allows it, unless its environment variable or its setter turned it off;
//! AVX512-BF16's only where it is also the faster route (AMD), unless turned on.

use core::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that turns the AMX route off at startup: `0`, `off` or `false`
/// (`1`, `on`, `true` or unset: on where the CPU has it; anything else is logged and ignored).
pub const AMX_ENV: &str = "TENSORMEM_AMX";

/// The environment variable that turns the AVX512-BF16 route off at startup, with the values
/// of [`AMX_ENV`]; `1`, `on` or `true` also turn it on on Intel CPUs, where it is off by default
/// (see [`avx512_bf16_enabled`]).
pub const AVX512_BF16_ENV: &str = "TENSORMEM_AVX512_BF16";

/// The environment variable that turns the AVX-512 blocks of the elementary functions off at
/// startup, with the values of [`AMX_ENV`].
pub const AVX512_BLOCKS_ENV: &str = "TENSORMEM_AVX512_BLOCKS";

/// The environment variable that turns the AVX2 blocks of the elementary functions (on CPUs
/// with AVX2 but not AVX-512) off at startup, with the values of [`AMX_ENV`].
pub const AVX2_BLOCKS_ENV: &str = "TENSORMEM_AVX2_BLOCKS";

/// The environment variable that turns the lookup tables of the elementary functions on bf16
/// and f16 tensors off at startup, with the values of [`AMX_ENV`].
pub const HALF_TABLES_ENV: &str = "TENSORMEM_HALF_TABLES";

/// One route's switch.
struct Switch {
    /// The route, for the log.
    name: &'static str,
    env: &'static str,
    /// 0: not decided yet; 1: off (not supported, or turned off); 2: on.
    state: AtomicU8,
    /// The CPU can run the route.
    supported: fn() -> bool,
    /// The route is on when supported, unless its variable or setter says otherwise (the
    /// variable set to on, or the setter, turns on any supported route).
    by_default: fn() -> bool,
}

static AMX: Switch =
    Switch { name: "AMX", env: AMX_ENV, state: AtomicU8::new(0), supported: amx_supported, by_default: always };
static DOTS: Switch = Switch {
    name: "AVX512-BF16",
    env: AVX512_BF16_ENV,
    state: AtomicU8::new(0),
    supported: avx512_bf16_supported,
    by_default: avx512_bf16_outruns_fma,
};

static BLOCKS: Switch = Switch {
    name: "AVX-512 blocks",
    env: AVX512_BLOCKS_ENV,
    state: AtomicU8::new(0),
    supported: avx512_supported,
    by_default: always,
};

static AVX2_BLOCKS: Switch = Switch {
    name: "AVX2 blocks",
    env: AVX2_BLOCKS_ENV,
    state: AtomicU8::new(0),
    supported: avx2_only,
    by_default: always,
};

static TABLES: Switch = Switch {
    name: "half-precision tables",
    env: HALF_TABLES_ENV,
    state: AtomicU8::new(0),
    supported: always,
    by_default: always,
};

fn always() -> bool {
    true
}

impl Switch {
    fn enabled(&self) -> bool {
        match self.state.load(Ordering::Relaxed) {
            0 => {
                let wanted = match std::env::var(self.env).map(|v| v.trim().to_ascii_lowercase()) {
                    Ok(v) if matches!(v.as_str(), "0" | "off" | "false") => false,
                    Ok(v) if matches!(v.as_str(), "1" | "on" | "true") => true,
                    Ok(v) if v.is_empty() => (self.by_default)(),
                    Ok(v) => {
                        tracing::warn!(
                            "{}={v:?} is neither 0/off/false nor 1/on/true; {} keeps its default",
                            self.env,
                            self.name
                        );
                        (self.by_default)()
                    }
                    Err(_) => (self.by_default)(),
                };
                let on = wanted && (self.supported)();
                // A concurrent `set` wins over the environment.
                let _ = self.state.compare_exchange(0, if on { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
                self.state.load(Ordering::Relaxed) == 2
            }
            s => s == 2,
        }
    }

    fn set(&self, enabled: bool) -> bool {
        let on = enabled && (self.supported)();
        self.state.store(if on { 2 } else { 1 }, Ordering::Relaxed);
        on
    }
}

/// Whether bf16 and f16 matrix products run on AMX tiles: the CPU has AMX-BF16, the OS granted the
/// tile registers, and neither [`set_amx`]`(false)` nor `TENSORMEM_AMX=0` turned the route off.
///
/// ```
/// // true on CPUs with AMX under Linux 5.16+, false elsewhere
/// let _on_tiles: bool = tensormem_tensor::amx_enabled();
/// ```
pub fn amx_enabled() -> bool {
    AMX.enabled()
}

/// Turns the AMX route for bf16 and f16 matmul on or off (like `torch.backends.mkldnn`'s switch); on has
/// effect only where [`amx_enabled`] can be true. Returns whether the route is on afterwards.
/// Products already running finish on the route they started on. With AMX off, bf16 products
/// take the AVX512-BF16 route where [`avx512_bf16_enabled`], else the f32 route.
///
/// ```
/// use tensormem_tensor::{DType, Tensor, set_amx, set_avx512_bf16};
///
/// let previous = (tensormem_tensor::amx_enabled(), tensormem_tensor::avx512_bf16_enabled());
/// set_amx(false); // with both off, bf16 matmul converts to f32 and rounds once, on every machine
/// set_avx512_bf16(false);
/// let a = Tensor::ones(&[64, 64], DType::BF16)?;
/// assert_eq!(a.matmul(&a)?.to_dtype(DType::F32)?.to_vec::<f32>()?[0], 64.0);
/// set_amx(previous.0);
/// set_avx512_bf16(previous.1);
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
pub fn set_amx(enabled: bool) -> bool {
    AMX.set(enabled)
}

/// Whether bf16 matrix products run on AVX512-BF16 registers (`vdpbf16ps`, as oneDNN does) when
/// they do not run on AMX tiles. By default: Linux on an AMD CPU with AVX512-BF16 (Zen 4 and
/// later), unless [`set_avx512_bf16`]`(false)` or `TENSORMEM_AVX512_BF16=0` turned the route
/// off. Intel CPUs with AVX512-BF16 (Cooper Lake, and server cores whose AMX is hidden, as in some
/// VMs) are taken to run `vdpbf16ps` at a quarter of their rate of f32 fused multiply-adds:
/// half the products a second (`docs/amx-routes.md`). There the route is off unless [`set_avx512_bf16`]`(true)` or `TENSORMEM_AVX512_BF16=1` turn it
/// on, and bf16 products take the f32 route (fewer than 32 rows by a transposed weight: dot
/// products on fused multiply-adds, without converting the weight). The route's arithmetic is
/// AMX's (f32 sums, subnormals read and written as zero); f16 products do not take it.
///
/// ```
/// // true on Zen 4 and later under Linux, whatever AMX's switch says
/// let _on_registers: bool = tensormem_tensor::avx512_bf16_enabled();
/// ```
pub fn avx512_bf16_enabled() -> bool {
    DOTS.enabled()
}

/// Turns the AVX512-BF16 route for bf16 matmul on or off; on has effect wherever the CPU has
/// AVX512-BF16, Intel's included. Returns whether the route is on afterwards. AMX, where on,
/// goes first.
///
/// ```
/// let previous = tensormem_tensor::avx512_bf16_enabled();
/// tensormem_tensor::set_avx512_bf16(false); // bf16 without AMX: the f32 route
/// tensormem_tensor::set_avx512_bf16(previous);
/// ```
pub fn set_avx512_bf16(enabled: bool) -> bool {
    DOTS.set(enabled)
}

/// Whether GELU, the sigmoid, SiLU, GELU's tanh form, `tanh`, `exp` and `log` run contiguous `f32`
/// runs (and bf16 tensors, converted in blocks) four AVX-512 vectors side by side: the CPU has
/// AVX-512 F, BW and VL, and neither [`set_avx512_blocks`]`(false)` nor
/// `TENSORMEM_AVX512_BLOCKS=0` turned them off. The results are the same bits either way;
/// only the time differs (`docs/elementary-functions.md`).
///
/// ```
/// // true on AVX-512 CPUs (Intel Skylake-SP and later server cores, AMD Zen 4 and later)
/// let _blocks: bool = tensormem_tensor::avx512_blocks_enabled();
/// ```
pub fn avx512_blocks_enabled() -> bool {
    BLOCKS.enabled()
}

/// Turns the AVX-512 blocks of the elementary functions on or off; on has effect only on
/// AVX-512 CPUs. Returns whether they are on afterwards. Off, every element goes through the
/// one-vector loop, with the same results.
///
/// ```
/// use tensormem_tensor::{DType, Tensor, set_avx512_blocks};
///
/// let x = Tensor::arange(-4.0, 4.0, 0.25, DType::F32)?;
/// let previous = tensormem_tensor::avx512_blocks_enabled();
/// set_avx512_blocks(false);
/// let one_vector = x.gelu()?.to_vec::<f32>()?;
/// set_avx512_blocks(true);
/// let blocks = x.gelu()?.to_vec::<f32>()?;
/// assert_eq!(one_vector, blocks);
/// set_avx512_blocks(previous);
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
pub fn set_avx512_blocks(enabled: bool) -> bool {
    BLOCKS.set(enabled)
}

/// Whether GELU, the sigmoid, SiLU, GELU's tanh form, `exp` and `log` run contiguous `f32` runs
/// four AVX2 vectors side by side on a CPU with AVX2 and FMA but not AVX-512 (AMD Zen 2 and 3,
/// Intel client cores; or capped to `avx2` by
/// [`CPU_CAPABILITY_ENV`](crate::CPU_CAPABILITY_ENV)), unless [`set_avx2_blocks`]`(false)`
/// or `TENSORMEM_AVX2_BLOCKS=0` turned them off. The results are the same bits either way; only
/// the time differs (`tanh` stays in the one-vector loop, which is faster for it there:
/// `docs/elementary-functions.md`). Softmax's exponentials take them too.
///
/// ```
/// // true on AVX2 CPUs without AVX-512 (AMD Zen 2 and 3, Intel Core), false elsewhere
/// let _blocks: bool = tensormem_tensor::avx2_blocks_enabled();
/// ```
pub fn avx2_blocks_enabled() -> bool {
    AVX2_BLOCKS.enabled()
}

/// Turns the AVX2 blocks of the elementary functions on or off; on has effect only where
/// [`CPU_CAPABILITY_ENV`](crate::CPU_CAPABILITY_ENV) says `avx2`. Returns whether they
/// are on afterwards. Off, every element goes through the one-vector loop, with the same
/// results.
///
/// ```
/// use tensormem_tensor::{DType, Tensor, set_avx2_blocks};
///
/// let x = Tensor::arange(-4.0, 4.0, 0.25, DType::F32)?;
/// let previous = tensormem_tensor::avx2_blocks_enabled();
/// set_avx2_blocks(false);
/// let one_vector = x.silu()?.to_vec::<f32>()?;
/// set_avx2_blocks(true);
/// let blocks = x.silu()?.to_vec::<f32>()?;
/// assert_eq!(one_vector, blocks);
/// set_avx2_blocks(previous);
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
pub fn set_avx2_blocks(enabled: bool) -> bool {
    AVX2_BLOCKS.set(enabled)
}

/// Whether GELU, the sigmoid, SiLU, GELU's tanh form, `tanh`, `exp` and `log` of a bf16 or f16
/// tensor into one of its own dtype look each element up in a table of the function's 65,536
/// results (one per bit pattern, computed on first use by the route the tensor would take
/// without it: widened to `f32`, computed, rounded once), unless [`set_half_tables`]`(false)`
/// or `TENSORMEM_HALF_TABLES=0` turned them off. The results are the same bits either way.
///
/// ```
/// // true unless turned off
/// let _tables: bool = tensormem_tensor::half_tables_enabled();
/// ```
pub fn half_tables_enabled() -> bool {
    TABLES.enabled()
}

/// Turns the lookup tables of the elementary functions on bf16 and f16 tensors on or off.
/// Returns whether they are on afterwards. Off, each element is widened, computed and rounded
/// as it goes, with the same results.
///
/// ```
/// use tensormem_tensor::{DType, Tensor, set_half_tables};
///
/// let x = Tensor::arange(-4.0, 4.0, 0.25, DType::BF16)?;
/// let previous = tensormem_tensor::half_tables_enabled();
/// set_half_tables(false);
/// let computed = x.gelu()?.to_dtype(DType::F32)?.to_vec::<f32>()?;
/// set_half_tables(true);
/// let looked_up = x.gelu()?.to_dtype(DType::F32)?.to_vec::<f32>()?;
/// assert_eq!(computed, looked_up);
/// set_half_tables(previous);
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
pub fn set_half_tables(enabled: bool) -> bool {
    TABLES.set(enabled)
}

/// The CPU has AVX-512 F, BW and VL (what the blocks are compiled for).
fn avx512_supported() -> bool {
    super::isa::detected() == super::isa::Isa::Avx512
}

/// The kernels run AVX2 and FMA, not AVX-512 (what the AVX2 blocks are for).
fn avx2_only() -> bool {
    super::isa::detected() == super::isa::Isa::Avx2
}

/// AVX512-BF16's `vdpbf16ps` gives more products a second than f32 fused multiply-adds: on AMD
/// (Zen 4 and later) it does; Intel's cores run it once every 2 cycles against 2 FMAs a cycle,
/// half the products a second (`docs/amx-routes.md`).
fn avx512_bf16_outruns_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `cpuid` exists on every x86-64 CPU and never faults; leaf 0 is the vendor.
        #[allow(unused_unsafe)]
        let leaf0 = unsafe { core::arch::x86_64::__cpuid(0) };
        // "AuthenticAMD", in the register order EBX, EDX, ECX.
        (leaf0.ebx, leaf0.edx, leaf0.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The CPU and the OS allow AMX-BF16 (checked once; asks Linux for the tile registers).
pub(crate) fn amx_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(detect_amx)
}

/// The CPU has AVX512-BF16, and the AVX-512 F, BW and VL the packing loops are compiled for.
fn avx512_bf16_supported() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        super::isa::detected() == super::isa::Isa::Avx512 && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect_amx() -> bool {
    use core::arch::x86_64::__cpuid_count;
    // SAFETY: `cpuid` exists on every x86-64 CPU and never faults: a leaf above the maximum
    // returns other data, which is not used (the maximum is checked first). (`__cpuid_count`
    // is a safe function in recent Rust and unsafe in older; the crate builds with both.)
    #[allow(unused_unsafe)]
    let (max_leaf, leaf1, leaf7) = unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(1, 0), __cpuid_count(7, 0)) };
    let osxsave = leaf1.ecx & (1 << 27) != 0;
    let (amx_bf16, amx_tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
    // Every AMX CPU has AVX-512, for which the packing and rounding loops are compiled.
    let avx512 = super::isa::detected() == super::isa::Isa::Avx512;
    if max_leaf < 7 || !osxsave || !amx_bf16 || !amx_tile || !avx512 {
        return false;
    }
    // SAFETY: OSXSAVE is set, so `xgetbv` is enabled; register 0 is XCR0.
    let xcr0 = unsafe { xcr0() };
    // XTILECFG (bit 17) and XTILEDATA (bit 18): the OS saves the tile state.
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only changes this process's permitted
    // extended-state features; it takes no pointers.
    let granted = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    granted == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect_amx() -> bool {
    false
}

/// # Safety
/// The CPU must report OSXSAVE.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE, so `xgetbv` does not fault.
    unsafe { core::arch::x86_64::_xgetbv(0) }
}
