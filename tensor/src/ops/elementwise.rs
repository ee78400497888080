//! Element-wise kernels: binary arithmetic, comparisons, unary functions, their in-place (`_`)
//! and `_out` forms, and scalar operands.
//!
//! # Type promotion
//! Binary operations compute in [`DType::result_type`] of their operands (PyTorch's rules),
//! converting an operand of another dtype inside the loop (block by block, never a whole copy).
//! `div` of integers or bools gives `f32` (true division, as `torch.div`); `exp`, `log`,
//! `sqrt`, `gelu`, `gelu_tanh`, `sigmoid`, `silu` and `tanh` of integers give `f32` (PyTorch
//! refuses integers for `gelu` and `silu`). On bool tensors `add`/`maximum` are logical or,
//! `mul`/`minimum` logical and; `sub`, `pow` and `neg` are refused. Integer arithmetic wraps.
//!
//! In-place and `_out` forms compute in the same result type and convert once to the
//! destination's dtype (an `f16` tensor plus an `f32` one adds in `f32`), and refuse a result
//! dtype that cannot be cast to it (a float result into an integer tensor, a number into a
//! bool tensor), as PyTorch does. A scalar operand is a "wrapped number": a float scalar makes
//! an integer tensor's result `f32`, an integer scalar leaves an integer tensor's dtype alone.
//!
//! Half precision (`f16`, `bf16`) computes each element in `f32` and rounds once, as
//! PyTorch's CPU kernels do. Numbers and `alpha` follow PyTorch bit for bit: a float number
//! multiplies and divides in `f32`, while `add`, `sub` and `pow` round it to the tensor's dtype
//! first, and `alpha` is rounded to it before `x + alpha * y` is computed in `f32`. GELU,
//! its tanh form, the sigmoid, SiLU, `tanh`, `exp` and `log` of a bf16 or f16 tensor into its
//! own dtype read those results from a table of all 65,536 (`table`), the same bits.

use crate::dtype::{match_dtype, match_float, match_numeric};
use crate::halfconv::HalfFloat;
use crate::iter::GRAIN;
use crate::num::{Float, Num};
use crate::shape::broadcast_shapes;
use crate::strides::{Input, elementwise_output};
use crate::vmath::Func;
use crate::{DType, Element, Result, Tensor, TensorError, TensorOptions};

use super::cast::cast_into;
use super::f16c;
use super::isa::Isa;
use super::loops::{Dest, UnaryFn, run_binary, run_unary, run_unary_wide};
use super::table::TableFn;

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

/// The operators a number can take on its left (`2.0 - &x`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// Which form of an operation runs, for its name in errors.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    Fresh,
    InPlace,
    Out,
}

impl Binary {
    fn name(self, form: Form) -> &'static str {
        let names = match self {
            Binary::Add => ["add", "add_", "add_out"],
            Binary::Sub => ["sub", "sub_", "sub_out"],
            Binary::Mul => ["mul", "mul_", "mul_out"],
            Binary::Div => ["div", "div_", "div_out"],
            Binary::Maximum => ["maximum", "maximum_", "maximum_out"],
            Binary::Minimum => ["minimum", "minimum_", "minimum_out"],
            Binary::Pow => ["pow", "pow_", "pow_out"],
        };
        names[form as usize]
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

impl Compare {
    /// The name of the `out=` form (the others are named by their methods).
    fn out_name(self) -> &'static str {
        match self {
            Compare::Eq => "eq_out",
            Compare::Ne => "ne_out",
            Compare::Lt => "lt_out",
            Compare::Le => "le_out",
            Compare::Gt => "gt_out",
            Compare::Ge => "ge_out",
        }
    }
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
    GeluTanh,
    Silu,
}

impl Unary {
    fn name(self, form: Form) -> &'static str {
        let names = match self {
            Unary::Neg => ["neg", "neg_", "neg_out"],
            Unary::Abs => ["abs", "abs_", "abs_out"],
            Unary::Relu => ["relu", "relu_", "relu_out"],
            Unary::Exp => ["exp", "exp_", "exp_out"],
            Unary::Log => ["log", "log_", "log_out"],
            Unary::Sqrt => ["sqrt", "sqrt_", "sqrt_out"],
            Unary::Gelu => ["gelu", "gelu_", "gelu_out"],
            Unary::Sigmoid => ["sigmoid", "sigmoid_", "sigmoid_out"],
            Unary::Tanh => ["tanh", "tanh_", "tanh_out"],
            Unary::GeluTanh => ["gelu_tanh", "gelu_tanh_", "gelu_tanh_out"],
            Unary::Silu => ["silu", "silu_", "silu_out"],
        };
        names[form as usize]
    }

    fn is_float_only(self) -> bool {
        !matches!(self, Unary::Neg | Unary::Abs | Unary::Relu)
    }

    /// The function over groups of vectors ([`vmath::blocks`](crate::vmath::blocks))
    /// that computes unary op `k` (a `Unary` as a number), where there is one: `f32` runs of it
    /// go through it where the CPU has AVX-512 or AVX2 (see `FloatFn::call_run`).
    const fn lanes_fn(k: u8) -> Option<Func> {
        match k {
            k if k == Unary::Gelu as u8 => Some(Func::Gelu),
            k if k == Unary::Silu as u8 => Some(Func::Silu),
            k if k == Unary::Sigmoid as u8 => Some(Func::Sigmoid),
            k if k == Unary::GeluTanh as u8 => Some(Func::GeluTanh),
            k if k == Unary::Tanh as u8 => Some(Func::Tanh),
            k if k == Unary::Exp as u8 => Some(Func::Exp),
            k if k == Unary::Log as u8 => Some(Func::Ln),
            _ => None,
        }
    }
}

