//! Reductions (`sum`, `mean`, `max`, `min`, `argmax`, over everything or one dimension).
//!
//! A contiguous tensor reduced along a dimension that is not innermost is read in place, its
//! rows added into a row of accumulators ([`columns`]). Otherwise the reduced dimension is
//! moved innermost (a view, then `contiguous()`, which copies only when it was not already
//! innermost), so the reduction reads contiguous rows; the extremes and argmax of rows are
//! [`extreme`]'s. Float sums of rows add [`SUM_LANES`] independent lanes (which the compiler
//! vectorises, compiled for the CPU's widest vector extension) in blocks of [`BLOCK`] and
//! gather the blocks in `f64`; f16 and bf16 values are widened as they are read, so their sum
//! is the f32 sum of the widened values, bit for bit, on every CPU. Integer and bool sums give
//! `i64`, as in PyTorch. Large inputs are split over rows, or within a row, across rayon's
//! threads: integer results are the same either way, float results differ only in rounding
//! (the column path's do not differ at all).

use crate::dtype::{match_float, match_integer};
use crate::halfconv::HalfFloat;
use crate::iter::GRAIN;
use crate::num::{Num, Opmath};
use crate::shape::Dims;
use crate::storage::lock_storages;
use crate::{DType, Element, Result, Tensor, TensorError};

use super::columns::{self, Columns, reduce_columns};
use super::extreme::{self, Mapped, better};
use super::f16c;
use super::isa::{self, vectorised};
use super::lanes;

/// Independent `f32` accumulators of the float sums: four AVX-512 vectors (eight AVX2 ones),
/// so that each step's additions are four independent chains. With one vector of 16 lanes,
/// each addition waits on the last one's latency (`docs/reductions.md`).
pub(super) const SUM_LANES: usize = 64;

/// Elements summed in `f32` lanes before the partial sum moves to `f64`: 256 additions per
/// lane.
const BLOCK: usize = 256 * SUM_LANES;

/// The `f64` sum of a block's lanes, folded into 8 lanes first (vectorised, where one running
/// sum of 64 was a chain of 64 dependent additions per block).
#[inline(always)]
fn gather(acc: &[f32; SUM_LANES]) -> f64 {
    let mut s = [0f64; 8];
    for c in acc.chunks_exact(8) {
        for k in 0..8 {
            s[k] += f64::from(c[k]);
        }
    }
    s.iter().sum()
}

/// Sums in `f64` with vectorisable lanes of `T` values converted by `to`.
trait SumAcc: Element {
    fn sum_slice(x: &[Self]) -> Self::Acc;
    type Acc: Copy + Send + core::ops::Add<Output = Self::Acc> + Default;
}

/// The float sum of `x`'s values widened to `f32` by `to`: [`SUM_LANES`] lanes per block of
/// [`BLOCK`], the blocks' sums added in `f64`.
#[inline(always)]
pub(super) fn lanes_f32<T: Copy>(x: &[T], to: impl Fn(T) -> f32) -> f64 {
    let mut total = 0f64;
    for block in x.chunks(BLOCK) {
        let mut acc = [0f32; SUM_LANES];
        let chunks = block.chunks_exact(SUM_LANES);
        let rem = chunks.remainder();
        for c in chunks {
            for k in 0..SUM_LANES {
                acc[k] += to(c[k]);
            }
        }
        total += gather(&acc) + rem.iter().map(|&v| to(v) as f64).sum::<f64>();
    }
    total
}

