//! Half-precision loops compiled for the widest vector instructions the CPU has, chosen at run
//! time.
//!
//! The crate is built for the x86-64 baseline, whose vectors (SSE2) hold 4 f32 lanes and lack
//! the selects and conversions the f16/bf16 loops need: every such loop converts each element
//! to f32 and back in integer arithmetic ([`HalfFloat`](crate::halfconv::HalfFloat)),
//! and an f16 add ran several times slower than an f32 add. Compiled again with AVX2 (8 lanes)
//! or AVX-512 (16 lanes, masked selects), the same source runs several times faster. The
//! arithmetic is the same IEEE arithmetic in every version (no reassociation, no fused
//! operations the source does not write), so the results are bit for bit the same on every
//! machine, but for which NaN a NaN result is (the compiler may swap the operands of an
//! addition, and F16C keeps some payload bits).
//!
//! f16 also has conversion instructions on these CPUs (F16C's `vcvtph2ps` / `vcvtps2ph`):
//! [`f16c`](super::f16c) uses them, and arithmetic on f16 tensors runs as the f32 kernel between
//! them (the same values: every f16 op widens, computes in f32 and rounds once).
//!
//! f32 and integer element-wise arithmetic keeps the baseline build: it moves memory more than
//! it computes. The f32 loops that compute more (the `vmath` functions, softmax, the norms, the
//! float sums, whose lanes need more than SSE2's 4 per register) are compiled for the widest
//! extension too.

use core::any::TypeId;
use core::sync::atomic::{AtomicU8, Ordering};

use half::{bf16, f16};

#[cfg(test)]
use crate::halfconv::HalfFloat;

/// The vector extensions a loop can be compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// The build's baseline (SSE2 on x86-64; anything on other architectures).
    Baseline,
    /// AVX2 with FMA and F16C (Haswell and later, Zen).
    Avx2,
    /// AVX-512 F, BW and VL on top of that (Skylake-SP and later, Zen 4).
    Avx512,
}

/// The environment variable that caps the vector extensions tensormem's kernels use, read once,
/// at the first kernel: `avx512`, `avx2` or `default` (the build's baseline: SSE2 on x86-64),
/// PyTorch's names for its `ATEN_CPU_CAPABILITY`. A CPU without the extension named runs its
/// widest; an unset, empty or unknown value (logged) caps nothing. The element-wise kernels,
/// sums, softmax, the norms and the casts give the same bits on every route (see the module
/// documentation), so for them this changes speed only: to measure or check a machine without
/// AVX-512 on one with it, or to rule a route out. bf16 and f16 matrix products may differ in
/// the last bit (the sums taken in another order; AMX and AVX512-BF16 need `avx512`); the f32
/// product (the `gemm` crate) detects the CPU on its own and is not capped.
///
/// ```
/// // "avx512" on AVX-512 CPUs, "avx2" on AVX2 ones, "default" elsewhere, unless capped
/// let capability: &str = tensormem_tensor::cpu_capability();
/// assert!(["avx512", "avx2", "default"].contains(&capability));
/// ```
pub const CPU_CAPABILITY_ENV: &str = "TENSORMEM_CPU_CAPABILITY";

/// The vector extensions tensormem's kernels use here, by [`CPU_CAPABILITY_ENV`]'s names:
/// `"avx512"` (AVX-512 F, BW and VL, with AVX2, FMA and F16C), `"avx2"` (AVX2, FMA and F16C)
/// or `"default"` (the build's baseline): the widest the CPU has, capped by
/// `TENSORMEM_CPU_CAPABILITY`. Routes above these (AMX, AVX512-BF16) need `"avx512"`.
///
/// ```
/// let capability = tensormem_tensor::cpu_capability();
/// if capability == "default" {
///     // no AVX2: AMX and AVX512-BF16 are off too
///     assert!(!tensormem_tensor::amx_enabled());
/// }
/// ```
pub fn cpu_capability() -> &'static str {
    match detected() {
        Isa::Baseline => "default",
        Isa::Avx2 => "avx2",
        Isa::Avx512 => "avx512",
    }
}

/// The detected [`Isa`], plus one (0: not detected yet).
static DETECTED: AtomicU8 = AtomicU8::new(0);

/// The widest [`Isa`] this CPU runs, capped by [`CPU_CAPABILITY_ENV`]. A load and a compare
/// once known (kernels ask per block of 128 elements): the first call's detection is out of
/// line, where inlined it made every call save and restore six registers (5% of the samples
/// of a mixed f16 + f32 add).
#[inline]
pub(crate) fn detected() -> Isa {
    match DETECTED.load(Ordering::Relaxed) {
        1 => Isa::Baseline,
        2 => Isa::Avx2,
        3 => Isa::Avx512,
        _ => detect_once(),
    }
}