/// PyTorch's `canCast`: no float into an integer, no non-bool into bool.
pub(crate) fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_floating_point() && !to.is_floating_point() || from != DType::Bool && to == DType::Bool)
}

fn unsupported(op: &'static str, t: &Tensor, hint: &'static str) -> TensorError {
    TensorError::UnsupportedDType { op, dtype: t.dtype(), shape: t.sizes().to_vec(), hint }
}

fn result_type(op: &'static str, a: &Tensor, b: &Tensor) -> Result<DType> {
    DType::result_type(a.dtype(), a.dim() == 0, b.dtype(), b.dim() == 0).ok_or(TensorError::NoCommonDType {
        op,
        lhs: a.dtype(),
        rhs: b.dtype(),
    })
}

/// A number as the second operand of a binary operation: `x.mul_scalar(0.125)`, `&x * 0.125`.
///
/// Like a Python number given to a PyTorch op, it does not decide the result's dtype unless its
/// kind (bool < integer < float) is higher than the tensor's: an `f16` tensor times `0.5` is
/// `f16`, an `i32` tensor times `0.5` is `f32`, an `i32` tensor plus `3` is `i32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// `true` or `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Self {
                Scalar::$v(v as $c)
            }
        }
    )*};
}
scalar_from!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64, u8 => Int as i64);

