//! Half-precision loops compiled for the widest vector instructions the CPU has, chosen at run
//! time.
//!
//! The crate is built for the x86-64 baseline, whose vectors (SSE2) hold 4 f32 lanes and lack
//! the selects and conversions the f16/bf16 loops need: every such loop converts each element
//! to f32 and back in integer arithmetic ([`HalfFloat`](crate::tensor::halfconv::HalfFloat)),
//! and an f16 add ran at 2-3 ns per element, 5x an f32 add. Compiled again with AVX2 (8 lanes)
//! or AVX-512 (16 lanes, masked selects), the same source runs several times faster. The
//! arithmetic is the same IEEE arithmetic in every version (no reassociation, no fused
//! operations the source does not write), so the results are bit for bit the same on every
//! machine, but for which NaN a NaN result is (the compiler may swap the operands of an
//! addition, and F16C keeps some payload bits).
//!
//! f16 also has conversion instructions on these CPUs (F16C's `vcvtph2ps` / `vcvtps2ph`, 16
//! lanes with AVX-512): [`widen_f16`] and [`narrow_f16`] use them, for the converting blocks'
//! loads and stores and the f16 sum, and arithmetic on f16 tensors runs as the f32 kernel
//! between them (the same values: every f16 op widens, computes in f32 and rounds once).
//!
//! f32 and integer loops keep the baseline build: they move memory more than they compute.

use core::any::TypeId;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU8, Ordering};

use half::{bf16, f16};

use crate::tensor::halfconv::HalfFloat;

/// The vector extensions a loop can be compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The build's baseline (SSE2 on x86-64; anything on other architectures).
    Baseline,
    /// AVX2 with FMA and F16C (Haswell and later, Zen).
    Avx2,
    /// AVX-512 F, BW and VL on top of that (Skylake-SP and later, Zen 4).
    Avx512,
}

/// The detected [`Isa`], plus one (0: not detected yet).
static DETECTED: AtomicU8 = AtomicU8::new(0);

/// The widest [`Isa`] this CPU runs.
pub(crate) fn detected() -> Isa {
    match DETECTED.load(Ordering::Relaxed) {
        1 => Isa::Baseline,
        2 => Isa::Avx2,
        3 => Isa::Avx512,
        _ => {
            let isa = detect();
            DETECTED.store(isa as u8 + 1, Ordering::Relaxed);
            isa
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
            $crate::tensor::kernels::isa::Isa::Avx512
                if $crate::tensor::kernels::isa::detected() == $crate::tensor::kernels::isa::Isa::Avx512 =>
            {
                // SAFETY: the CPU has every feature `avx512` is compiled for.
                unsafe { $crate::tensor::kernels::isa::avx512(|| $e) }
            }
            #[cfg(target_arch = "x86_64")]
            $crate::tensor::kernels::isa::Isa::Avx2 | $crate::tensor::kernels::isa::Isa::Avx512
                if $crate::tensor::kernels::isa::detected() != $crate::tensor::kernels::isa::Isa::Baseline =>
            {
                // SAFETY: the CPU has every feature `avx2` is compiled for.
                unsafe { $crate::tensor::kernels::isa::avx2(|| $e) }
            }
            _ => $e,
        }
    }};
}
pub(crate) use vectorised;

/// Whether f16 converts with F16C's instructions here ([`widen_f16`], [`narrow_f16`]): every
/// [`Isa`] above the baseline has them.
#[inline(always)]
pub(crate) fn has_f16c() -> bool {
    detected() != Isa::Baseline
}

