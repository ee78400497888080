//! Fused normalisations: `layer_norm` and `rms_norm`, passes over each row for the statistics
//! (two for `layer_norm`'s mean and variance, one for `rms_norm`) and one for the output, not
//! five separate ops and their temporaries.
//!
//! Rows are the trailing `normalized_shape` elements; `f16`/`bf16`/`f32` compute in `f32`,
//! `f64` in `f64`; the statistics are summed in `f64`, those of `f16` and `bf16` rows in `f32`
//! unless that over- or underflows (see [`moments_f32`]); the result keeps the input's dtype.
//! f16 rows (up to [`F32_ROWS_MAX`](super::f16c::F32_ROWS_MAX) long) are widened by F16C into
//! an f32 scratch row and normalised there, then rounded back by F16C: several times faster
//! than converting each value in the loops (`docs/reductions.md`).

use crate::dtype::match_float;
use crate::iter::{GRAIN, prefetch_slice};
use crate::parallel::{for_each_part, threads_for};
use crate::storage::lock_storages;
use core::mem::MaybeUninit;

use crate::num::{NAN_RANK, Num, Opmath};
use crate::{DType, Element, Result, Tensor, TensorError};

use super::f16c;
use super::isa::{self, vectorised};
use super::lanes;
use super::reduce::lanes_f32;

/// Which normalisation.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Layer,
    Rms,
}

/// `sum(f(x))` over a row, in `f64` lanes.
#[inline(always)]
fn lane_sum<T: Element>(src: &[T], f: impl Fn(f64) -> f64) -> f64 {
    lanes(src, 0.0, |v: T| f(v.to_f64()), |a, b| a + b)
}

/// A row's centre and second moment: `layer_norm`'s mean and variance (two passes), `rms_norm`'s
/// 0 and mean square (one pass), summed in `f64`.
#[inline(always)]
fn moments_f64<T: Element>(kind: Kind, src: &[T]) -> (f64, f64) {
    let n = src.len() as f64;
    match kind {
        Kind::Layer => {
            let mean = lane_sum(src, |v| v) / n;
            (mean, lane_sum(src, |v| (v - mean) * (v - mean)) / n)
        }
        Kind::Rms => (0.0, lane_sum(src, |v| v * v) / n),
    }
}

/// Below this second moment (about 2^-100), [`moments_f32`] defers to [`moments_f64`]: squares
/// under `f32::MIN_POSITIVE` (2^-126) lose bits as subnormals, each at most 2^-150, so their
/// mean is off by at most a part in 2^50 of a moment this large.
const F32_MOMENT_FLOOR: f64 = 1e-30;

/// [`moments_f64`] summed in `f32` lanes, for the 16-bit floats ([`Opmath::NARROW`]): their
/// values have 8 or 11 significant bits, so each lane's `f32` sum (of at most 256 values, see
/// [`lanes_f32`]) loses little or nothing, and `f32` lanes are twice as many per vector.
/// PyTorch's kernels sum these types in `f32` too. `None` where `f32` is not enough: a second
/// moment that overflowed or is NaN (an infinity or a NaN in the row), or is below
/// [`F32_MOMENT_FLOOR`] (squares that underflowed, or a row of one value).
#[inline(always)]
fn moments_f32<T: Opmath>(kind: Kind, src: &[T]) -> Option<(f64, f64)> {
    let n = src.len() as f64;
    let x = |v: T| v.to_op().to_f64() as f32;
    let (mean, m2) = match kind {
        Kind::Layer => {
            let mean = (lanes_f32(src, x) / n) as f32;
            (mean, lanes_f32(src, |v| (x(v) - mean) * (x(v) - mean)) / n)
        }
        Kind::Rms => (0.0, lanes_f32(src, |v| x(v) * x(v)) / n),
    };
    (m2.is_finite() && m2 >= F32_MOMENT_FLOOR).then_some((f64::from(mean), m2))
}

/// What a row's output is: `(x - shift) * scale`, times `w`, plus `b`, in the compute type `C`.
#[derive(Clone, Copy)]
struct Affine<'a, C> {
    shift: C,
    scale: C,
    w: Option<&'a [C]>,
    b: Option<&'a [C]>,
}

/// One row, `dst[i] = f(src[i])`. A bf16 row is rounded without
/// [`narrow`](crate::halfconv::HalfFloat::narrow)'s NaN select, noting whether a value
/// was NaN, and written again with it if one was.
#[inline(always)]
fn write_row<T: Opmath>(src: &[T], dst: &mut [MaybeUninit<T>], f: Affine<'_, T::C>) {
    if T::NAN_SELECT {
        let mut rank = 0;
        each_output(src, dst, f, |d, v| {
            d.write(T::from_op_not_nan(v));
            rank = rank.max(T::nan_rank(v));
        });
        if rank <= NAN_RANK {
            return;
        }
    }
    each_output(src, dst, f, |d, v| {
        d.write(T::from_op(v));
    });
}