impl From<usize> for Scalar {
    /// An integer; past `i64::MAX` (where `as i64` would turn `usize::MAX` into `-1`), the
    /// nearest float, as NumPy promotes an int64 array with a uint64 number to float.
    fn from(v: usize) -> Self {
        i64::try_from(v).map_or(Scalar::Float(v as f64), Scalar::Int)
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

impl Scalar {
    /// The dtype that stands for this kind of number in promotion: bool, i64, or the default
    /// float dtype (f32).
    fn kind_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }

    /// Whether this number can fill a tensor of `dtype` by PyTorch's rule for fills (`full`,
    /// `masked_fill`):
    /// - bool takes any number;
    /// - a floating-point dtype takes an infinity, a NaN, and a finite number no larger in
    ///   magnitude than the dtype's largest (`1e39` does not fill `f32`, `70000` does not fill
    ///   `f16`; PyTorch skips this check when the tensor has one element, and overflows to an
    ///   infinity);
    /// - an integer dtype takes a finite float `v` with `lowest <= v < max + 1` (truncated toward
    ///   zero), and an integer from `lowest` to `max`, or for `u8` from `-max` (wrapping: -1
    ///   fills with 255).
    ///
    /// Quantised dtypes take none.
    pub(crate) fn fits(self, dtype: DType) -> bool {
        let (lo, hi): (i64, i64) = match dtype {
            DType::U8 => (0, u8::MAX.into()),
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::I64 => (i64::MIN, i64::MAX),
            d if d.is_floating_point() => {
                let max = match d {
                    DType::F16 => f64::from(half::f16::MAX),
                    DType::BF16 => f64::from(half::bf16::MAX),
                    DType::F32 => f64::from(f32::MAX),
                    _ => f64::MAX,
                };
                return match self {
                    Scalar::Bool(_) => true,
                    Scalar::Int(i) => (i as f64).abs() <= max,
                    Scalar::Float(f) => !f.is_finite() || f.abs() <= max,
                };
            }
            d => return !d.is_quantized(),
        };
        match self {
            Scalar::Bool(_) => true,
            Scalar::Int(i) => (if lo == 0 { -hi } else { lo }) <= i && i <= hi,
            // `hi as f64 + 1.0` is exact: 2^8, ..., 2^63.
            Scalar::Float(f) => f >= lo as f64 && f < hi as f64 + 1.0,
        }
    }

    /// This number as a 0-d tensor of `dtype`, converted as PyTorch converts a Python number:
    /// an integer exactly, wrapping into a narrower integer dtype as C does (`-1` into `u8` is
    /// 255, so `x - (-1)` is `x + 1`); a float as [`Element::from_f64`].
    pub(crate) fn to_tensor(self, op: &'static str, dtype: DType, opts: TensorOptions) -> Result<Tensor> {
        match_dtype!(dtype, T => {
            let v = match self {
                Scalar::Bool(b) => T::from_i64(i64::from(b)),
                Scalar::Int(i) => T::from_i64(i),
                Scalar::Float(f) => T::from_f64(f),
            };
            Tensor::filled(op, &[], &opts.dtype(dtype), |_| v)
        }, _ => Err(TensorError::UnsupportedDType { op, dtype, shape: vec![], hint: "a number cannot be quantised alone" }))
    }
}

/// Runs `$body` with `$T` the Rust type of half-precision `$dt` (`f16` or `bf16`).
macro_rules! match_half {
    ($dt:expr, $T:ident => $body:expr) => {
        if $dt == DType::F16 {
            type $T = half::f16;
            $body
        } else {
            type $T = half::bf16;
            $body
        }
    };
}

/// A float number with a half-precision tensor in `mul` or `div`: PyTorch's kernels keep the
/// number in `f32` (`opmath`) instead of rounding it to the tensor's dtype, so `f16 * 3.7`
/// multiplies by 3.7, not by 3.69921875. (Its `add`, `sub` and `pow` round the number first,
/// as the general path does: PyTorch's results, compared value by value.)
/// Returns the number, when that applies.
fn half_opmath_scalar(kind: Binary, dtype: DType, s: Scalar) -> Option<f32> {
    match s {
        Scalar::Float(v) if matches!(kind, Binary::Mul | Binary::Div) && matches!(dtype, DType::F16 | DType::BF16) => {
            Some(v as f32)
        }
        _ => None,
    }
}

/// A 0-d float tensor as the second operand of `mul`/`div` with a half-precision tensor of the
/// result's dtype: PyTorch reads it as a CPU scalar, in `f32`, as it does a number
/// ([`half_opmath_scalar`]). Returns its value, when that applies.
fn half_opmath_operand(kind: Binary, ct: DType, a: &Tensor, b: &Tensor) -> Result<Option<f32>> {
    let applies = matches!(kind, Binary::Mul | Binary::Div)
        && matches!(ct, DType::F16 | DType::BF16)
        && a.dtype() == ct
        && b.dim() == 0
        && b.dtype().is_floating_point()
        && b.storage().memory_space().is_host_accessible();
    if !applies {
        return Ok(None);
    }
    Ok(Some(match_float!(b.dtype(), S => b.item::<S>()?.to_f64() as f32, _ => return Ok(None))))
}

/// `a op s` into `out` (`a` itself for the in-place form), for a half-precision `a` and an
/// `f32` number: one rounding, after computing in `f32`.
fn launch_half_scalar(op: &'static str, kind: Binary, s: f32, out: &Tensor, a: &Tensor, dest: Dest) -> Result<()> {
    if a.dtype() == DType::F16 && out.dtype() == DType::F16 && f16c::has_f16c() {
        // In f32 between F16C's conversions, as in `launch_binary`.
        return match kind {
            Binary::Mul => run_unary(op, out, a, dest, move |x: f32| x * s),
            _ => run_unary(op, out, a, dest, move |x: f32| x / s),
        };
    }
    match_half!(a.dtype(), T => match kind {
        Binary::Mul => run_unary(op, out, a, dest, move |x: T| T::narrow(x.widen() * s)),
        _ => run_unary(op, out, a, dest, move |x: T| T::narrow(x.widen() / s)),
    })
}

/// Runs `kind` in compute type `ct` into `out` from `a` and `b`.
#[allow(clippy::too_many_arguments)]
fn launch_binary(
    op: &'static str,
    kind: Binary,
    alpha: f64,
    ct: DType,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    dest: Dest,
) -> Result<()> {
    if ct == DType::Bool {
        return match kind {
            Binary::Add | Binary::Maximum => run_binary(op, out, a, b, dest, |x: bool, y: bool| x | y),
            Binary::Mul | Binary::Minimum => run_binary(op, out, a, b, dest, |x: bool, y: bool| x & y),
            _ => Err(unsupported(op, a, "use logical operations (ne, eq) on bool tensors")),
        };
    }
    if kind == Binary::Div {
        return match_float!(ct, T => run_binary(op, out, a, b, dest, |x: T, y: T| Float::div(x, y)),
            _ => Err(unsupported(op, out, "")));
    }
    if ct.is_integer() && alpha.fract() != 0.0 {
        return Err(unsupported(op, a, "alpha must be an integer for integer tensors"));
    }
    if alpha != 1.0 && matches!(kind, Binary::Add | Binary::Sub) && matches!(ct, DType::F16 | DType::BF16) {
        // `x + alpha * y` of halves as PyTorch computes it: alpha rounded to the dtype, the
        // rest in f32, rounded once (the general path rounds `alpha * y` first).
        let alpha = if kind == Binary::Sub { -alpha } else { alpha };
        if [ct, a.dtype(), b.dtype(), out.dtype()] == [DType::F16; 4] && f16c::has_f16c() {
            // In f32 between F16C's conversions, as below.
            let al = <half::f16 as Element>::from_f64(alpha).widen();
            return run_binary(op, out, a, b, dest, move |x: f32, y: f32| x + y * al);
        }
        return match_half!(ct, T => {
            let al = <T as Element>::from_f64(alpha).widen();
            run_binary(op, out, a, b, dest, move |x: T, y: T| T::narrow(x.widen() + y.widen() * al))
        });
    }
    if [ct, a.dtype(), b.dtype(), out.dtype()] == [DType::F16; 4] && f16c::has_f16c() {
        // Every f16 op widens its operands, computes in f32 and rounds once: the f32 kernel
        // between F16C's conversions (fused in one pass over contiguous runs, in the converting
        // blocks over strided ones) gives the same values, faster.
        // (Only all-f16: another input dtype is rounded to f16 first, another output dtype
        // receives the f16 result.)
        return launch_binary(op, kind, alpha, DType::F32, out, a, b, dest);
    }
    match_numeric!(ct, T => {
        let al: T = <T as Element>::from_f64(alpha);
        match kind {
            Binary::Add if alpha == 1.0 => run_binary(op, out, a, b, dest, |x: T, y: T| Num::add(x, y)),
            Binary::Add => run_binary(op, out, a, b, dest, move |x: T, y: T| Num::add(x, Num::mul(y, al))),
            Binary::Sub if alpha == 1.0 => run_binary(op, out, a, b, dest, |x: T, y: T| Num::sub(x, y)),
            Binary::Sub => run_binary(op, out, a, b, dest, move |x: T, y: T| Num::sub(x, Num::mul(y, al))),
            Binary::Mul => run_binary(op, out, a, b, dest, |x: T, y: T| Num::mul(x, y)),
            Binary::Maximum => run_binary(op, out, a, b, dest, |x: T, y: T| Num::maximum(x, y)),
            Binary::Minimum => run_binary(op, out, a, b, dest, |x: T, y: T| Num::minimum(x, y)),
            Binary::Pow => run_binary(op, out, a, b, dest, |x: T, y: T| Num::pow(x, y)),
            Binary::Div => Err(unsupported(op, out, "")),
        }
    }, _ => Err(unsupported(op, out, "")))
}

#[allow(clippy::bool_comparison)] // `x < y` is generic; for bool it is the order false < true
fn launch_compare(
    op: &'static str,
    kind: Compare,
    ct: DType,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    dest: Dest,
) -> Result<()> {
    match_dtype!(ct, T => match kind {
        Compare::Eq => run_binary(op, out, a, b, dest, |x: T, y: T| x == y),
        Compare::Ne => run_binary(op, out, a, b, dest, |x: T, y: T| x != y),
        Compare::Lt => run_binary(op, out, a, b, dest, |x: T, y: T| x < y),
        Compare::Le => run_binary(op, out, a, b, dest, |x: T, y: T| x <= y),
        Compare::Gt => run_binary(op, out, a, b, dest, |x: T, y: T| x > y),
        Compare::Ge => run_binary(op, out, a, b, dest, |x: T, y: T| x >= y),
    }, _ => Err(unsupported(op, a, "")))
}

/// One of the float-only [`Unary`] functions (`K` is the variant as a number), called
/// through [`UnaryFn`] so that the loops inline it.
#[derive(Clone, Copy)]
struct FloatFn<const K: u8>;

impl<T: Float, const K: u8> UnaryFn<T, T> for FloatFn<K> {
    /// A quarter of PyTorch's `GRAIN_SIZE` for the elementary functions of `vmath` (an element
    /// of GELU costs about ten of an add): with the whole grain, GELU of 16x3072 (a decode
    /// step's activation, 49152 elements) would run on one thread.
    const GRAIN: usize = if Unary::lanes_fn(K).is_some() { GRAIN / 4 } else { GRAIN };