impl SumAcc for f32 {
    type Acc = f64;
    fn sum_slice(x: &[f32]) -> f64 {
        vectorised!(isa::detected(), lanes_f32(x, |v| v))
    }
}
impl SumAcc for f64 {
    type Acc = f64;
    fn sum_slice(x: &[f64]) -> f64 {
        lanes(x, 0.0, |v| v, |a, b| a + b)
    }
}
impl SumAcc for half::bf16 {
    type Acc = f64;
    fn sum_slice(x: &[half::bf16]) -> f64 {
        // The widening (a shift) fused into the lanes.
        vectorised!(isa::detected(), lanes_f32(x, HalfFloat::widen))
    }
}
impl SumAcc for half::f16 {
    type Acc = f64;
    fn sum_slice(x: &[half::f16]) -> f64 {
        if f16c::has_f16c() {
            // `lanes_f32` of the widened block, with the widening fused into the lanes.
            return x
                .chunks(BLOCK)
                .map(|c| {
                    let mut acc = [0f32; SUM_LANES];
                    let done = f16c::sum_lanes_f16(c, &mut acc);
                    gather(&acc) + c[done..].iter().map(|v| v.widen() as f64).sum::<f64>()
                })
                .sum();
        }
        lanes_f32(x, HalfFloat::widen)
    }
}
macro_rules! int_sum {
    ($($t:ty),*) => {$(
        impl SumAcc for $t {
            type Acc = i64;
            fn sum_slice(x: &[$t]) -> i64 {
                x.iter().fold(0i64, |a, &v| a.wrapping_add(v as i64))
            }
        }
    )*};
}
int_sum!(u8, i8, i16, i32, i64);
impl SumAcc for bool {
    type Acc = i64;
    fn sum_slice(x: &[bool]) -> i64 {
        x.iter().map(|&v| v as i64).sum()
    }
}

/// How a reduction reads its input.
enum Lines {
    /// Contiguous rows of this length, the lines along the reduced dimension (or one row of
    /// everything).
    Rows(usize),
    /// The reduced dimension in place, not innermost ([`columns`]).
    Columns(Columns),
}

impl Lines {
    /// The number of values each output reduces.
    fn len(&self) -> usize {
        match self {
            Lines::Rows(len) => *len,
            Lines::Columns(c) => c.len,
        }
    }
}

/// The tensor to read (contiguous), how to read it, and the output's shape. A dimension that
/// is not innermost is reduced in place where [`Columns::of`] takes it, else moved innermost
/// (a view, then `contiguous()`, which copies).
fn lines_of(t: &Tensor, op: &'static str, dim: Option<isize>, keepdim: bool) -> Result<(Tensor, Lines, Dims)> {
    if t.dtype().is_quantized() {
        return Err(TensorError::quantized(op, t));
    }
    match dim {
        None => Ok((t.contiguous()?, Lines::Rows(t.numel()), Dims::new())),
        Some(dim) => {
            let d = t.wrap_dim(op, dim)?;
            if t.dim() == 0 {
                return Ok((t.clone(), Lines::Rows(1), Dims::new()));
            }
            let mut out = Dims::from_slice(t.sizes());
            if keepdim {
                out[d] = 1;
            } else {
                out.remove(d);
            }
            if let Some(c) = Columns::of(t, d) {
                return Ok((t.clone(), Lines::Columns(c), out));
            }
            let x = t.movedim(d as isize, -1)?.contiguous()?;
            Ok((x, Lines::Rows(t.sizes()[d]), out))
        }
    }
}

