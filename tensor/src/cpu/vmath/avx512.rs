//! GELU, SiLU, the sigmoid, GELU's tanh form, `tanh`, `exp` and `ln` over contiguous runs, four
//! AVX-512 vectors (64 elements) side by side.
//!
//! The plain loops run one vector through a function at a time. Its steps depend on one
//! another (GELU: a division, two polynomials, about 140 cycles from input to result), so the
//! out-of-order core holds one or two vectors' worth of waiting instructions and leaves the
//! vector units idle much of the time: GELU's 52 instructions per vector took well more cycles
//! than two 512-bit ports need to issue them (`docs/elementary-functions.md`). Written here with every
//! step applied to four vectors before the next, the instructions of four vectors are
//! interleaved in the program, and `2^n` scaling is one `vscalefps`; each lane goes through
//! the same IEEE operations as the scalar function, so the bits are the scalar function's
//! (`blocks_give_the_scalar_functions_bits`, `blocks_give_the_same_bits_on_every_f32`, in
//! `vmath`).
//!
//! Runs of bf16 and f16 ([`run_half`]) go through the same loop, each vector widened as it is
//! loaded and rounded once as it is stored, with the bits of the f32 function on the widened
//! values (`half_precision_runs_round_the_scalar_functions_result_once`).

use core::arch::x86_64::*;
use core::ops::{Add, Div, Mul, Neg, Sub};

use super::id::{EXP, GELU, GELU_TANH, LN, SIGMOID, SILU, TANH};
use super::lanes::Lanes;
use super::{Func, apply};

/// `M` vectors of 16 `f32`. Made only in [`blocks`], which runs only where the CPU has AVX-512 F:
/// that is what makes the intrinsics in its methods sound.
#[derive(Clone, Copy)]
pub(crate) struct Zmm<const M: usize>([__m512; M]);

/// `Zmm` from `$e`, evaluated for each vector `$k`, each intrinsic call sound because the
/// CPU has AVX-512 F (see [`Zmm`]).
macro_rules! each {
    (|$k:ident| $e:expr) => {{
        let mut r = [
            // SAFETY: a `Zmm` exists only where the CPU has AVX-512 F (see `Zmm`).
            unsafe { _mm512_setzero_ps() };
            M
        ];
        for $k in 0..M {
            // SAFETY: as above.
            r[$k] = unsafe { $e };
        }
        Zmm(r)
    }};
}

macro_rules! binary {
    ($($trait:ident $method:ident $intrinsic:ident),*) => {$(
        impl<const M: usize> $trait for Zmm<M> {
            type Output = Self;
            #[inline(always)]
            fn $method(self, o: Self) -> Self {
                each!(|k| $intrinsic(self.0[k], o.0[k]))
            }
        }
    )*};
}
binary!(Add add _mm512_add_ps, Sub sub _mm512_sub_ps, Mul mul _mm512_mul_ps, Div div _mm512_div_ps);

impl<const M: usize> Neg for Zmm<M> {
    type Output = Self;
    /// The sign bit flipped, as `-x` on an `f32`.
    #[inline(always)]
    fn neg(self) -> Self {
        each!(|k| _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(self.0[k]), _mm512_set1_epi32(i32::MIN))))
    }
}

impl<const M: usize> Lanes for Zmm<M> {
    type Mask = [__mmask16; M];

