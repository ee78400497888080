//! Element-wise kernels: binary arithmetic, comparisons, unary functions, and their in-place
//! forms.
//!
//! # Type promotion
//! Binary operations compute in [`DType::result_type`] of their operands (PyTorch's rules),
//! converting an operand of another dtype first. `div` of integers or bools gives `f32` (true
//! division, as `torch.div`); `exp`, `log`, `sqrt`, `gelu`, `sigmoid` and `tanh` of integers
//! give `f32`. On bool tensors `add`/`maximum` are logical or, `mul`/`minimum` logical and;
//! `sub`, `pow` and `neg` are refused. Integer arithmetic wraps. In-place forms compute in the
//! destination's dtype and refuse a result dtype that cannot be cast to it (a float result
//! into an integer tensor, a number into a bool tensor).

use crate::tensor::dtype::{match_dtype, match_float, match_numeric};
use crate::tensor::num::{Float, Num};
use crate::tensor::shape::broadcast_shapes;
use crate::tensor::{DType, Result, Tensor, TensorError};

use super::cast::cast_into;
use super::loops::{check_inplace, run_binary, run_unary};

/// The binary arithmetic operations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
}

impl Binary {
    fn name(self, inplace: bool) -> &'static str {
        match (self, inplace) {
            (Binary::Add, false) => "add",
            (Binary::Add, true) => "add_",
            (Binary::Sub, false) => "sub",
            (Binary::Sub, true) => "sub_",
            (Binary::Mul, false) => "mul",
            (Binary::Mul, true) => "mul_",
            (Binary::Div, false) => "div",
            (Binary::Div, true) => "div_",
            (Binary::Maximum, _) => "maximum",
            (Binary::Minimum, _) => "minimum",
            (Binary::Pow, false) => "pow",
            (Binary::Pow, true) => "pow_",
        }
    }
}

/// Comparisons, giving bool tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Unary functions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Unary {
    Neg,
    Abs,
    Relu,
    Exp,
    Log,
    Sqrt,
    Gelu,
    Sigmoid,
    Tanh,
}

impl Unary {
    fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Abs => "abs",
            Unary::Relu => "relu",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Gelu => "gelu",
            Unary::Sigmoid => "sigmoid",
            Unary::Tanh => "tanh",
        }
    }

    fn is_float_only(self) -> bool {
        !matches!(self, Unary::Neg | Unary::Abs | Unary::Relu)
    }
}

/// PyTorch's `canCast`: no float into an integer, no non-bool into bool.
fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_floating_point() && !to.is_floating_point() || from != DType::Bool && to == DType::Bool)
}

fn unsupported(op: &'static str, t: &Tensor, hint: &'static str) -> TensorError {
    TensorError::UnsupportedDType { op, dtype: t.dtype(), shape: t.sizes().to_vec(), hint }
}

/// `t` converted to `dtype` (shared when it already is).
fn as_dtype(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype { Ok(t.clone()) } else { t.to_dtype(dtype) }
}

fn result_type(op: &'static str, a: &Tensor, b: &Tensor) -> Result<DType> {
    DType::result_type(a.dtype(), a.dim() == 0, b.dtype(), b.dim() == 0).ok_or(TensorError::NoCommonDType {
        op,
        lhs: a.dtype(),
        rhs: b.dtype(),
    })
}