/// Reduces each row of `x` (contiguous `T`, rows of `len`) to one `O` in `out`:
/// `finish(combine(fold(piece, start)...))`, pieces in order.
fn reduce_rows<T, A, O>(
    x: &Tensor,
    len: usize,
    out: &Tensor,
    fold: impl Fn(&[T], usize) -> A + Sync,
    combine: impl Fn(A, A) -> A + Sync,
    finish: impl Fn(A, usize) -> O + Sync,
) -> Result<()>
where
    T: Element,
    A: Send,
    O: Element,
{
    x.host_ready("reduction")?;
    let _g = lock_storages("reduction", None, &[x.storage()])?;
    let rows = out.numel();
    // SAFETY: `x` is contiguous with `rows * len` elements of `T` (its dtype) inside its
    // materialised storage, read-locked; `out` is a fresh allocation of `rows` elements of
    // `O` (its dtype) that nothing else refers to, written through `MaybeUninit`.
    let (data, dst) = unsafe {
        (
            core::slice::from_raw_parts(x.data_ptr() as *const T, rows * len),
            core::slice::from_raw_parts_mut(out.data_ptr() as *mut core::mem::MaybeUninit<O>, rows),
        )
    };
    let threads = crate::parallel::threads_for(rows * len, GRAIN);
    let row = |r: usize| &data[r * len..(r + 1) * len];
    if threads > 1 && rows == 1 {
        let pieces = threads.min(len.div_ceil(GRAIN));
        let parts: Vec<A> = crate::parallel::map_pieces(pieces, |p| {
            let (s, e) = (len * p / pieces, len * (p + 1) / pieces);
            fold(&data[s..e], s)
        });
        let acc = parts.into_iter().reduce(&combine);
        if let Some(acc) = acc {
            dst[0].write(finish(acc, len));
        }
    } else if threads > 1 {
        let pieces = threads.min((rows * len).div_ceil(GRAIN));
        crate::parallel::for_each_part(dst, pieces, 1, |first, part| {
            for (k, o) in part.iter_mut().enumerate() {
                o.write(finish(fold(row(first + k), 0), len));
            }
        });
    } else {
        for (r, o) in dst.iter_mut().enumerate() {
            o.write(finish(fold(row(r), 0), len));
        }
    }
    Ok(())
}

/// [`Num::maximum`] where `is_max`, else [`Num::minimum`].
#[inline(always)]
fn extreme_of<V: Num>(is_max: bool) -> impl Fn(V, V) -> V + Copy + Sync {
    move |a, b| if is_max { Num::maximum(a, b) } else { Num::minimum(a, b) }
}

/// [`extreme_of`] for the pieces of a row: of equal zeros, +0 is the maximum and -0 the
/// minimum, as within a piece (`extreme::row_extreme`).
fn pieces_extreme<V: Num>(is_max: bool) -> impl Fn(V, V) -> V + Copy + Sync {
    move |a, b| {
        let positive = |v: V| v.to_f64().is_sign_positive();
        if a == b && positive(a) != positive(b) {
            return if is_max == positive(a) { a } else { b };
        }
        extreme_of(is_max)(a, b)
    }
}

/// The argmax of each row of `x` (rows of `len`) into `out`, `first(row)` the index of a row's
/// (or a piece's) first maximum.
fn argmax_rows<T: Num>(x: &Tensor, len: usize, out: &Tensor, first: impl Fn(&[T]) -> usize + Sync) -> Result<()> {
    let fold = |r: &[T], start: usize| {
        let i = first(r);
        (r[i], start + i)
    };
    // Pieces in order: a later piece's maximum wins only where it is better.
    let combine = |a: (T, usize), b: (T, usize)| if better(b.0, a.0) { b } else { a };
    reduce_rows(x, len, out, fold, combine, |a, _| a.1 as i64)
}

fn check_nonempty(t: &Tensor, op: &'static str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(TensorError::BadShape {
            op,
            shape: t.sizes().to_vec(),
            target: vec![],
            reason: "cannot reduce over zero elements: the operation has no identity",
        });
    }
    Ok(())
}

