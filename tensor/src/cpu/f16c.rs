//! f16 through F16C's conversion instructions (`vcvtph2ps` / `vcvtps2ph`), which every CPU
//! above the baseline [`Isa`] has: the converting blocks' loads and stores ([`widen_f16`],
//! [`narrow_f16`]), the f16 sum and the f16 column sums' step ([`add_rows_f16`]), the fused
//! loop of binary arithmetic on f16 tensors ([`map2_f16`]), and the row kernels' f16 rows
//! through f32 scratch ([`f16_rows`]).
//!
//! Every f16 op widens its operands to f32, computes there and rounds once, so arithmetic on f16
//! tensors runs as the f32 kernel between these conversions, with the same values. The fused
//! loops do it in one pass over chunks of 32 elements, in registers and the stack: widen, apply
//! the f32 kernel, round, store. (The converting blocks make three passes over 128-element
//! buffers, each through a function pointer, and spent a fifth of an f16 add in the calls.)

use core::any::TypeId;
use core::mem::MaybeUninit;

use half::f16;

use super::isa::{Isa, detected};
use super::reduce::SUM_LANES;
use crate::halfconv::HalfFloat;

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

/// The longest f16 rows [`f16_rows`] gives: two f32 scratch rows of this length (512 KiB
/// each) per part at most, enough for a 128256-token vocabulary's logits. Longer rows take the
/// kernels' value-by-value conversions, without scratch.
pub(crate) const F32_ROWS_MAX: usize = 1 << 17;

/// `(src, dst)` as f16 slices where `T` is f16, the CPU converts with F16C ([`has_f16c`]) and
/// rows of `len` are at most [`F32_ROWS_MAX`] long: rows for f32 scratch (see
/// [`narrow_written`]).
#[inline(always)]
pub(crate) fn f16_rows<'a, T: 'static>(
    src: &'a [T],
    dst: &'a mut [MaybeUninit<T>],
    len: usize,
) -> Option<(&'a [f16], &'a mut [MaybeUninit<f16>])> {
    if TypeId::of::<T>() != TypeId::of::<f16>() || !has_f16c() || len > F32_ROWS_MAX {
        return None;
    }
    // SAFETY: `T` is `f16` (checked above), so these are the same slices, of the same type,
    // borrowed for the same lifetime.
    Some(unsafe {
        (&*(src as *const [T] as *const [f16]), &mut *(dst as *mut [MaybeUninit<T>] as *mut [MaybeUninit<f16>]))
    })
}

/// [`narrow_f16`] of an f32 row a kernel wrote through `MaybeUninit`: the row kernels (the
/// norms, softmax) take f16 rows ([`f16_rows`]) through f32 scratch, widened by [`widen_f16`]
/// and rounded back here, as converting value by value with [`HalfFloat`]'s bit operations in
/// their loops is several times slower (`docs/reductions.md`).
///
/// # Safety
/// Every element of `src` is initialised.
#[inline(always)]
pub(crate) unsafe fn narrow_written(src: &[MaybeUninit<f32>], dst: &mut [MaybeUninit<f16>]) {
    // SAFETY: every element is initialised (the function's contract), and `MaybeUninit<f32>`
    // has `f32`'s layout.
    narrow_f16(unsafe { &*(src as *const [MaybeUninit<f32>] as *const [f32]) }, dst);
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

/// Adds `x[SUM_LANES * j + k]` to `acc[k]`, in order of `j`, for every whole group of
/// [`SUM_LANES`] of `x` (widened exactly); returns how many elements that took (0 where the CPU
/// lacks F16C). The float sum's lanes with the widening fused in: the same additions, so the
/// same result.
pub(crate) fn sum_lanes_f16(x: &[f16], acc: &mut [f32; SUM_LANES]) -> usize {
    match detected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 F.
        Isa::Avx512 => unsafe { sum_lanes_avx512(x, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has F16C and AVX.
        Isa::Avx2 => unsafe { sum_lanes_f16c(x, acc) },
        _ => {
            let _ = (x, acc); // used only on x86-64
            0
        }
    }
}

/// [`sum_lanes_f16`] in four 16-lane registers (lanes `16 q ..16 q + 16`).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_lanes_avx512(x: &[f16], acc: &mut [f32; SUM_LANES]) -> usize {
    use core::arch::x86_64::{_mm256_loadu_si256, _mm512_add_ps, _mm512_cvtph_ps, _mm512_loadu_ps, _mm512_storeu_ps};
    let whole = x.len() / SUM_LANES * SUM_LANES;
    // SAFETY: `acc` holds 64 f32, 16 (64 bytes) per `q < 4`; each `i + 64 <= whole` makes
    // `i + 16 q` the start of 32 readable bytes of `x`; the intrinsics take unaligned
    // addresses.
    unsafe {
        let mut v = [0, 1, 2, 3].map(|q| _mm512_loadu_ps(acc.as_ptr().add(16 * q)));
        for i in (0..whole).step_by(SUM_LANES) {
            for (q, v) in v.iter_mut().enumerate() {
                *v = _mm512_add_ps(*v, _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().add(i + 16 * q).cast())));
            }
        }
        for (q, v) in v.into_iter().enumerate() {
            _mm512_storeu_ps(acc.as_mut_ptr().add(16 * q), v);
        }
    }
    whole
}