/// Runs `kind` into `out` (dtype `ct`) from `a` and `b` (both converted to `ct`).
fn launch_binary(
    op: &'static str,
    kind: Binary,
    alpha: f64,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    fresh: bool,
) -> Result<()> {
    let ct = out.dtype();
    if ct == DType::Bool {
        return match kind {
            Binary::Add | Binary::Maximum => run_binary(op, out, a, b, fresh, |x: bool, y: bool| x | y),
            Binary::Mul | Binary::Minimum => run_binary(op, out, a, b, fresh, |x: bool, y: bool| x & y),
            _ => Err(unsupported(op, a, "use logical operations (ne, eq) on bool tensors")),
        };
    }
    if kind == Binary::Div {
        return match_float!(ct, T => run_binary(op, out, a, b, fresh, |x: T, y: T| Float::div(x, y)),
            _ => Err(unsupported(op, out, "")));
    }
    if ct.is_integer() && alpha.fract() != 0.0 {
        return Err(unsupported(op, a, "alpha must be an integer for integer tensors"));
    }
    match_numeric!(ct, T => {
        let al: T = <T as crate::tensor::Element>::from_f64(alpha);
        match kind {
            Binary::Add if alpha == 1.0 => run_binary(op, out, a, b, fresh, |x: T, y: T| Num::add(x, y)),
            Binary::Add => run_binary(op, out, a, b, fresh, move |x: T, y: T| Num::add(x, Num::mul(y, al))),
            Binary::Sub if alpha == 1.0 => run_binary(op, out, a, b, fresh, |x: T, y: T| Num::sub(x, y)),
            Binary::Sub => run_binary(op, out, a, b, fresh, move |x: T, y: T| Num::sub(x, Num::mul(y, al))),
            Binary::Mul => run_binary(op, out, a, b, fresh, |x: T, y: T| Num::mul(x, y)),
            Binary::Maximum => run_binary(op, out, a, b, fresh, |x: T, y: T| Num::maximum(x, y)),
            Binary::Minimum => run_binary(op, out, a, b, fresh, |x: T, y: T| Num::minimum(x, y)),
            Binary::Pow => run_binary(op, out, a, b, fresh, |x: T, y: T| Num::pow(x, y)),
            Binary::Div => Err(unsupported(op, out, "")),
        }
    }, _ => Err(unsupported(op, out, "")))
}

fn launch_unary(op: &'static str, kind: Unary, out: &Tensor, a: &Tensor, fresh: bool) -> Result<()> {
    let dt = out.dtype();
    if kind.is_float_only() {
        return match_float!(dt, T => match kind {
            Unary::Exp => run_unary(op, out, a, fresh, |x: T| Float::exp(x)),
            Unary::Log => run_unary(op, out, a, fresh, |x: T| Float::ln(x)),
            Unary::Sqrt => run_unary(op, out, a, fresh, |x: T| Float::sqrt(x)),
            Unary::Gelu => run_unary(op, out, a, fresh, |x: T| Float::gelu(x)),
            Unary::Sigmoid => run_unary(op, out, a, fresh, |x: T| Float::sigmoid(x)),
            _ => run_unary(op, out, a, fresh, |x: T| Float::tanh(x)),
        }, _ => Err(unsupported(op, a, "")));
    }
    if dt == DType::Bool {
        return match kind {
            Unary::Abs | Unary::Relu => run_unary(op, out, a, fresh, |x: bool| x),
            _ => Err(unsupported(op, a, "use logical operations on bool tensors")),
        };
    }
    match_numeric!(dt, T => match kind {
        Unary::Neg => run_unary(op, out, a, fresh, |x: T| Num::neg(x)),
        Unary::Abs => run_unary(op, out, a, fresh, |x: T| Num::abs(x)),
        _ => run_unary(op, out, a, fresh, |x: T| if x > T::ZERO || Num::is_nan(x) { x } else { T::ZERO }),
    }, _ => Err(unsupported(op, a, "")))
}

#[allow(clippy::bool_comparison)] // `x < y` is generic; for bool it is the order false < true
impl Tensor {
    fn binary(&self, kind: Binary, other: &Tensor, alpha: f64) -> Result<Tensor> {
        let op = kind.name(false);
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        let mut ct = result_type(op, self, other)?;
        if kind == Binary::Div && !ct.is_floating_point() {
            ct = DType::F32;
        }
        if ct == DType::Bool && matches!(kind, Binary::Sub | Binary::Pow) {
            return Err(unsupported(op, self, "use logical operations (ne, eq) on bool tensors"));
        }
        let (a, b) = (as_dtype(self, ct)?, as_dtype(other, ct)?);
        // SAFETY: `launch_binary` writes every element of `out` before it is returned.
        let out = unsafe { Tensor::output(op, &shape, ct, self) }?;
        launch_binary(op, kind, alpha, &out, &a, &b, true)?;
        Ok(out)
    }