    #[inline(always)]
    fn splat(v: f32) -> Self {
        each!(|_k| _mm512_set1_ps(v))
    }

    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        each!(|k| _mm512_fmadd_ps(self.0[k], a.0[k], b.0[k]))
    }

    #[inline(always)]
    fn abs(self) -> Self {
        each!(|k| _mm512_abs_ps(self.0[k]))
    }

    #[inline(always)]
    fn lt(self, o: Self) -> Self::Mask {
        // SAFETY: a `Zmm` exists only where the CPU has AVX-512 F (see `Zmm`).
        core::array::from_fn(|k| unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0[k], o.0[k]) })
    }

    #[inline(always)]
    fn select(m: Self::Mask, a: Self, b: Self) -> Self {
        each!(|k| _mm512_mask_blend_ps(m[k], b.0[k], a.0[k]))
    }

    /// A zeroing masked move.
    #[inline(always)]
    fn masked(m: Self::Mask, a: Self) -> Self {
        each!(|k| _mm512_maskz_mov_ps(m[k], a.0[k]))
    }

    /// `vmaxps` and `vminps` give their second operand where either is NaN: `max(lo, x)` is
    /// `if x < lo { lo } else { x }`, as `f32::clamp`.
    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        each!(|k| _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), self.0[k])))
    }

    /// `vminps` (its second operand where either is NaN).
    #[inline(always)]
    fn min(self, hi: f32) -> Self {
        each!(|k| _mm512_min_ps(self.0[k], _mm512_set1_ps(hi)))
    }

    /// `vmaxps` (its second operand where either is NaN).
    #[inline(always)]
    fn max(self, lo: f32) -> Self {
        each!(|k| _mm512_max_ps(self.0[k], _mm512_set1_ps(lo)))
    }

    /// `vscalefps`: `self 2^n` rounded once, `n` being `t - SHIFT` (an integer).
    #[inline(always)]
    fn scale_by_pow2(self, t: Self) -> Self {
        let n = t - Self::splat(super::SHIFT);
        each!(|k| _mm512_scalef_ps(self.0[k], n.0[k]))
    }

    /// `vscalefps` by `n - 1 = t - (SHIFT + 1)` (exact: both are integers below 2^24).
    #[inline(always)]
    fn half_scale_by_pow2(self, t: Self) -> Self {
        let n = t - Self::splat(super::SHIFT + 1.0);
        each!(|k| _mm512_scalef_ps(self.0[k], n.0[k]))
    }

    /// As [`scale_by_pow2`](Lanes::scale_by_pow2): `self 2^n` rounded once.
    #[inline(always)]
    fn scale_by_normal_pow2(self, t: Self) -> Self {
        self.scale_by_pow2(t)
    }

    /// As [`scale_by_pow2`](Lanes::scale_by_pow2): `self 2^n` rounded once.
    #[inline(always)]
    fn scale_e_by_pow2(self, t: Self) -> Self {
        self.scale_by_pow2(t)
    }

    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        each!(|k| {
            let (m, v, s) =
                (_mm512_set1_epi32(i32::MIN), _mm512_castps_si512(self.0[k]), _mm512_castps_si512(sign.0[k]));
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(m, v), _mm512_and_si512(m, s)))
        })
    }

    /// `vgetmantps` (normalised to `[0.5, 1)`) and `vgetexpps` (`floor(log2 |x|)`, so one
    /// more for that interval), both exact and both taking subnormals as the numbers they are.
    #[inline(always)]
    fn frexp(self) -> (Self, Self) {
        let m = each!(|k| _mm512_getmant_ps::<_MM_MANT_NORM_P5_1, _MM_MANT_SIGN_ZERO>(self.0[k]));
        let e = each!(|k| _mm512_getexp_ps(self.0[k]));
        (m, e + Self::splat(1.0))
    }

    /// One `vfixupimmps`, which replaces each lane by a value chosen by the class of `x`'s
    /// lane (4 bits per class, the table's class `j` at bits `4j..4j + 4`): QNaN and SNaN
    /// (classes 0 and 1) take `x` (token 1), zero (2) `-inf` (token 4), `+inf` (5) `x`; 1.0
    /// (3), `-inf` (4), negative (6) and positive (7) numbers keep `self` (token 0).
    /// Subnormals are numbers (the DAZ flag, which would make them zero, is off in Rust
    /// programs). It takes the place of the `f32` form's three compares and three blends
    /// (`docs/elementary-functions.md`).
    #[inline(always)]
    fn ln_edges(self, x: Self) -> Self {
        const TABLE: i32 = 0x0010_0411;
        each!(|k| _mm512_fixupimm_ps::<0>(self.0[k], x.0[k], _mm512_set1_epi32(TABLE)))
    }
}

/// The 16-bit float types [`run_half`] takes: their bits widened to `f32` as they are loaded
/// (exactly) and rounded once as they are stored (to nearest, ties to even).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    Bf16,
    F16,
}

// The element kinds as numbers, for `blocks`' const parameter: bf16 is rounded in integer
// arithmetic, or (`BF16_CVT`, where the CPU has AVX512-BF16) by its conversion instruction.
const F32: u8 = 0;
const BF16: u8 = 1;
const F16: u8 = 2;
const BF16_CVT: u8 = 3;

