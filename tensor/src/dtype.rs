//! [`DType`], the Rust types that back it ([`Element`]), and PyTorch's type promotion.

use core::fmt;

use half::{bf16, f16};

use super::halfconv::HalfFloat;

/// The element type of a tensor.
///
/// Ten plain types backed by Rust types (see [`Element`]) and two block-quantised types in
/// the ggml/InferLLM layout: [`Q8_0`](DType::Q8_0) and [`Q4_0`](DType::Q4_0) store blocks of
/// [`QUANT_BLOCK`] values with one `f16` scale per block (see [`quantize`](super::quantize)).
///
/// ```
/// use tensormem_tensor::DType;
///
/// assert_eq!(DType::F32.size_of(10), Some(40));
/// assert_eq!(DType::Q8_0.size_of(64), Some(2 * 34));
/// assert_eq!(DType::Q4_0.size_of(33), None); // not whole blocks
/// assert_eq!(DType::promote(DType::U8, DType::I8), Some(DType::I16));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `bool`, one byte, 0 or 1.
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Blocks of 32 `i8` values with an `f16` scale: 34 bytes per 32 values.
    Q8_0,
    /// Blocks of 32 4-bit values (stored offset by 8) with an `f16` scale: 18 bytes per 32 values.
    Q4_0,
}

/// Values per block of the quantised dtypes.
pub const QUANT_BLOCK: usize = 32;

/// The three categories PyTorch's promotion ranks: bool < integer < floating point.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::Q8_0,
        DType::Q4_0,
    ];

    /// The short name (`f32`, `bf16`, `q8_0`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
        }
    }

    /// Floating point (f16, bf16, f32, f64).
    pub fn is_floating_point(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Integer (u8, i8, i16, i32, i64); `bool` is not.
    pub fn is_integer(self) -> bool {
        matches!(self, DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// Block-quantised (Q8_0, Q4_0).
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_0)
    }

    /// Bytes per element of a plain dtype; `None` for the quantised ones.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
            DType::Q8_0 | DType::Q4_0 => return None,
        })
    }

    /// Values per storage unit: [`QUANT_BLOCK`] for the quantised dtypes, 1 otherwise.
    pub fn block_len(self) -> usize {
        if self.is_quantized() { QUANT_BLOCK } else { 1 }
    }

    /// Bytes per storage unit (one element, or one quantised block).
    pub fn block_bytes(self) -> usize {
        match self {
            DType::Q8_0 => 2 + QUANT_BLOCK,
            DType::Q4_0 => 2 + QUANT_BLOCK / 2,
            other => other.element_size().unwrap_or(1),
        }
    }

    /// Bytes that `n` values take. `None` when `n` is not a whole number of blocks of a
    /// quantised dtype, or when the size overflows `usize`.
    pub fn size_of(self, n: usize) -> Option<usize> {
        let block = self.block_len();
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(self.block_bytes())
    }

    fn category(self) -> Option<Category> {
        if self == DType::Bool {
            Some(Category::Bool)
        } else if self.is_integer() {
            Some(Category::Int)
        } else if self.is_floating_point() {
            Some(Category::Float)
        } else {
            None
        }
    }

    /// PyTorch's `promote_types`: the smallest dtype both `a` and `b` convert to without
    /// losing range. bool < every other type; mixed signed/unsigned 8-bit gives i16; an
    /// integer with a float gives the float; f16 with bf16 gives f32. `None` for quantised
    /// dtypes, which do not take part in arithmetic.
    pub fn promote(a: DType, b: DType) -> Option<DType> {
        use DType::*;
        let (ca, cb) = (a.category()?, b.category()?);
        if a == b {
            return Some(a);
        }
        Some(match (ca, cb) {
            (Category::Bool, _) => b,
            (_, Category::Bool) => a,
            (Category::Int, Category::Float) => b,
            (Category::Float, Category::Int) => a,
            (Category::Float, Category::Float) => {
                if matches!((a, b), (F16, BF16) | (BF16, F16)) {
                    F32
                } else {
                    a.max(b)
                }
            }
            (Category::Int, Category::Int) => {
                if matches!((a, b), (U8, I8) | (I8, U8)) {
                    I16
                } else {
                    a.max(b)
                }
            }
        })
    }

    /// PyTorch's `result_type` for two tensor operands: a zero-dimensional operand only
    /// decides the dtype when its category (bool < integer < float) is higher than the
    /// dimensioned operand's. So `i32 tensor + 0-d f64` is f64, but `f16 tensor + 0-d f64`
    /// stays f16 and `i8 tensor + 0-d i64` stays i8.
    pub fn result_type(a: DType, a_zero_dim: bool, b: DType, b_zero_dim: bool) -> Option<DType> {
        if a_zero_dim == b_zero_dim {
            return DType::promote(a, b);
        }
        let (dim, zero) = if a_zero_dim { (b, a) } else { (a, b) };
        // PyTorch's combine_categories(higher = dimensioned, lower = zero-dim).
        let (cd, cz) = (dim.category()?, zero.category()?);
        if cd == Category::Float {
            return Some(dim);
        }
        if cd == Category::Bool || cz == Category::Float {
            return DType::promote(dim, zero);
        }
        Some(dim)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element type of a plain [`DType`]: `bool`, `u8`, `i8`, `i16`,
/// `i32`, `i64`, `half::f16`, `half::bf16`, `f32`, `f64`. Sealed.
pub trait Element: Copy + Send + Sync + PartialOrd + fmt::Debug + Default + 'static + sealed::Sealed {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// The value as `f64` (booleans are 0 and 1).
    fn to_f64(self) -> f64;
    /// From `f64`, truncating toward zero. `u8`, `i8` and `i16` take the value through `i32`
    /// and wrap, as PyTorch's conversions do on x86: `-1.0` is 255 as `u8`, `300.0` is 44,
    /// and a value outside `i32` (or NaN) is 0. `i32` and `i64` saturate, as Rust's `as` does
    /// (PyTorch leaves those undefined); NaN gives 0. Nonzero is `true`.
    fn from_f64(v: f64) -> Self;
    /// The value as `i64` (floats truncate toward zero, saturating).
    fn to_i64(self) -> i64;
    /// From `i64`, wrapping like C for narrower integers; nonzero is `true`.
    fn from_i64(v: i64) -> Self;
}