    fn binary_(&self, kind: Binary, other: &Tensor, alpha: f64) -> Result<&Tensor> {
        let op = kind.name(true);
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        if shape != self.sizes() {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: other.sizes().to_vec(),
                reason: "an in-place operand must broadcast to the destination's shape",
            });
        }
        let mut rt = result_type(op, self, other)?;
        if kind == Binary::Div && !rt.is_floating_point() {
            rt = DType::F32;
        }
        if !can_cast(rt, self.dtype()) {
            return Err(unsupported(op, self, "the result's dtype cannot be cast to the destination's"));
        }
        check_inplace(op, self, &[other])?;
        let b = as_dtype(other, self.dtype())?;
        launch_binary(op, kind, alpha, self, self, &b, false)?;
        Ok(self)
    }

    fn compare(&self, kind: Compare, other: &Tensor) -> Result<Tensor> {
        let op = match kind {
            Compare::Eq => "eq",
            Compare::Ne => "ne",
            Compare::Lt => "lt",
            Compare::Le => "le",
            Compare::Gt => "gt",
            Compare::Ge => "ge",
        };
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        let ct = result_type(op, self, other)?;
        let (a, b) = (as_dtype(self, ct)?, as_dtype(other, ct)?);
        // SAFETY: `run_binary` writes every element of `out`.
        let out = unsafe { Tensor::output(op, &shape, DType::Bool, self) }?;
        match_dtype!(ct, T => match kind {
            Compare::Eq => run_binary(op, &out, &a, &b, true, |x: T, y: T| x == y),
            Compare::Ne => run_binary(op, &out, &a, &b, true, |x: T, y: T| x != y),
            Compare::Lt => run_binary(op, &out, &a, &b, true, |x: T, y: T| x < y),
            Compare::Le => run_binary(op, &out, &a, &b, true, |x: T, y: T| x <= y),
            Compare::Gt => run_binary(op, &out, &a, &b, true, |x: T, y: T| x > y),
            Compare::Ge => run_binary(op, &out, &a, &b, true, |x: T, y: T| x >= y),
        }, _ => Err(unsupported(op, self, "")))?;
        Ok(out)
    }

    fn unary(&self, kind: Unary) -> Result<Tensor> {
        let op = kind.name();
        let dt = if kind.is_float_only() && !self.dtype().is_floating_point() { DType::F32 } else { self.dtype() };
        if self.dtype().is_quantized() {
            return Err(unsupported(op, self, "dequantize with to_dtype(DType::F32) first"));
        }
        let a = as_dtype(self, dt)?;
        // SAFETY: `launch_unary` writes every element of `out`.
        let out = unsafe { Tensor::output(op, self.sizes(), dt, self) }?;
        launch_unary(op, kind, &out, &a, true)?;
        Ok(out)
    }

    fn unary_(&self, kind: Unary) -> Result<&Tensor> {
        let op = kind.name();
        if kind.is_float_only() && !self.dtype().is_floating_point() {
            return Err(unsupported(op, self, "the result is floating point; use the out-of-place form"));
        }
        check_inplace(op, self, &[])?;
        launch_unary(op, kind, self, self, false)?;
        Ok(self)
    }

    /// Copies `src` (broadcast to this tensor's shape, converted to its dtype) into this tensor.
    ///
    /// # Errors
    /// [`TensorError::Broadcast`]/[`TensorError::BadShape`] when `src` does not broadcast to
    /// this shape; [`TensorError::PartialOverlap`], [`TensorError::InternalOverlap`],
    /// [`TensorError::ReadOnly`].
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        let op = "copy_";
        check_inplace(op, self, &[src])?;
        cast_into(op, self, src, false)?;
        Ok(self)
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $name_:ident => $kind:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// [`TensorError::Broadcast`] when the shapes do not broadcast;
                /// [`TensorError::UnsupportedDType`]/[`TensorError::NoCommonDType`] for dtypes
                /// the operation does not take (see the module docs on promotion).
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(Binary::$kind, other, 1.0)
                }

                #[doc = concat!("In-place [`", stringify!($name), "`](Self::", stringify!($name), "): writes the result into `self` (and every view of its storage).")]
                ///
                /// # Errors
                /// As the out-of-place form; [`TensorError::BadShape`] when `other` does not
                /// broadcast to `self`'s shape; [`TensorError::PartialOverlap`] when `other`
                /// shares some but not all of `self`'s memory; [`TensorError::InternalOverlap`];
                /// [`TensorError::ReadOnly`].
                pub fn $name_(&self, other: &Tensor) -> Result<&Tensor> {
                    self.binary_(Binary::$kind, other, 1.0)
                }
            )*
        }
    };
}