/// `o[i] = f(x[i])` for `i < n`: 64 elements at a time, then 16 at a time, the last ones
/// under a mask.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL. `x` is readable and `o` writable for `n` `f32`s, and `o`
/// is `x` or overlaps it nowhere.
pub(crate) unsafe fn run(f: Func, x: *const f32, o: *mut f32, n: usize) {
    // SAFETY: the caller's promise.
    unsafe { run_as::<F32>(f, x.cast(), o.cast(), n) }
}

/// As [`run`], for runs of bf16 or f16 elements: each element widened to `f32`, through `f`,
/// and rounded once, in registers, with the same bits as widening the run into an `f32`
/// buffer, [`run`] and rounding (bf16 as [`HalfFloat::narrow`](crate::halfconv::HalfFloat),
/// f16 with `vcvtps2ph`, as the converting loops do). The widening and the rounding are a few
/// instructions per 16 elements in the same loop, where the converting loops (widen, [`run`],
/// round through 128-element buffers, each a pass of its own) make a bf16 tensor take much
/// longer than an f32 one (`docs/elementary-functions.md`).
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL. `x` is readable and `o` writable for `n` 16-bit
/// elements, and `o` is `x` or overlaps it nowhere.
pub(crate) unsafe fn run_half(f: Func, half: Half, x: *const u16, o: *mut u16, n: usize) {
    // SAFETY: the caller's promise; `BF16_CVT` where the CPU has its features.
    unsafe {
        match half {
            Half::Bf16 if bf16_conversion() => run_as::<BF16_CVT>(f, x.cast(), o.cast(), n),
            Half::Bf16 => run_as::<BF16>(f, x.cast(), o.cast(), n),
            Half::F16 => run_as::<F16>(f, x.cast(), o.cast(), n),
        }
    }
}

/// [`run`] over elements of kind `E`.
///
/// # Safety
/// As [`run`], for `n` elements of kind `E`; for [`BF16_CVT`], the CPU has the features of
/// [`blocks_bf16`].
unsafe fn run_as<const E: u8>(f: Func, x: *const u8, o: *mut u8, n: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        match f {
            Func::Gelu => blocks_of::<GELU, E>(x, o, n),
            Func::Silu => blocks_of::<SILU, E>(x, o, n),
            Func::Sigmoid => blocks_of::<SIGMOID, E>(x, o, n),
            Func::GeluTanh => blocks_of::<GELU_TANH, E>(x, o, n),
            Func::Tanh => blocks_of::<TANH, E>(x, o, n),
            Func::Exp => blocks_of::<EXP, E>(x, o, n),
            Func::Ln => blocks_of::<LN, E>(x, o, n),
        }
    }
}

/// [`blocks_bf16`] for [`BF16_CVT`], else [`blocks`].
///
/// # Safety
/// As [`run_as`].
#[inline(always)]
unsafe fn blocks_of<const F: u8, const E: u8>(x: *const u8, o: *mut u8, n: usize) {
    // SAFETY: the caller's promise.
    unsafe { if E == BF16_CVT { blocks_bf16::<F>(x, o, n) } else { blocks::<F, E>(x, o, n) } }
}

/// The CPU has AVX512-BF16's conversion (`vcvtne2ps2bf16`) and AVX-512 DQ's `vfpclassps`,
/// which [`store_pair_bf16`] uses (every CPU with the first has the second). Switched off
/// with the blocks ([`set_avx512_blocks`](crate::set_avx512_blocks)), not apart.
pub(crate) fn bf16_conversion() -> bool {
    is_x86_feature_detected!("avx512bf16") && is_x86_feature_detected!("avx512dq")
}

