//! Arithmetic on element types, as the kernels need it: integers wrap like PyTorch's,
//! floats follow IEEE (maximum/minimum propagate NaN), f16/bf16 compute in f32.

use half::{bf16, f16};

use super::Element;
use super::halfconv::HalfFloat;

/// Arithmetic shared by every numeric element type.
pub(crate) trait Num: Element {
    const ZERO: Self;
    const ONE: Self;
    /// The smallest value (`-inf` for floats): the identity of `maximum`.
    const LOWEST: Self;
    /// The largest value (`+inf` for floats): the identity of `minimum`.
    const HIGHEST: Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn pow(self, o: Self) -> Self;
    /// The larger value; NaN if either is NaN.
    fn maximum(self, o: Self) -> Self;
    /// The smaller value; NaN if either is NaN.
    fn minimum(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
}

/// Transcendental functions of the floating-point types.
pub(crate) trait Float: Num {
    fn div(self, o: Self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn sigmoid(self) -> Self;
    /// The exact GELU, `x * Φ(x)` with the error function (PyTorch's default).
    fn gelu(self) -> Self;
}

/// Integer power by squaring, wrapping; negative exponents give 0 unless the base is ±1
/// (what PyTorch's CPU kernel computes).
#[inline]
fn int_pow(base: i64, exp: i64, wrap: impl Fn(i64) -> i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut result, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            result = wrap(result.wrapping_mul(b));
        }
        b = wrap(b.wrapping_mul(b));
        e >>= 1;
    }
    result
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline] fn pow(self, o: Self) -> Self {
                int_pow(self as i64, o as i64, |v| v as $t as i64) as $t
            }
            #[inline(always)] fn maximum(self, o: Self) -> Self { if self >= o { self } else { o } }
            #[inline(always)] fn minimum(self, o: Self) -> Self { if self <= o { self } else { o } }
            #[inline(always)] fn neg(self) -> Self { (0 as $t).wrapping_sub(self) }
            #[inline(always)] fn abs(self) -> Self { if self < (0 as $t) { self.neg() } else { self } }
            #[inline(always)] fn is_nan(self) -> bool { false }
        }
    )*};
}
int_num!(u8, i8, i16, i32, i64);

macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn sub(self, o: Self) -> Self { self - o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline] fn pow(self, o: Self) -> Self { self.powf(o) }
            #[inline(always)] fn maximum(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() { <$t>::NAN } else if self >= o { self } else { o }
            }
            #[inline(always)] fn minimum(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() { <$t>::NAN } else if self <= o { self } else { o }
            }
            #[inline(always)] fn neg(self) -> Self { -self }
            #[inline(always)] fn abs(self) -> Self { <$t>::abs(self) }
            #[inline(always)] fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}
float_num!(f32, f64);

macro_rules! float_fns {
    ($($t:ident => $erf:path),*) => {$(
        impl Float for $t {
            #[inline(always)] fn div(self, o: Self) -> Self { self / o }
            #[inline] fn exp(self) -> Self { $t::exp(self) }
            #[inline] fn ln(self) -> Self { $t::ln(self) }
            #[inline] fn sqrt(self) -> Self { $t::sqrt(self) }
            #[inline] fn tanh(self) -> Self { $t::tanh(self) }
            #[inline] fn sigmoid(self) -> Self { 1.0 / (1.0 + $t::exp(-self)) }
            #[inline] fn gelu(self) -> Self {
                0.5 * self * (1.0 + $erf(self * core::$t::consts::FRAC_1_SQRT_2))
            }
        }
    )*};
}
float_fns!(f32 => libm::erff, f64 => libm::erf);

// The arithmetic converts with `HalfFloat` (inlined, so the loops vectorise); the functions that
// call out to `powf`, `exp`, `tanh`, `erf` run one element at a time anyway, and there `half`'s
// own conversions (one F16C instruction where the CPU has it) are faster. Both round alike.
macro_rules! half_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = <$t>::ZERO;
            const ONE: Self = <$t>::ONE;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)] fn add(self, o: Self) -> Self { <$t as HalfFloat>::narrow(self.widen() + o.widen()) }
            #[inline(always)] fn sub(self, o: Self) -> Self { <$t as HalfFloat>::narrow(self.widen() - o.widen()) }
            #[inline(always)] fn mul(self, o: Self) -> Self { <$t as HalfFloat>::narrow(self.widen() * o.widen()) }
            #[inline] fn pow(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().powf(o.to_f32())) }
            #[inline(always)] fn maximum(self, o: Self) -> Self {
                <$t as HalfFloat>::narrow(Num::maximum(self.widen(), o.widen()))
            }
            #[inline(always)] fn minimum(self, o: Self) -> Self {
                <$t as HalfFloat>::narrow(Num::minimum(self.widen(), o.widen()))
            }
            #[inline(always)] fn neg(self) -> Self { -self }
            #[inline(always)] fn abs(self) -> Self { <$t as HalfFloat>::narrow(self.widen().abs()) }
            #[inline(always)] fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
        impl Float for $t {
            #[inline(always)] fn div(self, o: Self) -> Self { <$t as HalfFloat>::narrow(self.widen() / o.widen()) }
            #[inline] fn exp(self) -> Self { <$t>::from_f32(self.to_f32().exp()) }
            #[inline] fn ln(self) -> Self { <$t>::from_f32(self.to_f32().ln()) }
            #[inline] fn sqrt(self) -> Self { <$t as HalfFloat>::narrow(self.widen().sqrt()) }
            #[inline] fn tanh(self) -> Self { <$t>::from_f32(self.to_f32().tanh()) }
            #[inline] fn sigmoid(self) -> Self { <$t>::from_f32(Float::sigmoid(self.to_f32())) }
            #[inline] fn gelu(self) -> Self { <$t>::from_f32(Float::gelu(self.to_f32())) }
        }
    )*};
}
half_num!(f16, bf16);
