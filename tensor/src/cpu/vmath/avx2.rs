//! GELU, SiLU, the sigmoid, GELU's tanh form, `tanh`, `exp` and `ln` over contiguous `f32`
//! runs on CPUs with AVX2 and FMA but not AVX-512 (AMD Zen 2 and 3, Intel client cores):
//! [`avx512`](super::avx512)'s blocks with 8-lane vectors, several side by side.
//!
//! Compiled for AVX2, the scalar functions' loops run one vector through a function at a time,
//! and its chain of dependent steps leaves the vector units idle, as on AVX-512 (see
//! [`avx512`](super::avx512)). Here every step is applied to [`VECTORS`] vectors before the next.
//! AVX2 has none of AVX-512's `vscalefps`, `vgetmantps`, `vgetexpps` or `vfixupimmps`: `2^n`
//! scaling, the `m 2^e` split and `ln`'s edges are the `f32` form's integer operations on the
//! bits, compares and blends, each lane the same IEEE operations in the same order as the
//! scalar function, so the bits are the scalar function's (`blocks_give_the_scalar_functions_bits`,
//! `blocks_give_the_same_bits_on_every_f32`, in `vmath`).

use core::arch::x86_64::*;
use core::ops::{Add, Div, Mul, Neg, Sub};

use super::id::{EXP, GELU, GELU_TANH, LN, SIGMOID, SILU, TANH};
use super::lanes::Lanes;
use super::{Func, apply};

/// The vectors side by side in a block. AVX2 has 16 vector registers, half of AVX-512's 32,
/// so four vectors' steps spill some values to the stack; still, four are faster than two and
/// three (and one, which is the plain loop's schedule) for each function but `tanh`
/// (`docs/elementary-functions.md`).
const VECTORS: usize = 4;

/// `M` vectors of 8 `f32`. Made only in [`blocks`], which runs only where the CPU has AVX2 and
/// FMA: that is what makes the intrinsics in its methods sound.
#[derive(Clone, Copy)]
struct Ymm<const M: usize>([__m256; M]);

/// `Ymm` from `$e`, evaluated for each vector `$k`, each intrinsic call sound because the CPU
/// has AVX2 and FMA (see [`Ymm`]).
macro_rules! each {
    (|$k:ident| $e:expr) => {{
        let mut r = [
            // SAFETY: a `Ymm` exists only where the CPU has AVX2 and FMA (see `Ymm`).
            unsafe { _mm256_setzero_ps() };
            M
        ];
        for $k in 0..M {
            // SAFETY: as above.
            r[$k] = unsafe { $e };
        }
        Ymm(r)
    }};
}

macro_rules! binary {
    ($($trait:ident $method:ident $intrinsic:ident),*) => {$(
        impl<const M: usize> $trait for Ymm<M> {
            type Output = Self;
            #[inline(always)]
            fn $method(self, o: Self) -> Self {
                each!(|k| $intrinsic(self.0[k], o.0[k]))
            }
        }
    )*};
}
binary!(Add add _mm256_add_ps, Sub sub _mm256_sub_ps, Mul mul _mm256_mul_ps, Div div _mm256_div_ps);

impl<const M: usize> Neg for Ymm<M> {
    type Output = Self;
    /// The sign bit flipped, as `-x` on an `f32`.
    #[inline(always)]
    fn neg(self) -> Self {
        each!(|k| _mm256_xor_ps(self.0[k], _mm256_set1_ps(-0.0)))
    }
}

impl<const M: usize> Ymm<M> {
    /// The lanes' bits as integers, through `f`, back as `f32` bits.
    #[inline(always)]
    fn on_bits(self, f: impl Fn(__m256i) -> __m256i) -> Self {
        // SAFETY: casts only (no instruction), on a CPU with AVX (see `Ymm`).
        each!(|k| _mm256_castsi256_ps(f(_mm256_castps_si256(self.0[k]))))
    }

    /// The significand with the exponent of 0.5: in `[0.5, 1)` for a positive normal lane.
    #[inline(always)]
    fn significand(self) -> Self {
        // SAFETY: the CPU has AVX2 (see `Ymm`).
        self.on_bits(|b| unsafe {
            _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(0x007f_ffff)), _mm256_set1_epi32(0x3f00_0000))
        })
    }
}

/// `2^(n + EXTRA)` for the `t` of `exp_parts`, as [`pow2_plus`](super::pow2_plus): `t`'s bits
/// shifted, plus a constant.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn pow2_plus<const EXTRA: u32>(t: __m256i) -> __m256i {
    let bias = (127 + EXTRA).wrapping_sub(super::SHIFT.to_bits()).wrapping_shl(23);
    // SAFETY: the caller's promise.
    unsafe { _mm256_add_epi32(_mm256_slli_epi32::<23>(t), _mm256_set1_epi32(bias as i32)) }
}