/// `put(dst[i], f(src[i]))`, for [`write_row`].
#[inline(always)]
fn each_output<T: Opmath>(
    src: &[T],
    dst: &mut [MaybeUninit<T>],
    f: Affine<'_, T::C>,
    mut put: impl FnMut(&mut MaybeUninit<T>, T::C),
) {
    let y = |v: T| Num::mul(Num::sub(v.to_op(), f.shift), f.scale);
    let pairs = dst.iter_mut().zip(src);
    // One loop per case, so that each is a plain loop to vectorise.
    match (f.w, f.b) {
        (Some(w), Some(b)) => pairs.zip(w.iter().zip(b)).for_each(|((d, &v), (&w, &b))| {
            put(d, Num::add(Num::mul(y(v), w), b));
        }),
        (Some(w), None) => pairs.zip(w).for_each(|((d, &v), &w)| put(d, Num::mul(y(v), w))),
        (None, Some(b)) => pairs.zip(b).for_each(|((d, &v), &b)| put(d, Num::add(y(v), b))),
        (None, None) => pairs.for_each(|(d, &v)| put(d, y(v))),
    }
}

/// One row's statistics, then its output: three passes over a row that stays in cache, and no
/// temporary. A function (`#[inline(always)]`), not a closure: called from the loop that
/// `vectorised!` compiles for the widest extension, a closure was not inlined there and ran as
/// baseline SSE2 code.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn normalize_row<T: Opmath>(
    kind: Kind,
    f32_moments: bool,
    src: &[T],
    next: &[T],
    dst: &mut [MaybeUninit<T>],
    weight: Option<&[T::C]>,
    bias: Option<&[T::C]>,
    eps: f64,
) {
    let narrow = if f32_moments { moments_f32(kind, src) } else { None };
    let (shift, m2) = narrow.unwrap_or_else(|| moments_f64(kind, src));
    let scale = 1.0 / (m2 + eps).sqrt();
    // `layer_norm`'s first pass read this row from memory; the next one is fetched while this
    // one is written from L1 (`rms_norm`, whose one pass reads the rows nearly back to back,
    // gains nothing from it: `docs/reductions.md`).
    if kind == Kind::Layer {
        prefetch_slice(next);
    }
    let (shift, scale) = (T::C::from_f64(shift), T::C::from_f64(scale));
    write_row(src, dst, Affine { shift, scale, w: weight, b: bias });
}

/// Normalises each row of `x` (contiguous `T`, rows of `n`) into `out` (fresh, contiguous).
fn normalize_rows<T: Opmath>(
    kind: Kind,
    x: &[T],
    out: &mut [MaybeUninit<T>],
    n: usize,
    weight: Option<&[T::C]>,
    bias: Option<&[T::C]>,
    eps: f64,
) {
    let rows = |first: usize, part: &mut [MaybeUninit<T>]| {
        let src = &x[first..first + part.len()];
        if let Some((src, part)) = f16c::f16_rows(src, part, n) {
            // f16 rows in f32 scratch, converted by F16C, with the statistics in f32 as for
            // any f16 row. The parameters, `T::C` (f32 here), as f32 slices.
            let f32s = |p: Option<&[T::C]>| p.map(|p| p.iter().map(|v| v.to_f64() as f32).collect::<Vec<_>>());
            let (w, b) = (f32s(weight), f32s(bias));
            let (mut wide, mut out) = (vec![0.0; n], vec![MaybeUninit::uninit(); n]);
            return vectorised!(isa::detected(), {
                for (s, d) in src.chunks(n).zip(part.chunks_mut(n)) {
                    f16c::widen_f16(s, &mut wide);
                    normalize_row(kind, true, &wide, &[], &mut out, w.as_deref(), b.as_deref(), eps);
                    // SAFETY: `normalize_row` wrote every element of `out`.
                    unsafe { f16c::narrow_written(&out, d) };
                }
            });
        }
        vectorised!(isa::detected(), {
            for (r, (s, d)) in src.chunks(n).zip(part.chunks_mut(n)).enumerate() {
                let next = src.get((r + 1) * n..(r + 2) * n).unwrap_or_default();
                normalize_row(kind, T::NARROW, s, next, d, weight, bias, eps);
            }
        })
    };
    let threads = threads_for(x.len(), GRAIN);
    if threads > 1 {
        let pieces = threads.min(x.len().div_ceil(GRAIN));
        for_each_part(out, pieces, n, rows);
    } else {
        rows(0, out);
    }
}