binary_methods! {
    /// `self + other`, broadcast.
    add, add_ => Add;
    /// `self - other`, broadcast.
    sub, sub_ => Sub;
    /// `self * other`, broadcast.
    mul, mul_ => Mul;
    /// `self / other`, broadcast (true division: integers give f32).
    div, div_ => Div;
    /// Element-wise maximum (NaN if either is NaN).
    maximum, maximum_ => Maximum;
    /// Element-wise minimum (NaN if either is NaN).
    minimum, minimum_ => Minimum;
    /// `self` to the power `other`.
    pow, pow_ => Pow;
}

impl Tensor {
    /// `self + alpha * other` (PyTorch's `add(other, alpha=)`).
    ///
    /// # Errors
    /// As [`add`](Self::add); [`TensorError::UnsupportedDType`] for a fractional `alpha` with
    /// integer tensors.
    pub fn add_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        self.binary(Binary::Add, other, alpha)
    }

    /// In-place [`add_scaled`](Self::add_scaled).
    ///
    /// # Errors
    /// As [`add_`](Self::add_).
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<&Tensor> {
        self.binary_(Binary::Add, other, alpha)
    }

    /// `self - alpha * other`.
    ///
    /// # Errors
    /// As [`add_scaled`](Self::add_scaled).
    pub fn sub_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        self.binary(Binary::Sub, other, alpha)
    }
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident => $kind:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// [`TensorError::Broadcast`]; [`TensorError::NoCommonDType`] with a quantised
                /// operand.
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.compare(Compare::$kind, other)
                }
            )*
        }
    };
}

compare_methods! {
    /// `self == other` element-wise, as a bool tensor.
    eq => Eq;
    /// `self != other` element-wise, as a bool tensor.
    ne => Ne;
    /// `self < other` element-wise, as a bool tensor.
    lt => Lt;
    /// `self <= other` element-wise, as a bool tensor.
    le => Le;
    /// `self > other` element-wise, as a bool tensor.
    gt => Gt;
    /// `self >= other` element-wise, as a bool tensor.
    ge => Ge;
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident, $name_:ident => $kind:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// [`TensorError::UnsupportedDType`] for dtypes the function does not take.
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary(Unary::$kind)
                }

                #[doc = concat!("In-place [`", stringify!($name), "`](Self::", stringify!($name), ").")]
                ///
                /// # Errors
                /// As the out-of-place form (and integer tensors for the floating-point
                /// functions); [`TensorError::InternalOverlap`]; [`TensorError::ReadOnly`].
                pub fn $name_(&self) -> Result<&Tensor> {
                    self.unary_(Unary::$kind)
                }
            )*
        }
    };
}

unary_methods! {
    /// `-self` (wrapping for integers; refused for bool).
    neg, neg_ => Neg;
    /// `|self|`.
    abs, abs_ => Abs;
    /// `max(self, 0)` (NaN stays NaN).
    relu, relu_ => Relu;
    /// `e^self`.
    exp, exp_ => Exp;
    /// Natural logarithm.
    log, log_ => Log;
    /// Square root.
    sqrt, sqrt_ => Sqrt;
    /// GELU with the exact error function (PyTorch's default `approximate='none'`).
    gelu, gelu_ => Gelu;
    /// `1 / (1 + e^-self)`.
    sigmoid, sigmoid_ => Sigmoid;
    /// Hyperbolic tangent.
    tanh, tanh_ => Tanh;
}
