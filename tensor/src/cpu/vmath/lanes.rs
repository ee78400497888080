//! The operations the `vmath` formulas are written in, over a value that is one `f32` or a
//! group of vectors of them ([`Zmm`](super::avx512::Zmm)): each formula is written once, and
//! every lane of a group goes through the same IEEE operations, in the same order, as the
//! scalar `f32` does, so that both give the same bits.
//!
//! For `f32` each method is the `f32` operation itself (the loops calling the scalar
//! functions are vectorised by the compiler, as before there was a trait).

use core::ops::{Add, Div, Mul, Neg, Sub};

/// One `f32`, or several side by side.
pub(crate) trait Lanes:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + Neg<Output = Self>
{
    /// The result of a comparison, lane by lane.
    type Mask: Copy;
    /// `v` in every lane.
    fn splat(v: f32) -> Self;
    /// `self * a + b`, rounded once.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// `|self|`.
    fn abs(self) -> Self;
    /// `self < o` (false where either is NaN).
    fn lt(self, o: Self) -> Self::Mask;
    /// `a` where `m` holds, `b` elsewhere.
    fn select(m: Self::Mask, a: Self, b: Self) -> Self;
    /// `a` where `m` holds, `+0` elsewhere: [`select`](Lanes::select) with a zero, one `and`
    /// where a mask is a vector of all-ones and all-zeros lanes (a blend is three operations on
    /// recent Intel cores).
    fn masked(m: Self::Mask, a: Self) -> Self;
    /// `f32::clamp`: NaN stays NaN.
    fn clamp(self, lo: f32, hi: f32) -> Self;
    /// `self` where `self < hi`, else `hi` (so NaN gives `hi`), as `vminps` takes it.
    fn min(self, hi: f32) -> Self;
    /// `self` where `self > lo`, else `lo` (so NaN gives `lo`), as `vmaxps` takes it.
    fn max(self, lo: f32) -> Self;
    /// `self 2^n` rounded once, for the `t` of `exp_parts` with `n` in `[-217, 0]` and `self`
    /// with `|self| 2^(n + 100)` below 2^128 (or `self` infinite, or NaN).
    fn scale_by_pow2(self, t: Self) -> Self;
    /// `self 2^(n - 1)` rounded once, for `t` and `self` as in
    /// [`scale_by_pow2`](Lanes::scale_by_pow2).
    fn half_scale_by_pow2(self, t: Self) -> Self;
    /// `self 2^n` rounded once, for the `t` of `exp_parts` with `n` in `[-126, 127]`.
    fn scale_by_normal_pow2(self, t: Self) -> Self;
    /// `self 2^n` rounded once, for the `e` and `t` of `exp_parts` with `n` in `[-217, 129]`.
    fn scale_e_by_pow2(self, t: Self) -> Self;
    /// `self` with the sign of `sign`.
    fn copysign(self, sign: Self) -> Self;
    /// `(m, e)` with `self = m 2^e` and `m` in `[0.5, 1)`, `e` an integer, for a positive
    /// finite `self` (subnormals included); unspecified (but no fault) for other lanes.
    fn frexp(self) -> (Self, Self);
    /// `self` (`ln(x)` as computed for a positive finite `x`) where `x` is not 0, infinite or
    /// NaN; `-inf` where `x` is ±0, and `x` itself where it is `+inf` or NaN (its bits kept).
    /// Lanes where `x` is negative or `-inf` keep `self`.
    fn ln_edges(self, x: Self) -> Self;
    /// Whether every lane is a positive normal number (not ±0, subnormal, negative, infinite or
    /// NaN), for the functions' paths without the edges, where knowing it costs less than
    /// handling them. `false` by default: always taking the path with the edges, whose results
    /// are the same in those lanes, as the `f32` form does, so that the loops calling it keep no
    /// branch.
    #[inline(always)]
    fn all_positive_normal(self) -> bool {
        false
    }
    /// [`frexp`](Lanes::frexp), for lanes that are positive normal numbers (unspecified for
    /// others): the exponent and the significand from the bits, with no step for subnormals.
    #[inline(always)]
    fn frexp_normal(self) -> (Self, Self) {
        self.frexp()
    }
}

impl Lanes for f32 {
    type Mask = bool;

    #[inline(always)]
    fn splat(v: f32) -> Self {
        v
    }

    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f32::mul_add(self, a, b)
    }

    #[inline(always)]
    fn abs(self) -> Self {
        f32::abs(self)
    }

    #[inline(always)]
    fn lt(self, o: Self) -> bool {
        self < o
    }

    #[inline(always)]
    fn select(m: bool, a: Self, b: Self) -> Self {
        if m { a } else { b }
    }

    #[inline(always)]
    fn masked(m: bool, a: Self) -> Self {
        if m { a } else { 0.0 }
    }

    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        f32::clamp(self, lo, hi)
    }

    #[inline(always)]
    fn min(self, hi: f32) -> Self {
        if self < hi { self } else { hi }
    }

    #[inline(always)]
    fn max(self, lo: f32) -> Self {
        if self > lo { self } else { lo }
    }

    #[inline(always)]
    fn scale_by_pow2(self, t: Self) -> Self {
        // `self 2^(n + 100)` is exact (a normal power of two, and no overflow),
        // and the product by 2^-100 rounds once.
        self * super::pow2_plus::<100>(t) * super::TWO_M100
    }

    #[inline(always)]
    fn half_scale_by_pow2(self, t: Self) -> Self {
        // As `scale_by_pow2`, with 2^(n + 99) (normal for `n` down to -225).
        self * super::pow2_plus::<99>(t) * super::TWO_M100
    }

    #[inline(always)]
    fn scale_by_normal_pow2(self, t: Self) -> Self {
        self * super::pow2_plus::<0>(t)
    }

    #[inline(always)]
    fn scale_e_by_pow2(self, t: Self) -> Self {
        // The first product is exact (a normal number), the second rounds once.
        let (p1, p2) = super::pow2_halves(t);
        self * p1 * p2
    }

    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        f32::copysign(self, sign)
    }

    /// From the bits: a subnormal is scaled by 2^23 (exact) first.
    #[inline(always)]
    fn frexp(self) -> (Self, Self) {
        let sub = self < f32::MIN_POSITIVE;
        let y = if sub { self * 8_388_608.0 } else { self };
        let bits = y.to_bits();
        let e = ((bits >> 23) & 0xff) as i32 - if sub { 126 + 23 } else { 126 };
        (f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000), e as f32)
    }

    #[inline(always)]
    fn ln_edges(self, x: Self) -> Self {
        if x == 0.0 {
            f32::NEG_INFINITY
        } else if x.is_nan() || x == f32::INFINITY {
            x
        } else {
            self
        }
    }
}