impl Tensor {
    fn normalize(
        &self,
        op: &'static str,
        kind: Kind,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        if !self.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: "normalisation needs a floating-point tensor",
            });
        }
        let k = normalized_shape.len();
        if k == 0 || k > self.dim() || self.sizes()[self.dim() - k..] != *normalized_shape {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: normalized_shape.to_vec(),
                reason: "normalized_shape must be the tensor's trailing dimensions (at least one)",
            });
        }
        for t in [weight, bias].into_iter().flatten() {
            if t.sizes() != normalized_shape {
                return Err(TensorError::BadShape {
                    op,
                    shape: t.sizes().to_vec(),
                    target: normalized_shape.to_vec(),
                    reason: "weight and bias must have the normalized shape",
                });
            }
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: normalized_shape.to_vec(),
                reason: "eps must be a number >= 0",
            });
        }
        let x = self.contiguous()?;
        // SAFETY: `normalize_rows` writes every row of `out`.
        let out = unsafe { Tensor::output(op, self.sizes(), self.dtype(), self) }?;
        if out.numel() == 0 {
            return Ok(out);
        }
        // A part of `numel`'s product (not 0, it fits), so it fits too and is not 0.
        let n: usize = normalized_shape.iter().product();
        let acc = if self.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let params = |t: Option<&Tensor>| t.map(|t| t.to_dtype(acc)).transpose();
        let (w, b) = (params(weight)?, params(bias)?);
        x.host_ready(op)?;
        let _g = lock_storages(op, None, &[x.storage()])?;
        let numel = x.numel();
        match_float!(self.dtype(), T => {
            // SAFETY: `x` is contiguous `T` with `numel` elements, read-locked; `out` is a
            // fresh allocation of `numel` elements of `T` that nothing else refers to.
            let (src, dst) = unsafe {
                (
                    core::slice::from_raw_parts(x.data_ptr() as *const T, numel),
                    core::slice::from_raw_parts_mut(out.data_ptr() as *mut MaybeUninit<T>, numel),
                )
            };
            let (w, b) = (w.map(|t| t.to_vec::<<T as Opmath>::C>()).transpose()?, b.map(|t| t.to_vec::<<T as Opmath>::C>()).transpose()?);
            normalize_rows::<T>(kind, src, dst, n, w.as_deref(), b.as_deref(), eps);
        }, _ => {});
        Ok(out)
    }

    /// Layer normalisation over the trailing `normalized_shape` dimensions
    /// (`F.layer_norm`): `(x - mean) / sqrt(var + eps) * weight + bias`, with the biased
    /// variance, in one fused pass per row.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2., 3., 4.], &[2, 2], DType::F32)?;
    /// let y = x.layer_norm(&[2], None, None, 1e-5)?;
    /// let v = y.to_vec::<f32>()?;
    /// assert!((v[0] + 1.0).abs() < 1e-3 && (v[1] - 1.0).abs() < 1e-3);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for a non-float tensor; [`TensorError::BadShape`] when
    /// `normalized_shape` is not the trailing shape, when weight or bias has another shape, or
    /// for a negative or NaN `eps`.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        self.normalize("layer_norm", Kind::Layer, normalized_shape, weight, bias, eps)
    }

    /// RMS normalisation over the trailing `normalized_shape` dimensions (`F.rms_norm`, as in
    /// LLaMA): `x / sqrt(mean(x^2) + eps) * weight`. `eps` defaults to the machine epsilon of
    /// the type the kernel computes in, as PyTorch's kernels do: `f64::EPSILON` for `f64`,
    /// `f32::EPSILON` for `f32`, `f16` and `bf16` (PyTorch's docs name the input's dtype, but
    /// its kernels take their `opmath` type's epsilon: `F.rms_norm` of an `f16` tensor adds
    /// 1.19e-7, not 9.8e-4).
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![3.0f32, 4.], &[1, 2], DType::F32)?;
    /// let w = Tensor::from_vec(vec![1.0f32, 2.], &[2], DType::F32)?;
    /// let y = x.rms_norm(&[2], Some(&w), Some(0.0))?.to_vec::<f32>()?;
    /// let rms = (12.5f32).sqrt();
    /// assert!((y[0] - 3.0 / rms).abs() < 1e-6 && (y[1] - 8.0 / rms).abs() < 1e-6);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// As [`layer_norm`](Self::layer_norm).
    pub fn rms_norm(&self, normalized_shape: &[usize], weight: Option<&Tensor>, eps: Option<f64>) -> Result<Tensor> {
        let eps = eps.unwrap_or(if self.dtype() == DType::F64 { f64::EPSILON } else { f64::from(f32::EPSILON) });
        self.normalize("rms_norm", Kind::Rms, normalized_shape, weight, None, eps)
    }
}