/// `dst[i] = src[i]` as f32 (exact), for `i < min(src.len(), dst.len())`: 16 or 8 at a time
/// with `vcvtph2ps` where the CPU has it (AVX-512, F16C).
pub(crate) fn widen_f16(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    let done = match detected() {
        // SAFETY: the CPU has AVX-512 F.
        Isa::Avx512 => unsafe { widen_f16_avx512(&src[..n], &mut dst[..n]) },
        // SAFETY: the CPU has F16C and AVX.
        Isa::Avx2 => unsafe { widen_f16c(&src[..n], &mut dst[..n]) },
        Isa::Baseline => 0,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (d, s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *d = s.widen();
    }
}

/// `dst[i] = src[i]` rounded to f16 (to nearest, ties to even; NaN stays NaN), for
/// `i < min(src.len(), dst.len())`: 16 or 8 at a time with `vcvtps2ph` where the CPU has it
/// (AVX-512, F16C).
pub(crate) fn narrow_f16(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    let done = match detected() {
        // SAFETY: the CPU has AVX-512 F.
        Isa::Avx512 => unsafe { narrow_f16_avx512(&src[..n], &mut dst[..n]) },
        // SAFETY: the CPU has F16C and AVX.
        Isa::Avx2 => unsafe { narrow_f16c(&src[..n], &mut dst[..n]) },
        Isa::Baseline => 0,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (d, &s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        d.write(f16::narrow(s));
    }
}

/// Widens the whole groups of 8 of `src` into `dst` (of the same length); returns how many.
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) -> usize {
    use core::arch::x86_64::{_mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    let whole = src.len().min(dst.len()) / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= whole`, within both slices: 16 readable bytes of `src` (f16 is a
        // `u16`), 32 writable bytes of `dst`; both intrinsics take unaligned addresses.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    whole
}

/// Rounds the whole groups of 8 of `src` into `dst` (of the same length); returns how many.
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn narrow_f16c(src: &[f32], dst: &mut [MaybeUninit<f16>]) -> usize {
    use core::arch::x86_64::{_MM_FROUND_TO_NEAREST_INT, _mm_storeu_si128, _mm256_cvtps_ph, _mm256_loadu_ps};
    let whole = src.len().min(dst.len()) / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= whole`, within both slices: 32 readable bytes of `src`, 16
        // writable bytes of `dst` (`MaybeUninit<f16>` is a `u16`); unaligned intrinsics. The
        // rounding is to nearest, ties to even, as `HalfFloat::narrow`.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    whole
}

/// As [`widen_f16c`], 16 at a time with AVX-512's `vcvtph2ps`.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_f16_avx512(src: &[f16], dst: &mut [f32]) -> usize {
    use core::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
    let whole = src.len().min(dst.len()) / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: `i + 16 <= whole`, within both slices: 32 readable bytes of `src`, 64
        // writable bytes of `dst`; both intrinsics take unaligned addresses.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    whole
}

/// As [`narrow_f16c`], 16 at a time with AVX-512's `vcvtps2ph`.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn narrow_f16_avx512(src: &[f32], dst: &mut [MaybeUninit<f16>]) -> usize {
    use core::arch::x86_64::{_MM_FROUND_TO_NEAREST_INT, _mm256_storeu_si256, _mm512_cvtps_ph, _mm512_loadu_ps};
    let whole = src.len().min(dst.len()) / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: `i + 16 <= whole`, within both slices: 64 readable bytes of `src`, 32
        // writable bytes of `dst`; unaligned intrinsics; rounding to nearest, ties to even.
        unsafe {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    whole
}

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
    fn f16c_conversions_match_the_arithmetic_ones_on_every_value() {
        // Every f16 value widened; lengths not a multiple of 8 leave a tail to the scalar loop.
        let h: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).chain([f16::ONE; 5]).collect();
        let mut w = vec![0f32; h.len()];
        widen_f16(&h, &mut w);
        for (x, y) in h.iter().zip(&w) {
            assert!(y.to_bits() == x.widen().to_bits() || (y.is_nan() && x.is_nan()), "{:#06x}", x.to_bits());
        }
        // Every f16 value, the midpoints between neighbours (ties) and their f32 neighbours.
        let mut v: Vec<f32> = Vec::new();
        for b in 0..u16::MAX {
            let (a, c) = (f16::from_bits(b).widen(), f16::from_bits(b + 1).widen());
            let mid = ((f64::from(a) + f64::from(c)) / 2.0) as f32;
            v.extend([a, mid, f32::from_bits(mid.to_bits() + 1), f32::from_bits(mid.to_bits().wrapping_sub(1))]);
        }
        v.extend([f32::MAX, -f32::MAX, 65520.0, 65519.99, 1e-9, -3e-8, f32::NAN]);
        let mut n = vec![MaybeUninit::new(f16::ZERO); v.len()];
        narrow_f16(&v, &mut n);
        for (x, y) in v.iter().zip(&n) {
            // SAFETY: `narrow_f16` wrote every element (and they started initialised).
            let y = unsafe { y.assume_init() };
            let want = f16::narrow(*x);
            assert!(y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()), "{x:e}: {y} vs {want}");
        }
    }

    #[test]
    fn detection_is_stable_and_halves_are_recognised() {
        assert_eq!(detected(), detected());
        assert!(is_half::<f16>() && is_half::<bf16>());
        assert!(!is_half::<f32>() && !is_half::<u16>());
    }
}