/// `v` truncated into `i32` as x86's `cvttsd2si` does: outside `i32`, or NaN, it is
/// `i32::MIN`, whose low bits are 0 (PyTorch's narrow integer conversions go this way).
#[inline(always)]
fn via_i32(v: f64) -> i32 {
    if v.abs() < 2_147_483_648.0 { v as i32 } else { i32::MIN }
}

macro_rules! prim_element {
    ($($t:ty => $d:ident, |$v:ident| $from_f64:expr);*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn from_f64($v: f64) -> Self { $from_f64 }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
prim_element!(
    u8 => U8, |v| via_i32(v) as u8; i8 => I8, |v| via_i32(v) as i8; i16 => I16, |v| via_i32(v) as i16;
    i32 => I32, |v| v as i32; i64 => I64, |v| v as i64; f32 => F32, |v| v as f32; f64 => F64, |v| v
);

macro_rules! half_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_f64(self) -> f64 { self.widen() as f64 }
            // Through f32, as PyTorch converts (its `Half` and `BFloat16` are made from a
            // `float`): `1 + 2^-11 + 2^-30` is 1.0 in f16, not 1.0009765625. This also rounds
            // every f32 value correctly, which `half`'s own `from_f64` does not (it rounds
            // values just above a tie down).
            #[inline(always)]
            fn from_f64(v: f64) -> Self { <$t as HalfFloat>::narrow(v as f32) }
            #[inline(always)]
            fn to_i64(self) -> i64 { self.widen() as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { <$t as HalfFloat>::narrow(v as f32) }
        }
    )*};
}
half_element!(f16 => F16, bf16 => BF16);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

/// Converts one value between element types as `to_dtype` does: through `f64` when either
/// side is floating point (so an i64 beyond 2^53 rounds), through `i64` otherwise.
#[inline(always)]
pub(crate) fn cast<S: Element, D: Element>(s: S) -> D {
    if S::DTYPE.is_floating_point() || D::DTYPE.is_floating_point() {
        D::from_f64(s.to_f64())
    } else {
        D::from_i64(s.to_i64())
    }
}

/// Runs `$body` with `$T` bound to the Rust type of `$dt` when `$dt` is one of the listed
/// dtypes; evaluates `$other` otherwise. The three macros below pick the lists.
macro_rules! match_types {
    ($dt:expr, $T:ident => $body:expr, _ => $other:expr; $($d:ident => $t:ty),*) => {
        match $dt {
            $($crate::DType::$d => {
                type $T = $t;
                $body
            })*
            _ => $other,
        }
    };
}

/// Runs `$body` with `$T` the Rust type of plain dtype `$dt`; evaluates `$other` for the
/// quantised dtypes.
macro_rules! match_dtype {
    ($dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::dtype::match_types!($dt, $T => $body, _ => $other;
            Bool => bool, U8 => u8, I8 => i8, I16 => i16, I32 => i32, I64 => i64,
            F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64)
    };
}

/// Like `match_dtype!` for the numeric dtypes only (no bool, no quantised).
macro_rules! match_numeric {
    ($dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::dtype::match_types!($dt, $T => $body, _ => $other;
            U8 => u8, I8 => i8, I16 => i16, I32 => i32, I64 => i64,
            F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64)
    };
}

/// Like `match_dtype!` for the integer dtypes only (no bool).
macro_rules! match_integer {
    ($dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::dtype::match_types!($dt, $T => $body, _ => $other;
            U8 => u8, I8 => i8, I16 => i16, I32 => i32, I64 => i64)
    };
}

/// Like `match_dtype!` for the floating-point dtypes only.
macro_rules! match_float {
    ($dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::dtype::match_types!($dt, $T => $body, _ => $other;
            F16 => half::f16, BF16 => half::bf16, F32 => f32, F64 => f64)
    };
}

pub(crate) use {match_dtype, match_float, match_integer, match_numeric, match_types};