/// [`sum_lanes_f16`] in eight 8-lane registers (lanes `8 q .. 8 q + 8`).
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn sum_lanes_f16c(x: &[f16], acc: &mut [f32; SUM_LANES]) -> usize {
    use core::arch::x86_64::{_mm_loadu_si128, _mm256_add_ps, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_storeu_ps};
    let whole = x.len() / SUM_LANES * SUM_LANES;
    // SAFETY: as in `sum_lanes_avx512`, in eight parts of 8 lanes (32 bytes of `acc`, 16 of
    // `x`).
    unsafe {
        let mut v = [0, 1, 2, 3, 4, 5, 6, 7].map(|q| _mm256_loadu_ps(acc.as_ptr().add(8 * q)));
        for i in (0..whole).step_by(SUM_LANES) {
            for (q, v) in v.iter_mut().enumerate() {
                *v = _mm256_add_ps(*v, _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i + 8 * q).cast())));
            }
        }
        for (q, v) in v.into_iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(8 * q), v);
        }
    }
    whole
}

/// The step of the f16 column sums ([`columns::sum`](super::columns::sum)):
/// `acc[j] += (x[0][j] + x[1][j]) + (x[2][j] + x[3][j])` in f32, the values widened exactly, for
/// the whole groups of 8 columns (of `acc`, every row at least as long), with F16C where the CPU
/// has it; returns how many columns that took (0 without F16C): the caller adds the rest in the
/// same order, so the sums are the same bits either way. Widening in the loop beats widening
/// the rows into scratch first (`docs/reductions.md`).
pub(crate) fn add_rows_f16(x: [&[f16]; 4], acc: &mut [f32]) -> usize {
    let n = x.iter().fold(acc.len(), |n, r| n.min(r.len())) / 8 * 8;
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has F16C and AVX (every ISA above the baseline); `n` is at most every
        // slice's length.
        unsafe { add_rows_f16c(x, &mut acc[..n]) };
        return n;
    }
    let _ = (x, acc, n); // unused without F16C
    0
}

/// [`add_rows_f16`] over all of `acc` (a multiple of 8 long, every row at least as long).
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn add_rows_f16c(x: [&[f16]; 4], acc: &mut [f32]) {
    use core::arch::x86_64::{_mm_loadu_si128, _mm256_add_ps, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_storeu_ps};
    let [x0, x1, x2, x3] = x.map(|r| r.as_ptr());
    for j in (0..acc.len() / 8 * 8).step_by(8) {
        // SAFETY: `j + 8 <= acc.len()`, at most every row's length (the caller's contract), so
        // each row has 16 readable bytes at `j` (f16 is a `u16`) and `acc` 32 writable ones;
        // the intrinsics take unaligned addresses.
        unsafe {
            let w = |p: *const f16| _mm256_cvtph_ps(_mm_loadu_si128(p.add(j).cast()));
            let pair = _mm256_add_ps(_mm256_add_ps(w(x0), w(x1)), _mm256_add_ps(w(x2), w(x3)));
            let a = acc.as_mut_ptr().add(j);
            _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), pair));
        }
    }
}

/// Elements per chunk of the fused loops: four 8-lane conversions.
#[cfg(target_arch = "x86_64")]
const CHUNK: usize = 32;

