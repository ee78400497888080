//! Arithmetic on element types, as the kernels need it: integers wrap like PyTorch's,
//! floats follow IEEE (maximum/minimum propagate NaN), f16/bf16 compute in f32.

use half::{bf16, f16};

use super::Element;
use super::halfconv::HalfFloat;
use super::vmath;

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
    /// GELU's tanh approximation (PyTorch's `approximate='tanh'`).
    fn gelu_tanh(self) -> Self;
    /// `x * sigmoid(x)`.
    fn silu(self) -> Self;
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

impl Float for f32 {
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        self / o
    }
    // Every function but `sqrt` (one instruction) is branch-free code the loops vectorise
    // (see `vmath`).
    #[inline(always)]
    fn exp(self) -> Self {
        vmath::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        vmath::ln(self)
    }
    #[inline]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        vmath::tanh(self)
    }
    #[inline(always)]
    fn sigmoid(self) -> Self {
        vmath::sigmoid(self)
    }
    #[inline(always)]
    fn gelu(self) -> Self {
        vmath::gelu(self)
    }
    #[inline(always)]
    fn gelu_tanh(self) -> Self {
        vmath::gelu_tanh(self)
    }
    #[inline(always)]
    fn silu(self) -> Self {
        vmath::silu(self)
    }
}

impl Float for f64 {
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        self / o
    }
    #[inline]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline]
    fn ln(self) -> Self {
        f64::ln(self)
    }
    #[inline]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline]
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    #[inline]
    fn sigmoid(self) -> Self {
        1.0 / (1.0 + f64::exp(-self))
    }
    #[inline]
    fn gelu(self) -> Self {
        0.5 * self * (1.0 + libm::erf(self * core::f64::consts::FRAC_1_SQRT_2))
    }
    #[inline]
    fn gelu_tanh(self) -> Self {
        // x (1 + tanh(u)) / 2 = x / (1 + e^(-2u)), u = √(2/π) (x + 0.044715 x³), as in f32.
        let two_u = 2.0 * (2.0 / core::f64::consts::PI).sqrt() * (self + 0.044_715 * self * self * self);
        self / (1.0 + f64::exp(-two_u))
    }
    #[inline]
    fn silu(self) -> Self {
        self / (1.0 + f64::exp(-self))
    }
}

// The arithmetic and the `vmath` functions convert with `HalfFloat` (inlined, so the loops
// vectorise); `powf` runs one element at a time anyway, and there `half`'s own conversions (one
// F16C instruction where the CPU has it) are faster. Both round alike.
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
            #[inline(always)] fn exp(self) -> Self { <$t as HalfFloat>::narrow(vmath::exp(self.widen())) }
            #[inline(always)] fn ln(self) -> Self { <$t as HalfFloat>::narrow(vmath::ln(self.widen())) }
            #[inline] fn sqrt(self) -> Self { <$t as HalfFloat>::narrow(self.widen().sqrt()) }
            #[inline(always)] fn tanh(self) -> Self { <$t as HalfFloat>::narrow(vmath::tanh(self.widen())) }
            #[inline(always)] fn sigmoid(self) -> Self { <$t as HalfFloat>::narrow(vmath::sigmoid(self.widen())) }
            #[inline(always)] fn gelu(self) -> Self { <$t as HalfFloat>::narrow(vmath::gelu(self.widen())) }
            #[inline(always)] fn gelu_tanh(self) -> Self { <$t as HalfFloat>::narrow(vmath::gelu_tanh(self.widen())) }
            #[inline(always)] fn silu(self) -> Self { <$t as HalfFloat>::narrow(vmath::silu(self.widen())) }
        }
    )*};
}
half_num!(f16, bf16);

/// The type a kernel computes `Self` in (PyTorch's `opmath_type`): `f32` for f16, bf16 and f32,
/// `f64` for f64; and the conversions to it and back (rounding once).
pub(crate) trait Opmath: Element {
    type C: Float;
    /// A 16-bit float (f16, bf16): sums of a row of its values in `f32` lanes are close to
    /// exact, as its values have 8 or 11 significant bits (the norms' statistics).
    const NARROW: bool = false;
    fn to_op(self) -> Self::C;
    fn from_op(c: Self::C) -> Self;
    /// Whether [`from_op_not_nan`](Self::from_op_not_nan) is cheaper than `from_op` (bf16).
    const NAN_SELECT: bool = false;
    /// [`from_op`](Self::from_op) of a `c` that is not NaN (of NaN, some value): for a loop
    /// that notes whether it met a NaN (the maximum of [`nan_rank`](Self::nan_rank)) and then
    /// redoes its work with `from_op`.
    #[inline(always)]
    fn from_op_not_nan(c: Self::C) -> Self {
        Self::from_op(c)
    }
    /// Above [`NAN_RANK`] exactly where `c` is NaN (where [`NAN_SELECT`](Self::NAN_SELECT)).
    /// A loop takes the maximum: an integer maximum vectorises in whole registers, where a
    /// flag took a compare, its mask packed to 16 bits (two operations) and an OR.
    #[inline(always)]
    fn nan_rank(_c: Self::C) -> u32 {
        0
    }
}

/// See [`Opmath::nan_rank`]: the bits of f32 infinity.
pub(crate) const NAN_RANK: u32 = 0x7f80_0000;

impl Opmath for f32 {
    type C = f32;
    #[inline(always)]
    fn to_op(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_op(c: f32) -> f32 {
        c
    }
}

impl Opmath for f64 {
    type C = f64;
    #[inline(always)]
    fn to_op(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_op(c: f64) -> f64 {
        c
    }
}

macro_rules! half_opmath {
    ($($t:ty),*) => {$(
        impl Opmath for $t {
            type C = f32;
            const NARROW: bool = true;
            #[inline(always)]
            fn to_op(self) -> f32 {
                HalfFloat::widen(self)
            }
            #[inline(always)]
            fn from_op(c: f32) -> $t {
                <$t as HalfFloat>::narrow(c)
            }
            const NAN_SELECT: bool = <$t as HalfFloat>::NAN_SELECT;
            #[inline(always)]
            fn from_op_not_nan(c: f32) -> $t {
                <$t as HalfFloat>::narrow_not_nan(c)
            }
            #[inline(always)]
            fn nan_rank(c: f32) -> u32 {
                c.to_bits() & 0x7fff_ffff
            }
        }
    )*};
}
half_opmath!(f16, bf16);