    #[inline(always)]
    fn call(&self, x: T) -> T {
        // `K` is a constant: each instance keeps one arm.
        match K {
            k if k == Unary::Exp as u8 => x.exp(),
            k if k == Unary::Log as u8 => x.ln(),
            k if k == Unary::Sqrt as u8 => x.sqrt(),
            k if k == Unary::Gelu as u8 => x.gelu(),
            k if k == Unary::Sigmoid as u8 => x.sigmoid(),
            k if k == Unary::GeluTanh as u8 => x.gelu_tanh(),
            k if k == Unary::Silu as u8 => x.silu(),
            _ => x.tanh(),
        }
    }

    /// GELU, SiLU, the sigmoid, GELU's tanh form, `tanh`, `exp` and `log` on `f32` runs, in
    /// blocks of several vectors side by side where the CPU has AVX-512 or AVX2
    /// ([`vmath::blocks`](crate::vmath::blocks)).
    #[inline(always)]
    unsafe fn call_run(&self, isa: Isa, x: *const T, o: *mut T, n: usize) -> bool {
        // The checks the compiler decides first: other types and ops never read the switches.
        if isa == Isa::Baseline || core::any::TypeId::of::<T>() != core::any::TypeId::of::<f32>() {
            return false;
        }
        let Some(func) = Unary::lanes_fn(K) else { return false };
        let Some(run) = crate::vmath::blocks(func) else { return false };
        // SAFETY: `T` is `f32`; `blocks` returns only what the CPU runs; the rest is the
        // caller's promise.
        unsafe { run(func, x as *const f32, o as *mut f32, n) };
        true
    }

    /// The same on bf16 and f16 runs, each element widened, computed and rounded in registers
    /// ([`vmath::avx512::run_half`](crate::vmath::avx512::run_half)).
    #[inline(always)]
    unsafe fn call_run_half(&self, isa: Isa, half: DType, x: *const u16, o: *mut u16, n: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::vmath::avx512::{Half, run_half};
            let Some(func) = Unary::lanes_fn(K) else { return false };
            let half = match half {
                DType::BF16 => Half::Bf16,
                DType::F16 => Half::F16,
                _ => return false,
            };
            if isa != Isa::Avx512 || !super::switch::avx512_blocks_enabled() {
                return false;
            }
            // SAFETY: the CPU has AVX-512 F, BW and VL (the switch is on only there); the rest
            // is the caller's promise.
            unsafe { run_half(func, half, x, o, n) };
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, half, x, o, n);
            false
        }
    }
}