/// `o[i] = f16(f(a[i * sa], b[i * sb]))` for `i < n`, widening exactly and rounding to nearest,
/// ties to even (the values of [`HalfFloat`]'s conversions; NaN stays NaN).
///
/// # Safety
/// `sa` and `sb` are 0 or 1 (an operand of step 0 is one value for every `i`); `a + i * sa` and
/// `b + i * sb` for `i < n` are valid, aligned f16 values; `o + i` for `i < n` are valid for
/// writes, and overlap an input only element for element (`o == a` with `sa == 1`, in place).
pub(crate) unsafe fn map2_f16<F: Fn(f32, f32) -> f32>(
    f: &F,
    o: *mut f16,
    a: *const f16,
    sa: usize,
    b: *const f16,
    sb: usize,
    n: usize,
) {
    match detected() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 (and F16C); the function's contract.
        Isa::Avx512 => unsafe { map2_avx512(f, o, [a, b], [sa, sb], n) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and F16C; the function's contract.
        Isa::Avx2 => unsafe { map2_avx2(f, o, [a, b], [sa, sb], n) },
        _ => {
            for i in 0..n {
                // SAFETY: the function's contract.
                unsafe {
                    let (x, y) = (a.add(i * sa).read(), b.add(i * sb).read());
                    o.add(i).write(f16::narrow(f(x.widen(), y.widen())));
                }
            }
        }
    }
}