impl<const M: usize> Lanes for Ymm<M> {
    type Mask = [__m256; M];

    #[inline(always)]
    fn splat(v: f32) -> Self {
        each!(|_k| _mm256_set1_ps(v))
    }

    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        each!(|k| _mm256_fmadd_ps(self.0[k], a.0[k], b.0[k]))
    }

    /// The sign bit cleared.
    #[inline(always)]
    fn abs(self) -> Self {
        each!(|k| _mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0[k]))
    }

    #[inline(always)]
    fn lt(self, o: Self) -> Self::Mask {
        // SAFETY: a `Ymm` exists only where the CPU has AVX2 (see `Ymm`).
        core::array::from_fn(|k| unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self.0[k], o.0[k]) })
    }

    /// `vblendvps`, by the masks' sign bits (every bit of a lane, from a compare).
    #[inline(always)]
    fn select(m: Self::Mask, a: Self, b: Self) -> Self {
        each!(|k| _mm256_blendv_ps(b.0[k], a.0[k], m[k]))
    }

    /// An `and` with the mask (every bit of a lane set or clear, from a compare).
    #[inline(always)]
    fn masked(m: Self::Mask, a: Self) -> Self {
        each!(|k| _mm256_and_ps(m[k], a.0[k]))
    }

    /// `vmaxps` and `vminps` give their second operand where either is NaN: `max(lo, x)` is
    /// `if x < lo { lo } else { x }`, as `f32::clamp`.
    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        each!(|k| _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), self.0[k])))
    }

    /// `vminps` (its second operand where either is NaN).
    #[inline(always)]
    fn min(self, hi: f32) -> Self {
        each!(|k| _mm256_min_ps(self.0[k], _mm256_set1_ps(hi)))
    }

    /// `vmaxps` (its second operand where either is NaN).
    #[inline(always)]
    fn max(self, lo: f32) -> Self {
        each!(|k| _mm256_max_ps(self.0[k], _mm256_set1_ps(lo)))
    }

    /// As the `f32` form: `self 2^(n + 100)` (exact), then by 2^-100 (one rounding).
    #[inline(always)]
    fn scale_by_pow2(self, t: Self) -> Self {
        // SAFETY: the CPU has AVX2 (see `Ymm`).
        self * t.on_bits(|t| unsafe { pow2_plus::<100>(t) }) * Self::splat(super::TWO_M100)
    }

    /// As the `f32` form, with 2^(n + 99).
    #[inline(always)]
    fn half_scale_by_pow2(self, t: Self) -> Self {
        // SAFETY: as above.
        self * t.on_bits(|t| unsafe { pow2_plus::<99>(t) }) * Self::splat(super::TWO_M100)
    }

    #[inline(always)]
    fn scale_by_normal_pow2(self, t: Self) -> Self {
        // SAFETY: as above.
        self * t.on_bits(|t| unsafe { pow2_plus::<0>(t) })
    }

    /// As the `f32` form ([`pow2_halves`](super::pow2_halves)): by `2^(n >> 1)` (exact), then by
    /// `2^(n - (n >> 1))` (one rounding).
    #[inline(always)]
    fn scale_e_by_pow2(self, t: Self) -> Self {
        // SAFETY: the CPU has AVX2 (see `Ymm`).
        let n = |t| unsafe { _mm256_sub_epi32(t, _mm256_set1_epi32(super::SHIFT.to_bits() as i32)) };
        // SAFETY: as above.
        let pow2 = |k| unsafe { _mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127))) };
        // SAFETY: as above.
        let p1 = t.on_bits(|t| pow2(unsafe { _mm256_srai_epi32::<1>(n(t)) }));
        // SAFETY: as above.
        let p2 = t.on_bits(|t| pow2(unsafe { _mm256_sub_epi32(n(t), _mm256_srai_epi32::<1>(n(t))) }));
        self * p1 * p2
    }

    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        each!(|k| {
            let m = _mm256_set1_ps(-0.0);
            _mm256_or_ps(_mm256_andnot_ps(m, self.0[k]), _mm256_and_ps(m, sign.0[k]))
        })
    }

    /// As the `f32` form, from the bits: a subnormal is scaled by 2^23 (exact) first.
    #[inline(always)]
    fn frexp(self) -> (Self, Self) {
        let sub = self.lt(Self::splat(f32::MIN_POSITIVE));
        let y = Self::select(sub, self * Self::splat(8_388_608.0), self);
        let m = y.significand();
        // The integer to subtract from the exponent field, 126 + 23 or 126, as a lane's bits.
        let bias = Self::select(sub, Self::splat(f32::from_bits(126 + 23)), Self::splat(f32::from_bits(126)));
        let e = each!(|k| {
            let b = _mm256_and_si256(_mm256_srli_epi32::<23>(_mm256_castps_si256(y.0[k])), _mm256_set1_epi32(0xff));
            _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_castps_si256(bias.0[k])))
        });
        (m, e)
    }

    /// The exponent and significand fields as they are: `m` the significand with the exponent
    /// of 0.5, `e` the biased exponent less 126.
    #[inline(always)]
    fn frexp_normal(self) -> (Self, Self) {
        let m = self.significand();
        let e = each!(|k| {
            let b = _mm256_srli_epi32::<23>(_mm256_castps_si256(self.0[k]));
            _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(126)))
        });
        (m, e)
    }

    /// Two compares a vector (`MIN_POSITIVE <= x < inf`, false for NaN), the masks `and`ed
    /// and their sign bits read at once.
    #[inline(always)]
    fn all_positive_normal(self) -> bool {
        // SAFETY: (this block and the next) the CPU has AVX2 (see `Ymm`).
        let mut all = unsafe { _mm256_castsi256_ps(_mm256_set1_epi32(-1)) };
        for v in self.0 {
            // SAFETY: as above.
            all = unsafe {
                let normal = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_GE_OQ>(v, _mm256_set1_ps(f32::MIN_POSITIVE)),
                    _mm256_cmp_ps::<_CMP_LT_OQ>(v, _mm256_set1_ps(f32::INFINITY)),
                );
                _mm256_and_ps(all, normal)
            };
        }
        // SAFETY: as above.
        unsafe { _mm256_movemask_ps(all) == 0xff }
    }

    /// Three compares and two blends, as the `f32` form's branches.
    #[inline(always)]
    fn ln_edges(self, x: Self) -> Self {
        each!(|k| {
            let x = x.0[k];
            let kept = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
                _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::INFINITY)),
            );
            let r = _mm256_blendv_ps(self.0[k], x, kept);
            _mm256_blendv_ps(r, _mm256_set1_ps(f32::NEG_INFINITY), _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_setzero_ps()))
        })
    }
}