fn launch_unary(op: &'static str, kind: Unary, ct: DType, out: &Tensor, a: &Tensor, dest: Dest) -> Result<()> {
    if let Some(func) = Unary::lanes_fn(kind as u8)
        && [a.dtype(), out.dtype()] == [ct, ct]
        && super::switch::half_tables_enabled()
        && let Some(table) = super::table::table(func, ct)
    {
        // bf16 or f16 in and out: each element's result looked up by its bits (the same bits
        // as the routes below; see `table`).
        return match ct {
            DType::BF16 => run_unary_wide(op, out, a, dest, TableFn::<half::bf16>::new(table)),
            _ => run_unary_wide(op, out, a, dest, TableFn::<half::f16>::new(table)),
        };
    }
    if [ct, a.dtype(), out.dtype()] == [DType::F16; 3] && f16c::has_f16c() && kind.is_float_only() {
        // The f32 kernel between F16C's conversions, as in `launch_binary`: every f16 function
        // widens, computes in f32 and rounds once. (Only the float-only ops: `neg`, `abs`,
        // `relu` read the f16 bits as they are, faster than converting them.)
        return launch_unary(op, kind, DType::F32, out, a, dest);
    }
    if [ct, a.dtype(), out.dtype()] == [DType::BF16; 3]
        && Unary::lanes_fn(kind as u8).is_some()
        && super::switch::avx512_blocks_enabled()
    {
        // Likewise for bf16 where the f32 kernel runs four vectors side by side: contiguous
        // runs are widened, computed and rounded in the blocks' registers (`call_run_half`),
        // strided ones through the converting loops (the same bits: each element widens,
        // computes, rounds once).
        return launch_unary(op, kind, DType::F32, out, a, dest);
    }
    if kind.is_float_only() {
        // Compute-bound (the `vmath` functions, `sqrt`): compiled for the widest extension,
        // through `FloatFn` (a closure around GELU is not inlined into the loops).
        return match_float!(ct, T => match kind {
            Unary::Exp => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Exp as u8 }>),
            Unary::Log => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Log as u8 }>),
            Unary::Sqrt => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Sqrt as u8 }>),
            Unary::Gelu => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Gelu as u8 }>),
            Unary::Sigmoid => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Sigmoid as u8 }>),
            Unary::GeluTanh => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::GeluTanh as u8 }>),
            Unary::Silu => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Silu as u8 }>),
            _ => run_unary_wide::<T, T>(op, out, a, dest, FloatFn::<{ Unary::Tanh as u8 }>),
        }, _ => Err(unsupported(op, a, "")));
    }
    if ct == DType::Bool {
        return match kind {
            Unary::Abs | Unary::Relu => run_unary(op, out, a, dest, |x: bool| x),
            _ => Err(unsupported(op, a, "use logical operations on bool tensors")),
        };
    }
    match_numeric!(ct, T => match kind {
        Unary::Neg => run_unary(op, out, a, dest, |x: T| Num::neg(x)),
        Unary::Abs => run_unary(op, out, a, dest, |x: T| Num::abs(x)),
        _ => run_unary(op, out, a, dest, |x: T| if x > T::ZERO || Num::is_nan(x) { x } else { T::ZERO }),
    }, _ => Err(unsupported(op, a, "")))
}

/// `out`'s shape must be `shape` exactly (it is not resized) and its dtype one `ct` casts to.
fn check_out(op: &'static str, out: &Tensor, shape: &[usize], ct: DType) -> Result<()> {
    if out.sizes() != shape {
        return Err(TensorError::BadShape {
            op,
            shape: out.sizes().to_vec(),
            target: shape.to_vec(),
            reason: "the output must have the broadcast shape of the inputs (it is not resized)",
        });
    }
    if !can_cast(ct, out.dtype()) {
        return Err(unsupported(op, out, "the result's dtype cannot be cast to the output's"));
    }
    Ok(())
}

#[allow(clippy::bool_comparison)] // `x < y` is generic; for bool it is the order false < true
impl Tensor {
    /// The compute type of a binary arithmetic op, checked for the kind.
    fn binary_type(&self, op: &'static str, kind: Binary, other: &Tensor) -> Result<DType> {
        let mut ct = result_type(op, self, other)?;
        if kind == Binary::Div && !ct.is_floating_point() {
            ct = DType::F32;
        }
        if ct == DType::Bool && matches!(kind, Binary::Sub | Binary::Pow) {
            return Err(unsupported(op, self, "use logical operations (ne, eq) on bool tensors"));
        }
        Ok(ct)
    }

    /// `self kind alpha * other` into a fresh tensor, its errors naming `op` (the method called:
    /// `add`, `add_scalar`, `add_scaled`).
    fn binary(&self, op: &'static str, kind: Binary, other: &Tensor, alpha: f64) -> Result<Tensor> {
        self.binary_laid_out(op, kind, other, alpha, false)
    }

    /// [`binary`](Self::binary), its output laid out by this tensor alone when `by_self`
    /// (PyTorch's `pow(Tensor, Scalar)` is a unary op of its tensor), else by both operands.
    fn binary_laid_out(
        &self,
        op: &'static str,
        kind: Binary,
        other: &Tensor,
        alpha: f64,
        by_self: bool,
    ) -> Result<Tensor> {
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        let ct = self.binary_type(op, kind, other)?;
        let both = [Input::of(self, ct), Input::of(other, ct)];
        let inputs = if by_self { &both[..1] } else { &both[..] };
        if let Some(v) = half_opmath_operand(kind, ct, self, other)? {
            // SAFETY: `launch_half_scalar` writes every element of `out` or fails.
            let out = unsafe { elementwise_output(op, self.sizes(), ct, self, inputs) }?;
            launch_half_scalar(op, kind, v, &out, self, Dest::Fresh)?;
            return Ok(out);
        }
        // SAFETY: `launch_binary` writes every element of `out` or fails, dropping it unread.
        let out = unsafe { elementwise_output(op, &shape, ct, self, inputs) }?;
        launch_binary(op, kind, alpha, ct, &out, self, other, Dest::Fresh)?;
        Ok(out)
    }