/// The fused loop compiled for one extension: whole chunks read in place, the last one through
/// padded copies.
macro_rules! fused_loop {
    ($name:ident, $features:literal) => {
        /// # Safety
        #[doc = concat!("The CPU has ", $features, "; the contract of [`map2_f16`].")]
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<F: Fn(f32, f32) -> f32>(f: &F, o: *mut f16, p: [*const f16; 2], s: [usize; 2], n: usize) {
            // An operand of step 0 reads a chunk of copies of its value.
            // SAFETY: element 0 of each operand is valid when `n > 0`.
            let splat = |k: usize| if n == 0 { [f16::ZERO; CHUNK] } else { [unsafe { p[k].read() }; CHUNK] };
            let (ca, cb) = (splat(0), splat(1));
            let a = if s[0] == 0 { ca.as_ptr() } else { p[0] };
            let b = if s[1] == 0 { cb.as_ptr() } else { p[1] };
            let whole = n / CHUNK * CHUNK;
            let mut i = 0;
            while i < whole {
                // SAFETY: `i + CHUNK <= n`: the chunk's elements are valid (a step-0 operand
                // stays on its copies); the output overlaps an input only element for element,
                // and `chunk` reads both inputs before it writes.
                unsafe { chunk(f, o.add(i), a.add(i * s[0]), b.add(i * s[1])) };
                i += CHUNK;
            }
            if i < n {
                let m = n - i;
                let (mut ta, mut tb, mut to) = (ca, cb, [f16::ZERO; CHUNK]);
                // SAFETY: elements `i..n` of each stepping operand and of the output are valid;
                // the copies are local arrays of `CHUNK >= m` elements.
                unsafe {
                    if s[0] != 0 {
                        core::ptr::copy_nonoverlapping(a.add(i), ta.as_mut_ptr(), m);
                    }
                    if s[1] != 0 {
                        core::ptr::copy_nonoverlapping(b.add(i), tb.as_mut_ptr(), m);
                    }
                    chunk(f, to.as_mut_ptr(), ta.as_ptr(), tb.as_ptr());
                    core::ptr::copy_nonoverlapping(to.as_ptr(), o.add(i), m);
                }
            }
        }
    };
}
fused_loop!(map2_avx512, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");
fused_loop!(map2_avx2, "avx2,fma,f16c");

/// One chunk: `o[k] = f16(f(a[k], b[k]))` for `k < CHUNK`, every input read before any output
/// is written.
///
/// # Safety
/// The CPU has F16C and AVX; `a + k` and `b + k` for `k < CHUNK` are valid f16 values, `o + k`
/// valid for writes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[inline]
unsafe fn chunk<F: Fn(f32, f32) -> f32>(f: &F, o: *mut f16, a: *const f16, b: *const f16) {
    use core::arch::x86_64::{
        _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128, _mm256_cvtph_ps, _mm256_cvtps_ph,
        _mm256_loadu_ps, _mm256_storeu_ps,
    };
    let (mut xa, mut xb, mut xo) = ([0f32; CHUNK], [0f32; CHUNK], [0f32; CHUNK]);
    for k in (0..CHUNK).step_by(8) {
        // SAFETY: `k + 8 <= CHUNK`: 16 readable bytes of each input, 32 writable bytes of each
        // local array; the intrinsics take unaligned addresses.
        unsafe {
            _mm256_storeu_ps(xa.as_mut_ptr().add(k), _mm256_cvtph_ps(_mm_loadu_si128(a.add(k).cast())));
            _mm256_storeu_ps(xb.as_mut_ptr().add(k), _mm256_cvtph_ps(_mm_loadu_si128(b.add(k).cast())));
        }
    }
    for k in 0..CHUNK {
        xo[k] = f(xa[k], xb[k]);
    }
    for k in (0..CHUNK).step_by(8) {
        // SAFETY: `k + 8 <= CHUNK`: 32 readable bytes of the local array, 16 writable bytes of
        // the output; rounding to nearest, ties to even, as `HalfFloat::narrow`.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(xo.as_ptr().add(k)));
            _mm_storeu_si128(o.add(k).cast(), h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        v.extend([0xff80_0001u32, 0x7fbf_e000, 0xffd5_4000, 0x7f80_1fff].map(f32::from_bits));
        let mut n = vec![MaybeUninit::new(f16::ZERO); v.len()];
        narrow_f16(&v, &mut n);
        for (x, y) in v.iter().zip(&n) {
            // SAFETY: `narrow_f16` wrote every element (and they started initialised).
            let y = unsafe { y.assume_init() };
            let want = f16::narrow(*x);
            // The same bits, NaN payloads included (a run's tail narrows as its blocks do).
            assert_eq!(y.to_bits(), want.to_bits(), "{:#010x}: {y} vs {want}", x.to_bits());
        }
    }

    /// The fused loops against the per-element reference, `f16(f(widen(x), widen(y)))`: every
    /// f16 value as the first operand, lengths around the chunk, steps 0 and 1, in place.
    #[test]
    fn fused_sum_lanes_add_like_the_scalar_lanes() {
        // Every f16 value but the NaNs and infinities, in an order that mixes magnitudes, plus
        // a tail that is no whole group.
        let x: Vec<f16> = (0..=u16::MAX)
            .map(|i| f16::from_bits(i.wrapping_mul(40_503)))
            .filter(|v| v.is_finite())
            .chain([f16::ONE; 9])
            .collect();
        let mut acc: [f32; SUM_LANES] = core::array::from_fn(|k| k as f32 * 0.25);
        let done = sum_lanes_f16(&x, &mut acc);
        let mut want: [f32; SUM_LANES] = core::array::from_fn(|k| k as f32 * 0.25);
        let whole = if has_f16c() { x.len() / SUM_LANES * SUM_LANES } else { 0 };
        for (j, v) in x[..whole].iter().enumerate() {
            want[j % SUM_LANES] += v.widen();
        }
        assert_eq!(done, whole);
        assert_eq!(acc.map(f32::to_bits), want.map(f32::to_bits));
    }

    #[test]
    fn fused_loops_round_once_like_the_reference() {
        let bits = |v: &[f16]| v.iter().map(|x| if x.is_nan() { u16::MAX } else { x.to_bits() }).collect::<Vec<_>>();
        let f = |x: f32, y: f32| x * 0.75 + y;
        let a: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let b: Vec<f16> = (0..=u16::MAX).map(|i| f16::from_bits(i.wrapping_mul(40_503))).collect();
        for n in [0, 1, 7, 31, 32, 33, 63, 64, 65, 100, a.len()] {
            for (sa, sb) in [(1, 1), (1, 0), (0, 1), (0, 0)] {
                let want: Vec<f16> = (0..n).map(|i| f16::narrow(f(a[i * sa].widen(), b[i * sb].widen()))).collect();
                let mut out = vec![f16::ZERO; n];
                // SAFETY: `a` and `b` hold more than `n` elements; `out` holds `n`.
                unsafe { map2_f16(&f, out.as_mut_ptr(), a.as_ptr(), sa, b.as_ptr(), sb, n) };
                assert_eq!(bits(&out), bits(&want), "n {n}, steps {sa} {sb}");
            }
            // In place: the output is the first operand.
            let mut x = a[..n].to_vec();
            let p = x.as_mut_ptr();
            // SAFETY: `x` holds `n` elements, read and written element for element; `b` more.
            unsafe { map2_f16(&f, p, p, 1, b.as_ptr(), 1, n) };
            let want: Vec<f16> = (0..n).map(|i| f16::narrow(f(a[i].widen(), b[i].widen()))).collect();
            assert_eq!(bits(&x), bits(&want), "in place, n {n}");
            let mut y = vec![f16::ZERO; n];
            // SAFETY: as above.
            unsafe { map2_f16(&|x: f32, _: f32| x.exp(), y.as_mut_ptr(), a.as_ptr(), 1, a.as_ptr(), 1, n) };
            let want: Vec<f16> = (0..n).map(|i| f16::narrow(a[i].widen().exp())).collect();
            assert_eq!(bits(&y), bits(&want), "unary, n {n}");
        }
    }
}