impl Tensor {
    fn sum_impl(&self, op: &'static str, dim: Option<isize>, keepdim: bool, mean: bool) -> Result<Tensor> {
        let (x, lines, shape) = lines_of(self, op, dim, keepdim)?;
        if mean && !self.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: "mean needs a floating-point tensor; convert with to_dtype first",
            });
        }
        let out_dtype = if self.dtype().is_floating_point() { self.dtype() } else { DType::I64 };
        // SAFETY: `reduce_rows` and `reduce_columns` write every output element.
        let out = unsafe { Tensor::output(op, &shape, out_dtype, self) }?;
        let len = match lines {
            Lines::Rows(len) => len,
            Lines::Columns(c) => {
                // In the compute type (f32 for halves), blocks of rows moved to f64.
                let n = c.len as f64;
                if self.dtype() == DType::F16 && f16c::has_f16c() {
                    // Widened by F16C in the loop, four rows at a time.
                    let spill = |t: f64, a: f32| t + f64::from(a);
                    let finish = |t: f64| <half::f16 as Element>::from_f64(if mean { t / n } else { t });
                    reduce_columns(&x, c, &out, |s: &columns::Segments<'_, half::f16>, dst| {
                        vectorised!(isa::detected(), columns::sum(s, dst, (0f32, 0f64), columns::F16c, spill, finish))
                    })?
                } else if self.dtype().is_floating_point() {
                    match_float!(self.dtype(), T => {
                        type C = <T as Opmath>::C;
                        let spill = |t: f64, a: C| t + a.to_f64();
                        let finish = |t: f64| T::from_f64(if mean { t / n } else { t });
                        reduce_columns(&x, c, &out, |s, dst| vectorised!(isa::detected(),
                            columns::sum(s, dst, (C::ZERO, 0f64), columns::Mapped { map: T::to_op, add: Num::add }, spill, finish)))?
                    }, _ => {});
                } else {
                    match_integer!(self.dtype(), T => {
                        let widen = |v: T| v.to_i64();
                        reduce_columns(&x, c, &out, |s, dst| vectorised!(isa::detected(),
                            columns::sum(s, dst, (0i64, 0i64), columns::Mapped { map: widen, add: i64::wrapping_add }, i64::wrapping_add, |t| t)))?
                    }, _ => {});
                }
                return Ok(out);
            }
        };
        if self.dtype() == DType::Bool {
            reduce_rows(&x, len, &out, |r: &[bool], _| bool::sum_slice(r), i64::wrapping_add, |a, _| a)?;
            return Ok(out);
        }
        // A floating-point tensor sums into its own dtype, an integer one into i64: each
        // dtype is instantiated with its one output only.
        match_float!(self.dtype(), T => {
            reduce_rows(&x, len, &out, |r: &[T], _| <T as SumAcc>::sum_slice(r).to_f64(), |a, b| a + b,
                |a: f64, n| T::from_f64(if mean { a / n as f64 } else { a }))?;
        }, _ => match_integer!(self.dtype(), T => {
            reduce_rows(&x, len, &out, |r: &[T], _| <T as SumAcc>::sum_slice(r).to_i64(), i64::wrapping_add, |a, _| a)?;
        }, _ => {}));
        Ok(out)
    }

    fn extreme(&self, op: &'static str, dim: Option<isize>, keepdim: bool, is_max: bool) -> Result<Tensor> {
        let (x, lines, shape) = lines_of(self, op, dim, keepdim)?;
        check_nonempty(self, op, lines.len())?;
        // SAFETY: `reduce_rows` and `reduce_columns` write every output element.
        let out = unsafe { Tensor::output(op, &shape, self.dtype(), self) }?;
        let len = match lines {
            Lines::Rows(len) => len,
            Lines::Columns(c) => {
                // Halves compare as integer keys (`extreme::half_column_keys`); other floats
                // in their compute type, as the rows below.
                macro_rules! half_keys {
                    ($h:ty, $max:expr) => {{
                        let (start, map, fold, back) = extreme::half_column_keys::<$max, $h>();
                        reduce_columns(&x, c, &out, |s: &columns::Segments<'_, $h>, dst| {
                            vectorised!(isa::detected(), columns::extreme(s, dst, start, map, fold, back))
                        })?;
                        return Ok(out);
                    }};
                }
                match (self.dtype(), is_max) {
                    (DType::F16, true) => half_keys!(half::f16, true),
                    (DType::F16, false) => half_keys!(half::f16, false),
                    (DType::BF16, true) => half_keys!(half::bf16, true),
                    (DType::BF16, false) => half_keys!(half::bf16, false),
                    _ => {}
                }
                if self.dtype().is_floating_point() {
                    match_float!(self.dtype(), T => {
                        let start = if is_max { <T as Opmath>::C::LOWEST } else { <T as Opmath>::C::HIGHEST };
                        reduce_columns(&x, c, &out, |s, dst| vectorised!(isa::detected(),
                            columns::extreme(s, dst, start, T::to_op, extreme_of(is_max), T::from_op)))?
                    }, _ => {});
                } else {
                    match_integer!(self.dtype(), T => {
                        let start = if is_max { T::LOWEST } else { T::HIGHEST };
                        reduce_columns(&x, c, &out, |s, dst| vectorised!(isa::detected(),
                            columns::extreme(s, dst, start, |v: T| v, extreme_of(is_max), |v| v)))?
                    }, _ => {});
                }
                return Ok(out);
            }
        };
        if self.dtype() == DType::Bool {
            let f = move |r: &[bool], _| if is_max { r.iter().any(|&v| v) } else { r.iter().all(|&v| v) };
            let c = move |a: bool, b: bool| if is_max { a | b } else { a & b };
            reduce_rows(&x, len, &out, f, c, |a, _| a)?;
            return Ok(out);
        }
        // Each row's extreme in independent lanes, NaN flagged beside them
        // (`extreme::row_extreme`; f16 and bf16 rows compared as integer keys), compiled for
        // the widest extension (one running value is a chain of dependent steps, and f16 and
        // bf16 ones would also narrow and widen each: `docs/reductions.md`). Floats compare in
        // their compute type; NaN propagates, as in PyTorch.
        macro_rules! rows {
            ($t:ty, $max:expr, $min:expr, $from:expr) => {
                if is_max {
                    let f = |r: &[$t], _| $from(vectorised!(isa::detected(), ($max)(r)));
                    reduce_rows(&x, len, &out, f, pieces_extreme(true), |a, _| a)?
                } else {
                    let f = |r: &[$t], _| $from(vectorised!(isa::detected(), ($min)(r)));
                    reduce_rows(&x, len, &out, f, pieces_extreme(false), |a, _| a)?
                }
            };
        }
        if self.dtype() == DType::F16 {
            type H = half::f16;
            rows!(H, extreme::half_row_extreme::<true, H>, extreme::half_row_extreme::<false, H>, H::from_op);
        } else if self.dtype() == DType::BF16 {
            type H = half::bf16;
            rows!(H, extreme::half_row_extreme::<true, H>, extreme::half_row_extreme::<false, H>, H::from_op);
        } else if self.dtype().is_floating_point() {
            match_float!(self.dtype(), T => rows!(T,
                |row| extreme::row_extreme::<true, _>(Mapped { row, map: T::to_op }),
                |row| extreme::row_extreme::<false, _>(Mapped { row, map: T::to_op }),
                T::from_op), _ => {});
        } else {
            match_integer!(self.dtype(), T => rows!(T,
                |row| extreme::row_extreme::<true, _>(Mapped { row, map: |v: T| v }),
                |row| extreme::row_extreme::<false, _>(Mapped { row, map: |v: T| v }),
                |v: T| v), _ => {});
        }
        Ok(out)
    }

    fn argmax_impl(&self, op: &'static str, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        let (x, lines, shape) = lines_of(self, op, dim, keepdim)?;
        check_nonempty(self, op, lines.len())?;
        // SAFETY: `reduce_rows` and `reduce_columns` write every output element.
        let out = unsafe { Tensor::output(op, &shape, DType::I64, self) }?;
        let len = match lines {
            Lines::Rows(len) => len,
            Lines::Columns(c) => {
                // `Columns::of` refuses bool, which the rows below refuse with an error.
                if self.dtype().is_floating_point() {
                    match_float!(self.dtype(), T => reduce_columns(&x, c, &out, |s, dst| vectorised!(isa::detected(),
                        columns::argmax(s, dst, T::to_op)))?, _ => {});
                } else {
                    match_integer!(self.dtype(), T => reduce_columns(&x, c, &out, |s, dst| vectorised!(isa::detected(),
                        columns::argmax(s, dst, |v: T| v)))?, _ => {});
                }
                return Ok(out);
            }
        };
        // Each row's first maximum by blocks (`extreme::first_argmax`), compiled for the
        // widest extension (one running value and index were a chain of dependent compares
        // and branches, many times numpy's time: `docs/reductions.md`). Floats
        // compare in their compute type.
        if self.dtype() == DType::F16 {
            argmax_rows(&x, len, &out, |r: &[half::f16]| vectorised!(isa::detected(), extreme::f16_first_argmax(r)))?;
        } else if self.dtype().is_floating_point() {
            match_float!(self.dtype(), T => argmax_rows(&x, len, &out, |row: &[T]| vectorised!(isa::detected(),
                extreme::first_argmax(Mapped { row, map: T::to_op })))?, _ => {});
        } else {
            match_integer!(self.dtype(), T => argmax_rows(&x, len, &out, |row: &[T]| vectorised!(isa::detected(),
                extreme::first_argmax(Mapped { row, map: |v: T| v })))?,
            _ => return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: "argmax has no order for bool; convert with to_dtype(DType::U8) first",
            }));
        }
        Ok(out)
    }

    /// The sum of all elements, as a 0-d tensor (`i64` for integer and bool tensors).
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for quantised tensors.
    pub fn sum(&self) -> Result<Tensor> {
        self.sum_impl("sum", None, false, false)
    }

    /// The sums along `dim`, which is removed unless `keepdim`.
    ///
    /// # Errors
    /// As [`sum`](Self::sum); [`TensorError::DimOutOfRange`].
    pub fn sum_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.sum_impl("sum_dim", Some(dim), keepdim, false)
    }

    /// The mean of all elements (floating-point tensors; NaN when empty).
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for non-float tensors.
    pub fn mean(&self) -> Result<Tensor> {
        self.sum_impl("mean", None, false, true)
    }

    /// The means along `dim`.
    ///
    /// # Errors
    /// As [`mean`](Self::mean); [`TensorError::DimOutOfRange`].
    pub fn mean_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.sum_impl("mean_dim", Some(dim), keepdim, true)
    }

    /// The largest element (NaN if any is NaN).
    ///
    /// # Errors
    /// [`TensorError::BadShape`] for an empty tensor; [`TensorError::UnsupportedDType`].
    pub fn max(&self) -> Result<Tensor> {
        self.extreme("max", None, false, true)
    }

    /// The largest elements along `dim` (PyTorch's `amax`).
    ///
    /// # Errors
    /// As [`max`](Self::max); [`TensorError::DimOutOfRange`].
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.extreme("max_dim", Some(dim), keepdim, true)
    }

    /// The smallest element (NaN if any is NaN).
    ///
    /// # Errors
    /// As [`max`](Self::max).
    pub fn min(&self) -> Result<Tensor> {
        self.extreme("min", None, false, false)
    }

    /// The smallest elements along `dim` (PyTorch's `amin`).
    ///
    /// # Errors
    /// As [`max_dim`](Self::max_dim).
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.extreme("min_dim", Some(dim), keepdim, false)
    }

    /// The index (row-major, into the flattened tensor) of the first largest element, as a
    /// 0-d `i64` tensor.
    ///
    /// # Errors
    /// As [`max`](Self::max); bool tensors are refused.
    pub fn argmax(&self) -> Result<Tensor> {
        self.argmax_impl("argmax", None, false)
    }

    /// The indices of the first largest elements along `dim`.
    ///
    /// # Errors
    /// As [`argmax`](Self::argmax); [`TensorError::DimOutOfRange`].
    pub fn argmax_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.argmax_impl("argmax_dim", Some(dim), keepdim)
    }
}