/// The lanes of `m` of the 16 elements of kind `E` from element `i` of `x`, as `f32` (0 in the
/// other lanes).
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL; the lanes of `m` are readable elements of kind `E`.
#[inline(always)]
unsafe fn load<const E: u8>(x: *const u8, i: usize, m: __mmask16) -> __m512 {
    // SAFETY: our contract (masked loads touch only the lanes of `m`).
    unsafe {
        match E {
            F32 => _mm512_maskz_loadu_ps(m, x.cast::<f32>().add(i)),
            BF16 | BF16_CVT => {
                let h = _mm256_maskz_loadu_epi16(m, x.cast::<i16>().add(i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
            _ => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x.cast::<i16>().add(i))),
        }
    }
}

/// Stores the lanes of `m` of `v` as elements of kind `E` from element `i` of `o`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL; the lanes of `m` are writable elements of kind `E`.
#[inline(always)]
unsafe fn store<const E: u8>(o: *mut u8, i: usize, m: __mmask16, v: __m512) {
    // SAFETY: our contract (masked stores touch only the lanes of `m`).
    unsafe {
        match E {
            F32 => _mm512_mask_storeu_ps(o.cast::<f32>().add(i), m, v),
            BF16 | BF16_CVT => {
                // `HalfFloat::narrow` for bf16: add 0x7fff plus the lowest kept bit and keep the
                // top half; a NaN keeps its top half with the quiet bit set.
                let b = _mm512_castps_si512(v);
                let top = _mm512_srli_epi32::<16>(b);
                let odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
                let rounded =
                    _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))));
                let quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
                let r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v), rounded, quiet);
                _mm256_mask_storeu_epi16(o.cast::<i16>().add(i), m, _mm512_cvtepi32_epi16(r))
            }
            _ => {
                let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_mask_storeu_epi16(o.cast::<i16>().add(i), m, h)
            }
        }
    }
}

/// The mask of the first `min(left, 16)` lanes, for a loop's last, partial vector.
#[inline(always)]
fn first_lanes(left: usize) -> __mmask16 {
    if left >= 16 { u16::MAX } else { (1u16 << left) - 1 }
}

/// [`run_as`] for function `F` on elements of kind `E`, compiled for AVX-512.
///
/// # Safety
/// As [`run_as`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn blocks<const F: u8, const E: u8>(x: *const u8, o: *mut u8, n: usize) {
    // SAFETY: our contract.
    unsafe { blocks_in::<F, E>(x, o, n) }
}

/// [`blocks`] for bf16, compiled for AVX512-BF16 too: the results are rounded two vectors at a
/// time by `vcvtne2ps2bf16` (see [`store_pair_bf16`]).
///
/// # Safety
/// As [`run_as`]; the CPU also has AVX512-BF16 and AVX-512 DQ.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
unsafe fn blocks_bf16<const F: u8>(x: *const u8, o: *mut u8, n: usize) {
    // SAFETY: our contract.
    unsafe { blocks_in::<F, BF16_CVT>(x, o, n) }
}

/// The loop of [`blocks`] (inlined into each of its compiled forms).
///
/// # Safety
/// As [`run_as`], and the CPU features of the caller's kind `E`.
#[inline(always)]
unsafe fn blocks_in<const F: u8, const E: u8>(x: *const u8, o: *mut u8, n: usize) {
    let mut i = 0;
    while n - i >= 64 {
        // SAFETY: (all blocks below) the CPU has the caller's features.
        let mut v = [unsafe { _mm512_setzero_ps() }; 4];
        for (k, v) in v.iter_mut().enumerate() {
            // SAFETY: `i + 16 k + 16 <= n`: readable (the caller's promise).
            *v = unsafe { load::<E>(x, i + 16 * k, u16::MAX) };
        }
        let r = apply::<F, _>(Zmm(v)).0;
        // SAFETY: as the loads; `o` is `x` (each element read before it is written, in
        // this step) or disjoint from it.
        unsafe {
            if E == BF16_CVT {
                store_pair_bf16(o, i, r[0], r[1]);
                store_pair_bf16(o, i + 32, r[2], r[3]);
            } else {
                for (k, r) in r.into_iter().enumerate() {
                    store::<E>(o, i + 16 * k, u16::MAX, r);
                }
            }
        }
        i += 64;
    }
    while i < n {
        let m = first_lanes(n - i);
        // SAFETY: a masked load reads only the lanes of `m`, elements below `n`; the others
        // are 0 and are not stored.
        let v = unsafe { load::<E>(x, i, m) };
        let r = apply::<F, _>(Zmm([v]));
        // SAFETY: the lanes of `m` only, writable as above.
        unsafe { store::<E>(o, i, m, r.0[0]) };
        i += 16;
    }
}