    /// In-place [`binary`](Self::binary), its errors naming `op`.
    fn binary_(&self, op: &'static str, kind: Binary, other: &Tensor, alpha: f64) -> Result<&Tensor> {
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        if *shape != *self.sizes() {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: other.sizes().to_vec(),
                reason: "an in-place operand must broadcast to the destination's shape",
            });
        }
        let ct = self.binary_type(op, kind, other)?;
        if !can_cast(ct, self.dtype()) {
            return Err(unsupported(op, self, "the result's dtype cannot be cast to the destination's"));
        }
        if let Some(v) = half_opmath_operand(kind, ct, self, other)? {
            launch_half_scalar(op, kind, v, self, self, Dest::Into)?;
            return Ok(self);
        }
        launch_binary(op, kind, alpha, ct, self, self, other, Dest::Into)?;
        Ok(self)
    }

    fn binary_out<'o>(&self, kind: Binary, other: &Tensor, out: &'o Tensor, alpha: f64) -> Result<&'o Tensor> {
        let op = kind.name(Form::Out);
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        let ct = self.binary_type(op, kind, other)?;
        check_out(op, out, &shape, ct)?;
        if let Some(v) = half_opmath_operand(kind, ct, self, other)? {
            launch_half_scalar(op, kind, v, out, self, Dest::Into)?;
            return Ok(out);
        }
        launch_binary(op, kind, alpha, ct, out, self, other, Dest::Into)?;
        Ok(out)
    }

    /// `self kind s` (`add_scalar`), its errors naming `op`.
    fn binary_scalar(&self, op: &'static str, kind: Binary, s: Scalar) -> Result<Tensor> {
        self.check_scalar_power(op, kind, s)?;
        if let Some(v) = half_opmath_scalar(kind, self.dtype(), s) {
            let inputs = [Input::of(self, self.dtype()), Input::number()];
            // SAFETY: `launch_half_scalar` writes every element of `out` or fails.
            let out = unsafe { elementwise_output(op, self.sizes(), self.dtype(), self, &inputs) }?;
            launch_half_scalar(op, kind, v, &out, self, Dest::Fresh)?;
            return Ok(out);
        }
        self.binary_laid_out(op, kind, &self.scalar_operand(op, s, kind == Binary::Div)?, 1.0, kind == Binary::Pow)
    }

    /// In-place [`binary_scalar`](Self::binary_scalar).
    fn binary_scalar_(&self, op: &'static str, kind: Binary, s: Scalar) -> Result<&Tensor> {
        self.check_scalar_power(op, kind, s)?;
        if let Some(v) = half_opmath_scalar(kind, self.dtype(), s) {
            launch_half_scalar(op, kind, v, self, self, Dest::Into)?;
            return Ok(self);
        }
        self.binary_(op, kind, &self.scalar_operand(op, s, kind == Binary::Div)?, 1.0)
    }

    /// PyTorch refuses an integer (or bool) tensor to a negative integer number's power (the
    /// result is not an integer); a tensor of exponents is not checked, as in PyTorch.
    fn check_scalar_power(&self, op: &'static str, kind: Binary, s: Scalar) -> Result<()> {
        match s {
            Scalar::Int(e)
                if kind == Binary::Pow && e < 0 && (self.dtype().is_integer() || self.dtype() == DType::Bool) =>
            {
                Err(unsupported(
                    op,
                    self,
                    "integers to negative integer powers are not allowed; use a floating-point exponent (-1.0)",
                ))
            }
            _ => Ok(()),
        }
    }

    /// A 0-d tensor holding `s` in this tensor's allocator, with the dtype the operation
    /// computes in (PyTorch's rule for wrapped numbers). A true division of integers computes
    /// in `f32`, so its number is an `f32` too: `u8 / -3` divides by -3.0, not by -3 wrapped
    /// into `u8`.
    fn scalar_operand(&self, op: &'static str, s: Scalar, true_division: bool) -> Result<Tensor> {
        let dt = DType::result_type(self.dtype(), false, s.kind_dtype(), true).ok_or(TensorError::NoCommonDType {
            op,
            lhs: self.dtype(),
            rhs: s.kind_dtype(),
        })?;
        let float_op = matches!(s, Scalar::Float(_)) || true_division;
        let dt = if !dt.is_floating_point() && float_op { DType::F32 } else { dt };
        s.to_tensor(op, dt, self.options())
    }

    /// `value op self` (a number on the left): the number as a 0-d tensor of the operation's
    /// type, first.
    pub(crate) fn scalar_first(&self, kind: BinaryOp, value: f64) -> Result<Tensor> {
        let kind = match kind {
            BinaryOp::Add => Binary::Add,
            BinaryOp::Sub => Binary::Sub,
            BinaryOp::Mul => Binary::Mul,
            BinaryOp::Div => Binary::Div,
        };
        let op = kind.name(Form::Fresh);
        let s = self.scalar_operand(op, Scalar::Float(value), kind == Binary::Div)?;
        s.binary(op, kind, self, 1.0)
    }

    /// `self kind other` as a bool tensor, its errors naming `op` (`eq` or `eq_scalar`).
    fn compare(&self, op: &'static str, kind: Compare, other: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        let ct = result_type(op, self, other)?;
        // SAFETY: `launch_compare` writes every element of `out` or fails.
        let out =
            unsafe { elementwise_output(op, &shape, DType::Bool, self, &[Input::of(self, ct), Input::of(other, ct)]) }?;
        launch_compare(op, kind, ct, &out, self, other, Dest::Fresh)?;
        Ok(out)
    }

    fn compare_out<'o>(&self, kind: Compare, other: &Tensor, out: &'o Tensor) -> Result<&'o Tensor> {
        let op = kind.out_name();
        let shape = broadcast_shapes(op, self.sizes(), other.sizes())?;
        let ct = result_type(op, self, other)?;
        check_out(op, out, &shape, DType::Bool)?;
        launch_compare(op, kind, ct, out, self, other, Dest::Into)?;
        Ok(out)
    }

    fn unary_type(&self, op: &'static str, kind: Unary) -> Result<DType> {
        if self.dtype().is_quantized() {
            return Err(TensorError::quantized(op, self));
        }
        Ok(if kind.is_float_only() && !self.dtype().is_floating_point() { DType::F32 } else { self.dtype() })
    }

    fn unary(&self, kind: Unary) -> Result<Tensor> {
        let op = kind.name(Form::Fresh);
        let ct = self.unary_type(op, kind)?;
        // SAFETY: `launch_unary` writes every element of `out` or fails.
        let out = unsafe { elementwise_output(op, self.sizes(), ct, self, &[Input::of(self, ct)]) }?;
        launch_unary(op, kind, ct, &out, self, Dest::Fresh)?;
        Ok(out)
    }

    fn unary_(&self, kind: Unary) -> Result<&Tensor> {
        let op = kind.name(Form::InPlace);
        let ct = self.unary_type(op, kind)?;
        if !can_cast(ct, self.dtype()) {
            return Err(unsupported(op, self, "the result is floating point; use the out-of-place form"));
        }
        launch_unary(op, kind, ct, self, self, Dest::Into)?;
        Ok(self)
    }

    fn unary_out<'o>(&self, kind: Unary, out: &'o Tensor) -> Result<&'o Tensor> {
        let op = kind.name(Form::Out);
        let ct = self.unary_type(op, kind)?;
        check_out(op, out, self.sizes(), ct)?;
        launch_unary(op, kind, ct, out, self, Dest::Into)?;
        Ok(out)
    }

    /// Copies `src` (broadcast to this tensor's shape, converted to its dtype) into this tensor.
    /// A `src` that shares memory with this tensor is read as if copied first.
    ///
    /// # Errors
    /// [`TensorError::Broadcast`]/[`TensorError::BadShape`] when `src` does not broadcast to
    /// this shape; [`TensorError::InternalOverlap`]; [`TensorError::ReadOnly`].
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        cast_into("copy_", self, src, Dest::Into)?;
        Ok(self)
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $name_:ident, $name_out:ident, $scalar:ident, $scalar_:ident => $kind:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// [`TensorError::Broadcast`] when the shapes do not broadcast;
                /// [`TensorError::UnsupportedDType`]/[`TensorError::NoCommonDType`] for dtypes
                /// the operation does not take (see the module docs on promotion).
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(stringify!($name), Binary::$kind, other, 1.0)
                }

                #[doc = concat!("In-place [`", stringify!($name), "`](Self::", stringify!($name), "): writes the result into `self` (and every view of its storage), computed in the result type and converted once.")]
                ///
                /// # Errors
                /// As the out-of-place form; [`TensorError::BadShape`] when `other` does not
                /// broadcast to `self`'s shape; [`TensorError::UnsupportedDType`] when the
                /// result's dtype cannot be cast to `self`'s; [`TensorError::InternalOverlap`];
                /// [`TensorError::ReadOnly`].
                pub fn $name_(&self, other: &Tensor) -> Result<&Tensor> {
                    self.binary_(stringify!($name_), Binary::$kind, other, 1.0)
                }

                #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") into an existing tensor (PyTorch's `out=`): `out` must have the broadcast shape and a dtype the result casts to; it may be one of the inputs. Returns `out`.")]
                ///
                /// # Errors
                /// As the out-of-place form; [`TensorError::BadShape`] for another shape;
                /// [`TensorError::UnsupportedDType`] when the result cannot be cast to `out`'s
                /// dtype; [`TensorError::InternalOverlap`]; [`TensorError::ReadOnly`].
                pub fn $name_out<'o>(&self, other: &Tensor, out: &'o Tensor) -> Result<&'o Tensor> {
                    self.binary_out(Binary::$kind, other, out, 1.0)
                }

                #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") with a number (see [`Scalar`] for the result's dtype).")]
                ///
                /// # Errors
                /// As the tensor form.
                pub fn $scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
                    self.binary_scalar(stringify!($scalar), Binary::$kind, value.into())
                }

                #[doc = concat!("In-place [`", stringify!($scalar), "`](Self::", stringify!($scalar), ").")]
                ///
                /// # Errors
                /// As the in-place tensor form.
                pub fn $scalar_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
                    self.binary_scalar_(stringify!($scalar_), Binary::$kind, value.into())
                }
            )*
        }
    };
}