/// `o[i] = f(x[i])` for `i < n`: [`VECTORS`] vectors of 8 at a time, then one, the last ones
/// under a mask.
///
/// # Safety
/// The CPU has AVX2 and FMA. `x` is readable and `o` writable for `n` `f32`s, and `o` is `x` or
/// overlaps it nowhere.
pub(crate) unsafe fn run(f: Func, x: *const f32, o: *mut f32, n: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        match f {
            Func::Gelu => blocks::<GELU>(x, o, n),
            Func::Silu => blocks::<SILU>(x, o, n),
            Func::Sigmoid => blocks::<SIGMOID>(x, o, n),
            Func::GeluTanh => blocks::<GELU_TANH>(x, o, n),
            Func::Tanh => blocks::<TANH>(x, o, n),
            Func::Exp => blocks::<EXP>(x, o, n),
            Func::Ln => blocks::<LN>(x, o, n),
        }
    }
}

/// [`run`] for function `F`, compiled for AVX2 and FMA.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx2,fma")]
unsafe fn blocks<const F: u8>(x: *const f32, o: *mut f32, n: usize) {
    const W: usize = 8 * VECTORS;
    let mut i = 0;
    while n - i >= W {
        // SAFETY: `i + W <= n`: readable (the caller's promise); unaligned loads.
        let v: [__m256; VECTORS] = core::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.add(i + 8 * k)) });
        let r = apply::<F, _>(Ymm(v)).0;
        for (k, r) in r.into_iter().enumerate() {
            // SAFETY: as the loads; `o` is `x` (each element read before it is written, in
            // this step) or disjoint from it.
            unsafe { _mm256_storeu_ps(o.add(i + 8 * k), r) };
        }
        i += W;
    }
    while i < n {
        // The first `min(n - i, 8)` lanes: lane `j` is in where `j < n - i`.
        let left = (n - i).min(8) as i32;
        let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        // SAFETY: a masked load reads only the lanes of `m`, elements below `n`; the others are
        // 0 and are not stored.
        let v = unsafe { _mm256_maskload_ps(x.add(i), m) };
        let r = apply::<F, _>(Ymm([v])).0[0];
        // SAFETY: the lanes of `m` only, writable as above.
        unsafe { _mm256_maskstore_ps(o.add(i), m, r) };
        i += 8;
    }
}