/// [`detected`]'s first call: detects, caps and remembers.
#[cold]
#[inline(never)]
fn detect_once() -> Isa {
    let isa = detect().min(cap(std::env::var(CPU_CAPABILITY_ENV).ok().as_deref()));
    DETECTED.store(isa as u8 + 1, Ordering::Relaxed);
    isa
}

/// The widest [`Isa`] a value of [`CPU_CAPABILITY_ENV`] allows.
fn cap(value: Option<&str>) -> Isa {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        Some("default") => Isa::Baseline,
        Some("avx2") => Isa::Avx2,
        None | Some("" | "avx512") => Isa::Avx512,
        Some(v) => {
            tracing::warn!(
                "{CPU_CAPABILITY_ENV}={v:?} is none of avx512, avx2, default; the CPU's widest extension is used"
            );
            Isa::Avx512
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    if avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
    {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Baseline
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Baseline
}

/// Whether `T` is `f16` or `bf16`.
#[inline(always)]
pub(crate) fn is_half<T: 'static>() -> bool {
    TypeId::of::<T>() == TypeId::of::<f16>() || TypeId::of::<T>() == TypeId::of::<bf16>()
}

/// The [`Isa`] to compile a loop computing in `T` and writing `O` for: the widest this CPU has
/// when either is a half-precision type, else the baseline.
#[inline(always)]
pub(crate) fn for_types<T: 'static, O: 'static>() -> Isa {
    if is_half::<T>() || is_half::<O>() { detected() } else { Isa::Baseline }
}

/// Evaluates `$e` compiled for `$isa` (an [`Isa`] this CPU has, else the baseline is used).
///
/// Each arm wraps `$e` in its own closure, called once, so the compiler inlines it (and every
/// `#[inline]` function it calls) into a function built for that extension, and vectorises its
/// loops for it. Its result does not depend on the extension (see the module documentation).
macro_rules! vectorised {
    ($isa:expr, $e:expr) => {{
        #[allow(unused_unsafe)]
        match $isa {
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::isa::Isa::Avx512
                if $crate::kernels::isa::detected() == $crate::kernels::isa::Isa::Avx512 =>
            {
                // SAFETY: the CPU has every feature `avx512` is compiled for.
                unsafe { $crate::kernels::isa::avx512(|| $e) }
            }
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::isa::Isa::Avx2 | $crate::kernels::isa::Isa::Avx512
                if $crate::kernels::isa::detected() != $crate::kernels::isa::Isa::Baseline =>
            {
                // SAFETY: the CPU has every feature `avx2` is compiled for.
                unsafe { $crate::kernels::isa::avx2(|| $e) }
            }
            _ => $e,
        }
    }};
}
pub(crate) use vectorised;

/// # Safety
/// The CPU must have AVX-512 F, BW and VL, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 and bf16 value against a spread of others, through the add, the multiply and
    /// the conversions, compiled for each extension: the results must be the baseline's, bit
    /// for bit.
    fn same_in_every_isa<H: HalfFloat + PartialEq + core::fmt::Debug + 'static>(from_bits: fn(u16) -> H) {
        let a: Vec<H> = (0..=u16::MAX).map(from_bits).collect();
        let b: Vec<H> = (0..=u16::MAX).map(|i| from_bits(i.wrapping_mul(40_503))).collect();
        let run = |isa| {
            vectorised!(isa, {
                let sum: Vec<H> = a.iter().zip(&b).map(|(&x, &y)| H::narrow(x.widen() + y.widen())).collect();
                let prod: Vec<H> = a.iter().zip(&b).map(|(&x, &y)| H::narrow(x.widen() * y.widen())).collect();
                let wide: Vec<u32> = a.iter().map(|x| x.widen().to_bits()).collect();
                let back: Vec<H> = wide.iter().map(|&w| H::narrow(f32::from_bits(w ^ 0x1357))).collect();
                (sum, prod, wide, back)
            })
        };
        let base = run(Isa::Baseline);
        for isa in [Isa::Avx2, Isa::Avx512] {
            let r = run(isa);
            // One NaN stands for all: a NaN result may come from either NaN operand.
            let bits = |v: &[H]| {
                v.iter().map(|x| if x.widen().is_nan() { u32::MAX } else { x.widen().to_bits() }).collect::<Vec<u32>>()
            };
            assert_eq!(bits(&r.0), bits(&base.0), "{isa:?} add");
            assert_eq!(bits(&r.1), bits(&base.1), "{isa:?} mul");
            assert_eq!(r.2, base.2, "{isa:?} widen");
            assert_eq!(bits(&r.3), bits(&base.3), "{isa:?} narrow");
        }
    }

    #[test]
    fn half_loops_give_the_same_bits_in_every_isa() {
        same_in_every_isa(f16::from_bits);
        same_in_every_isa(bf16::from_bits);
    }

    #[test]
    fn detection_is_stable_and_halves_are_recognised() {
        assert_eq!(detected(), detected());
        assert!(is_half::<f16>() && is_half::<bf16>());
        assert!(!is_half::<f32>() && !is_half::<u16>());
    }
}