binary_methods! {
    /// `self + other`, broadcast.
    add, add_, add_out, add_scalar, add_scalar_ => Add;
    /// `self - other`, broadcast.
    sub, sub_, sub_out, sub_scalar, sub_scalar_ => Sub;
    /// `self * other`, broadcast.
    mul, mul_, mul_out, mul_scalar, mul_scalar_ => Mul;
    /// `self / other`, broadcast (true division: integers give f32).
    div, div_, div_out, div_scalar, div_scalar_ => Div;
    /// Element-wise maximum (NaN if either is NaN).
    maximum, maximum_, maximum_out, maximum_scalar, maximum_scalar_ => Maximum;
    /// Element-wise minimum (NaN if either is NaN).
    minimum, minimum_, minimum_out, minimum_scalar, minimum_scalar_ => Minimum;
    /// `self` to the power `other`.
    pow, pow_, pow_out, pow_scalar, pow_scalar_ => Pow;
}

impl Tensor {
    /// `self + alpha * other` (PyTorch's `add(other, alpha=)`).
    ///
    /// # Errors
    /// As [`add`](Self::add); [`TensorError::UnsupportedDType`] for a fractional `alpha` with
    /// integer tensors.
    pub fn add_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        self.binary("add_scaled", Binary::Add, other, alpha)
    }

    /// In-place [`add_scaled`](Self::add_scaled).
    ///
    /// # Errors
    /// As [`add_`](Self::add_).
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<&Tensor> {
        self.binary_("add_scaled_", Binary::Add, other, alpha)
    }

    /// `self - alpha * other`.
    ///
    /// # Errors
    /// As [`add_scaled`](Self::add_scaled).
    pub fn sub_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        self.binary("sub_scaled", Binary::Sub, other, alpha)
    }
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident, $name_out:ident, $scalar:ident => $kind:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// [`TensorError::Broadcast`]; [`TensorError::NoCommonDType`] with a quantised
                /// operand.
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.compare(stringify!($name), Compare::$kind, other)
                }

                #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") into an existing bool tensor of the broadcast shape (`out=`).")]
                ///
                /// # Errors
                /// As the out-of-place form; [`TensorError::BadShape`] for another shape;
                /// [`TensorError::UnsupportedDType`] for a non-bool `out`.
                pub fn $name_out<'o>(&self, other: &Tensor, out: &'o Tensor) -> Result<&'o Tensor> {
                    self.compare_out(Compare::$kind, other, out)
                }

                #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") with a number.")]
                ///
                /// # Errors
                /// As the tensor form.
                pub fn $scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
                    let op = stringify!($scalar);
                    let s = self.scalar_operand(op, value.into(), false)?;
                    self.compare(op, Compare::$kind, &s)
                }
            )*
        }
    };
}