/// `o[i] = x[i]` rounded to bf16 for `i < n`, with the bits of
/// [`HalfFloat::narrow`](crate::halfconv::HalfFloat): 32 at a time by
/// [`store_pair_bf16`], the last ones under a mask in integer arithmetic ([`store`]).
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and DQ and AVX512-BF16 ([`bf16_conversion`]); `x` is
/// readable for `n` `f32`s and `o` writable for `n` bf16, apart from it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
pub(crate) unsafe fn narrow_bf16(x: *const f32, o: *mut u16, n: usize) {
    let mut i = 0;
    while n - i >= 32 {
        // SAFETY: `i + 32 <= n`: 32 readable `f32`s and 32 writable bf16 (the caller's
        // promise); unaligned loads; the CPU has `store_pair_bf16`'s features.
        unsafe { store_pair_bf16(o.cast(), i, _mm512_loadu_ps(x.add(i)), _mm512_loadu_ps(x.add(i + 16))) };
        i += 32;
    }
    while i < n {
        let m = first_lanes(n - i);
        // SAFETY: the lanes of `m` are elements below `n`, readable and writable; masked loads
        // and stores touch no other lane.
        unsafe { store::<BF16>(o.cast(), i, m, _mm512_maskz_loadu_ps(m, x.add(i))) };
        i += 16;
    }
}