compare_methods! {
    /// `self == other` element-wise, as a bool tensor.
    eq, eq_out, eq_scalar => Eq;
    /// `self != other` element-wise, as a bool tensor.
    ne, ne_out, ne_scalar => Ne;
    /// `self < other` element-wise, as a bool tensor.
    lt, lt_out, lt_scalar => Lt;
    /// `self <= other` element-wise, as a bool tensor.
    le, le_out, le_scalar => Le;
    /// `self > other` element-wise, as a bool tensor.
    gt, gt_out, gt_scalar => Gt;
    /// `self >= other` element-wise, as a bool tensor.
    ge, ge_out, ge_scalar => Ge;
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident, $name_:ident, $name_out:ident => $kind:ident;)*) => {
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

                #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") into an existing tensor of the same shape (`out=`).")]
                ///
                /// # Errors
                /// As the out-of-place form; [`TensorError::BadShape`] for another shape;
                /// [`TensorError::UnsupportedDType`] when the result cannot be cast to `out`'s
                /// dtype.
                pub fn $name_out<'o>(&self, out: &'o Tensor) -> Result<&'o Tensor> {
                    self.unary_out(Unary::$kind, out)
                }
            )*
        }
    };
}

unary_methods! {
    /// `-self` (wrapping for integers; refused for bool).
    neg, neg_, neg_out => Neg;
    /// `|self|`.
    abs, abs_, abs_out => Abs;
    /// `max(self, 0)` (NaN stays NaN).
    relu, relu_, relu_out => Relu;
    /// `e^self`.
    exp, exp_, exp_out => Exp;
    /// Natural logarithm.
    log, log_, log_out => Log;
    /// Square root.
    sqrt, sqrt_, sqrt_out => Sqrt;
    /// GELU with the exact error function (PyTorch's default `approximate='none'`).
    gelu, gelu_, gelu_out => Gelu;
    /// GELU's tanh approximation, `x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2` (PyTorch's
    /// `gelu(x, approximate='tanh')`, GPT-2's activation), computed as the equal
    /// `x / (1 + e^(-2√(2/π) (x + 0.044715 x³)))`, so that the negative tail keeps its value
    /// where `1 + tanh` would round to 0.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    /// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 1.0], &[3], DType::F32)?;
    /// let y = x.gelu_tanh()?.to_vec::<f32>()?;
    /// assert!((y[0] - -0.158_808).abs() < 1e-6 && y[1] == 0.0 && (y[2] - 0.841_192).abs() < 1e-6);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    gelu_tanh, gelu_tanh_, gelu_tanh_out => GeluTanh;
    /// `1 / (1 + e^-self)`.
    sigmoid, sigmoid_, sigmoid_out => Sigmoid;
    /// `self * sigmoid(self)` (SiLU, or swish: the activation of Llama's MLP; PyTorch's
    /// `torch.nn.functional.silu`).
    silu, silu_, silu_out => Silu;
    /// Hyperbolic tangent.
    tanh, tanh_, tanh_out => Tanh;
}