/// Stores `lo` and `hi` as the 32 bf16 from element `i` of `o`, rounded as
/// [`HalfFloat::narrow`](crate::halfconv::HalfFloat) rounds: by `vcvtne2ps2bf16`,
/// which rounds the same way (to nearest, ties to even; a NaN keeps its top half with the quiet
/// bit set) except that it flushes subnormal `f32` to zero. A pair holding one takes the
/// integer rounding of [`store`] instead (11 instructions per vector against about 2 here).
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and DQ and AVX512-BF16; the 32 elements are writable.
#[inline(always)]
unsafe fn store_pair_bf16(o: *mut u8, i: usize, lo: __m512, hi: __m512) {
    // SAFETY: our contract.
    unsafe {
        // `vfpclassps` category 0x20: subnormal.
        if _mm512_fpclass_ps_mask::<0x20>(lo) | _mm512_fpclass_ps_mask::<0x20>(hi) == 0 {
            let h: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(o.cast::<i16>().add(i).cast(), h);
        } else {
            store::<BF16>(o, i, u16::MAX, lo);
            store::<BF16>(o, i + 16, u16::MAX, hi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::isa::{Isa, detected};

    /// `ln`'s edges to the bit, in the blocks (`vfixupimmps`) and in the scalar function
    /// (`same_bits_*` take any NaN as any other): `f32::NAN`'s bits below 0, as PyTorch
    /// gives; a NaN argument's own bits, sign and payload (a signalling one too); -inf for ±0;
    /// inf for inf; subnormals as the numbers they are.
    #[test]
    fn ln_edges_to_the_bit() {
        let cases: [(u32, u32); 12] = [
            ((-1.0f32).to_bits(), f32::NAN.to_bits()),
            (f32::NEG_INFINITY.to_bits(), f32::NAN.to_bits()),
            (0x8000_0001, f32::NAN.to_bits()),
            (f32::MIN.to_bits(), f32::NAN.to_bits()),
            (0x7fc0_0001, 0x7fc0_0001),
            (0xffc1_2345, 0xffc1_2345),
            (0x7f80_0001, 0x7f80_0001),
            (0.0f32.to_bits(), f32::NEG_INFINITY.to_bits()),
            (0x8000_0000, f32::NEG_INFINITY.to_bits()),
            (f32::INFINITY.to_bits(), f32::INFINITY.to_bits()),
            (1.0f32.to_bits(), 0),
            // ln(2^-149) = -103.27893, the nearest f32.
            (1, (-103.278_93f32).to_bits()),
        ];
        for (x, want) in cases {
            assert_eq!(super::super::ln(f32::from_bits(x)).to_bits(), want, "scalar ln of {x:#010x}");
        }
        if detected() != Isa::Avx512 {
            eprintln!("skipped the blocks: this CPU has no AVX-512");
            return;
        }
        // Each case in every lane of a block of four vectors, and in the masked tail.
        for n in [64, 64 + 16, 64 + 5] {
            for (x, want) in cases {
                let mut buf = vec![f32::from_bits(x); n];
                // SAFETY: AVX-512 is there (checked above); `o` is `x`, `n` elements.
                unsafe { run(Func::Ln, buf.as_ptr(), buf.as_mut_ptr(), n) };
                assert!(buf.iter().all(|y| y.to_bits() == want), "blocks' ln of {x:#010x}, {n} elements: {buf:?}");
            }
        }
    }

    /// Every bf16 and every f16 value through each function, as half-precision runs (fused
    /// with the conversions: both bf16 roundings where the CPU has AVX512-BF16) of every length
    /// up to 150, in place and apart: the bits of the scalar function on the widened value,
    /// rounded once (NaN as any NaN). GELU below -13 gives subnormal `f32` results, which
    /// `vcvtne2ps2bf16` would flush: those pairs take the integer rounding.
    #[test]
    fn half_precision_runs_round_the_scalar_functions_result_once() {
        use crate::halfconv::HalfFloat;
        use half::{bf16, f16};
        if detected() != Isa::Avx512 {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        type Scalar = fn(f32) -> f32;
        type Run = unsafe fn(Func, *const u8, *mut u8, usize);
        /// One way of running the functions over 16-bit elements, and its element type.
        struct Kind {
            name: &'static str,
            run: Run,
            widen: fn(u16) -> f32,
            narrow: fn(f32) -> u16,
            is_nan: fn(u16) -> bool,
        }
        let funcs: [(Func, Scalar); 7] = [
            (Func::Gelu, super::super::gelu),
            (Func::Silu, super::super::silu),
            (Func::Sigmoid, super::super::sigmoid),
            (Func::GeluTanh, super::super::gelu_tanh),
            (Func::Tanh, super::super::tanh),
            (Func::Exp, super::super::exp),
            (Func::Ln, super::super::ln),
        ];
        let bf16 = |run: Run, name: &'static str| Kind {
            name,
            run,
            widen: |b| bf16::from_bits(b).widen(),
            narrow: |y| bf16::narrow(y).to_bits(),
            is_nan: |b| b & 0x7f80 == 0x7f80 && b & 0x7f != 0,
        };
        // SAFETY: (this run and those below) the test's callers pass valid runs; AVX-512 is
        // there (checked above), and AVX512-BF16 and DQ for `blocks_bf16` (checked where it is
        // run).
        let integer: Run = |f, x, o, n| unsafe { run_as::<BF16>(f, x, o, n) };
        let mut kinds = vec![
            bf16(integer, "bf16"),
            Kind {
                name: "f16",
                // SAFETY: as above.
                run: |f, x, o, n| unsafe { run_as::<F16>(f, x, o, n) },
                widen: |b| f16::from_bits(b).widen(),
                // `vcvtps2ph`, as the converting loops round f16: `f16::narrow` for numbers.
                narrow: |y| if y.is_nan() { 0x7e00 } else { f16::narrow(y).to_bits() },
                is_nan: |b| b & 0x7c00 == 0x7c00 && b & 0x3ff != 0,
            },
        ];
        if bf16_conversion() {
            // SAFETY: as above.
            kinds.push(bf16(|f, x, o, n| unsafe { run_as::<BF16_CVT>(f, x, o, n) }, "bf16 by vcvtne2ps2bf16"));
        }
        let xs: Vec<u16> = (0..=u16::MAX).collect();
        for k in kinds {
            for (f, scalar) in funcs {
                let same = |got: &[u16], want: &[u16], what: &str| {
                    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                        let ok = g == w || (k.is_nan)(g) && (k.is_nan)(w);
                        assert!(ok, "{f:?} in {}, {what}: {g:#06x}, not {w:#06x} (element {i})", k.name);
                    }
                };
                let want: Vec<u16> = xs.iter().map(|&b| (k.narrow)(scalar((k.widen)(b)))).collect();
                let mut got = vec![0u16; xs.len()];
                // SAFETY: `xs` and `got` hold `xs.len()` elements each, apart.
                unsafe { (k.run)(f, xs.as_ptr().cast(), got.as_mut_ptr().cast(), xs.len()) };
                same(&got, &want, "one run");
                for n in 0..150 {
                    let start = (n * 433) % (xs.len() - n);
                    let mut buf = xs[start..start + n].to_vec();
                    // SAFETY: `buf` holds `n` elements; `o` is `x`.
                    unsafe { (k.run)(f, buf.as_ptr().cast(), buf.as_mut_ptr().cast(), n) };
                    same(&buf, &want[start..start + n], &format!("{n} in place from {start}"));
                }
            }
        }
    }
}
