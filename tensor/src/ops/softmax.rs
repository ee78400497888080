//! `softmax`: `exp(x - max) / sum(exp(x - max))` along one dimension, and `log_softmax`.
//!
//! Each row is computed in `f32` (`f64` for `f64` tensors) and rounded once into the output, as
//! PyTorch's CPU kernel does (its `opmath` type): f16 and bf16 rows are widened first, so that
//! their sums do not stall (in f16, `2048 + 1` is 2048: a 4096-element row of zeros summed in
//! f16 gave 1/2048 for each element, in bf16 1/256). The maximum and the sum run in 16
//! independent lanes and `exp` is [`vmath::exp`](crate::vmath), so that the compiler
//! vectorises every pass; the row loop is compiled for the CPU's widest vector extension, and
//! where the CPU has AVX-512 or AVX2 the exponentials of a row go through the blocks of
//! [`vmath::blocks`], four vectors side by side (the same bits).
//! Each exponential is then multiplied by `1 / sum`, as PyTorch's kernel does: one division a
//! row instead of one an element, and PyTorch's two roundings. bf16 rows are rounded 32 at a
//! time by `vcvtne2ps2bf16` where the CPU has AVX512-BF16 (the same bits). Each of these
//! shortened softmax of a GPT-2 block's attention scores (`docs/reductions.md`).
//! f16 rows (up to [`F32_ROWS_MAX`](super::f16c::F32_ROWS_MAX) long) are widened by F16C into
//! an f32 scratch row, computed as f32 rows, and rounded back by F16C: the same bits as
//! converting each value in the loops, in less time.
//!
//! `log_softmax` is `(x - max) - ln(sum(exp(x - max)))`, in that order (PyTorch's: adding `max`
//! and the logarithm first loses the differences when the inputs are large and close), with
//! the same maximum, exponentials and sum as `softmax`, each element rounded once. PyTorch's
//! CPU kernel along the last dimension rounds the sum and its logarithm to a bf16 or f16
//! tensor's dtype before the subtraction (along other dimensions it does not, nor does its CUDA
//! kernel); here they stay in `f32` along every dimension, so a half-precision result can be
//! an ulp closer to the exact value than PyTorch's.

use core::any::TypeId;
use core::mem::MaybeUninit;

use crate::dtype::match_float;
use crate::iter::GRAIN;
use crate::num::{Float, Num, Opmath};
use crate::parallel::{for_each_part, threads_for};
use crate::storage::lock_storages;
use crate::{Result, Tensor, TensorError};

use super::f16c;
use super::isa::{self, vectorised};
use super::lanes;
use super::switch::avx512_blocks_enabled;
use crate::vmath::{self, BlocksRun, Func};

/// Whether the CPU has AVX512-BF16's rounding, for [`Route::BlocksBf16`].
fn bf16_conversion() -> bool {
    #[cfg(target_arch = "x86_64")]
    let has = crate::vmath::avx512::bf16_conversion();
    #[cfg(not(target_arch = "x86_64"))]
    let has = false;
    has
}

/// Rows up to this long keep their exponentials in a scratch row (64 KiB of f32, in L2).
/// Longer rows compute them in the one-vector loop, which sums them as it computes them: f32
/// and f64 rows keep them in the output and scale it in place (faster than computing each
/// twice); f16 and bf16 rows compute each twice rather than allocate scratch as large as the
/// row. Taking such rows a part at a time through the AVX-512 blocks (`x - max` into the
/// scratch row, the blocks, then the sum) was slower than the loop (`docs/reductions.md`).
const SCRATCH: usize = 16 << 10;

/// How [`row`] and [`log_row`] compute a row that fits the scratch row, each way with the same
/// bits.
#[derive(Clone, Copy)]
enum Route {
    /// Every pass a loop the compiler vectorises.
    Loops,
    /// The exponentials of an `f32` scratch row through the AVX-512 or AVX2 blocks
    /// ([`exp_in_place`]), by the function [`vmath::blocks`] gave.
    Blocks(BlocksRun),
    /// As `Blocks`, for bf16 rows on a CPU with AVX512-BF16: the results are multiplied in
    /// the scratch row, then rounded 32 at a time by `vcvtne2ps2bf16`
    /// ([`narrow_bf16`](crate::vmath::avx512::narrow_bf16)).
    BlocksBf16(BlocksRun),
}

/// One row of `softmax`, with `tmp` as scratch (see [`SCRATCH`]), by `route`.
#[inline(always)]
fn row<T: Opmath>(src: &[T], dst: &mut [MaybeUninit<T>], tmp: &mut [T::C], route: Route) {
    // NaN anywhere makes the maximum NaN, and with it the whole row, as in PyTorch.
    let m = lanes(src, T::C::LOWEST, T::to_op, Num::maximum);
    let e = |x: T| Float::exp(Num::sub(x.to_op(), m));
    if let Some(tmp) = tmp.get_mut(..src.len()) {
        match route {
            Route::Loops => {
                for (t, &x) in tmp.iter_mut().zip(src) {
                    *t = e(x);
                }
            }
            Route::Blocks(run) | Route::BlocksBf16(run) => exp_shifted(src, m, tmp, run),
        }
        let scale = Float::div(T::C::ONE, lanes(tmp, T::C::ZERO, |v| v, Num::add));
        if matches!(route, Route::BlocksBf16(_)) {
            for v in tmp.iter_mut() {
                *v = Num::mul(*v, scale);
            }
            narrow_bf16(tmp, dst);
            return;
        }
        for (d, &v) in dst.iter_mut().zip(tmp.iter()) {
            d.write(T::from_op(Num::mul(v, scale)));
        }
    } else if TypeId::of::<T>() == TypeId::of::<T::C>() {
        // f32 and f64: the exponentials kept in `dst` itself (exactly: `T` is the type they
        // are computed in), summed there, and scaled in place, as PyTorch's kernel does,
        // instead of computed twice; the same values summed in the same order.
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(T::from_op(e(x)));
        }
        let sum = {
            // SAFETY: every element of `dst` was written just above, and `MaybeUninit<T>` has
            // `T`'s layout; the shared view ends before `dst` is written again.
            let written = unsafe { &*(dst as *const [MaybeUninit<T>] as *const [T]) };
            lanes(written, T::C::ZERO, T::to_op, Num::add)
        };
        let scale = Float::div(T::C::ONE, sum);
        for d in dst.iter_mut() {
            // SAFETY: written above.
            let v = unsafe { d.assume_init() };
            d.write(T::from_op(Num::mul(v.to_op(), scale)));
        }
    } else {
        let scale = Float::div(T::C::ONE, lanes(src, T::C::ZERO, e, Num::add));
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(T::from_op(Num::mul(e(x), scale)));
        }
    }
}

/// One row of `log_softmax`, with `tmp` as scratch, by `route`: `(x - max) - ln(sum)`, the sum
/// of the same exponentials as [`row`]'s (the loops route sums them as they are computed, in
/// the same lanes and order, so every route gives the same bits).
#[inline(always)]
fn log_row<T: Opmath>(src: &[T], dst: &mut [MaybeUninit<T>], tmp: &mut [T::C], route: Route) {
    let m = lanes(src, T::C::LOWEST, T::to_op, Num::maximum);
    let shifted = |x: T| Num::sub(x.to_op(), m);
    let blocks = match route {
        Route::Loops => None,
        Route::Blocks(run) | Route::BlocksBf16(run) => Some(run),
    };
    let sum = if let (Some(tmp), Some(run)) = (tmp.get_mut(..src.len()), blocks) {
        exp_shifted(src, m, tmp, run);
        let sum = lanes(tmp, T::C::ZERO, |v| v, Num::add);
        if matches!(route, Route::BlocksBf16(_)) {
            let ls = Float::ln(sum);
            for (t, &x) in tmp.iter_mut().zip(src) {
                *t = Num::sub(shifted(x), ls);
            }
            narrow_bf16(tmp, dst);
            return;
        }
        sum
    } else {
        lanes(src, T::C::ZERO, |x| Float::exp(shifted(x)), Num::add)
    };
    let ls = Float::ln(sum);
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(T::from_op(Num::sub(shifted(x), ls)));
    }
}

/// `tmp[i] = e^(src[i] - m)` for a row that fits `tmp`: the shifted row written there, then its
/// exponentials in place by `run` ([`exp_in_place`]).
#[inline(always)]
fn exp_shifted<T: Opmath>(src: &[T], m: T::C, tmp: &mut [T::C], run: BlocksRun) {
    for (t, &x) in tmp.iter_mut().zip(src) {
        *t = Num::sub(x.to_op(), m);
    }
    exp_in_place(tmp, run);
}

/// `tmp[i] = e^tmp[i]`, by `run`, the blocks [`vmath::blocks`] gave for [`Func::Exp`] (four
/// vectors side by side, the same bits as [`Float::exp`]); `rows` takes a route through here
/// only for `f32` scratch. Other types compute each element (never taken: their routes are
/// [`Route::Loops`]). Asking for the blocks here instead, with that loop as the fallback in the
/// `f32` form too, made softmax of rows too long for the scratch row (which never come here)
/// slower: the loop changed how the row loop around it was compiled.
#[inline(always)]
fn exp_in_place<C: Float>(tmp: &mut [C], run: BlocksRun) {
    if TypeId::of::<C>() == TypeId::of::<f32>() {
        // SAFETY: `C` is `f32`, so `tmp` is `tmp.len()` readable and writable `f32`s, read
        // and written in place; `run` is what `vmath::blocks` gave: what the CPU runs.
        unsafe { run(Func::Exp, tmp.as_ptr().cast(), tmp.as_mut_ptr().cast(), tmp.len()) };
    } else {
        for t in tmp {
            *t = Float::exp(*t);
        }
    }
}

/// `dst[i] = tmp[i]` rounded to `T`, for `T` bf16 and `C` `f32` on a CPU with AVX512-BF16 (the
/// [`Route::BlocksBf16`] of [`row`]): the bits of `T::from_op`, 32 at a time.
#[inline(always)]
fn narrow_bf16<T: Opmath>(tmp: &[T::C], dst: &mut [MaybeUninit<T>]) {
    #[cfg(target_arch = "x86_64")]
    if TypeId::of::<T>() == TypeId::of::<half::bf16>() && TypeId::of::<T::C>() == TypeId::of::<f32>() {
        let n = tmp.len().min(dst.len());
        // SAFETY: `T` is bf16 (a `u16`) and `T::C` is `f32` (checked above): `tmp` holds `n`
        // readable `f32`s and `dst` `n` writable bf16, in separate allocations; `rows`
        // chooses `Route::BlocksBf16` only where the CPU has AVX512-BF16, AVX-512 DQ and the
        // blocks' features (`bf16_conversion`, `avx512_blocks_enabled`).
        unsafe { crate::vmath::avx512::narrow_bf16(tmp.as_ptr().cast(), dst.as_mut_ptr().cast(), n) };
        return;
    }
    for (d, &v) in dst.iter_mut().zip(tmp) {
        d.write(T::from_op(v));
    }
}

/// Every row of `len` elements of `src` into `dst` (their `log_softmax` where `log`), split
/// across the kernel threads by rows.
fn rows<T: Opmath>(src: &[T], dst: &mut [MaybeUninit<T>], len: usize, log: bool) {
    // f32 scratch rows (f16, bf16 and f32 tensors) take the AVX-512 or AVX2 blocks for their
    // exponentials where they are on, and bf16 rows AVX512-BF16's rounding where it is there.
    let route = match vmath::blocks(Func::Exp) {
        Some(_) if TypeId::of::<T::C>() != TypeId::of::<f32>() => Route::Loops,
        Some(run)
            if TypeId::of::<T>() == TypeId::of::<half::bf16>() && avx512_blocks_enabled() && bf16_conversion() =>
        {
            Route::BlocksBf16(run)
        }
        Some(run) => Route::Blocks(run),
        None => Route::Loops,
    };
    let run = |first: usize, part: &mut [MaybeUninit<T>]| {
        let src = &src[first..first + part.len()];
        if let Some((src, part)) = f16c::f16_rows(src, part, len) {
            // f16 rows widened by F16C into f32 scratch, computed as f32 rows (the same
            // values: f16 rows compute in f32), and rounded back.
            let (mut wide, mut out) = (vec![0.0; len], vec![MaybeUninit::uninit(); len]);
            let mut tmp = vec![0.0; len.min(SCRATCH)];
            return vectorised!(isa::detected(), {
                for (s, d) in src.chunks(len).zip(part.chunks_mut(len)) {
                    f16c::widen_f16(s, &mut wide);
                    if log {
                        log_row(&wide, &mut out, &mut tmp, route);
                    } else {
                        row(&wide, &mut out, &mut tmp, route);
                    }
                    // SAFETY: `row` and `log_row` write every element of `out`.
                    unsafe { f16c::narrow_written(&out, d) };
                }
            });
        }
        let mut tmp = vec![T::C::ZERO; len.min(SCRATCH)];
        vectorised!(isa::detected(), {
            for (s, d) in src.chunks(len).zip(part.chunks_mut(len)) {
                if log {
                    log_row(s, d, &mut tmp, route);
                } else {
                    row(s, d, &mut tmp, route);
                }
            }
        });
    };
    let n = src.len();
    let threads = threads_for(n, GRAIN);
    if threads > 1 {
        for_each_part(dst, threads.min(n.div_ceil(GRAIN)), len, run);
    } else {
        run(0, dst);
    }
}

impl Tensor {
    /// `exp(x - max) / sum(exp(x - max))` along `dim` (floating-point tensors), computed in
    /// `f32` for `f16`/`bf16`/`f32` (in `f64` for `f64`) as PyTorch computes it, each
    /// exponential multiplied by `1 / sum`, and rounded once.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::zeros(&[2, 4096], DType::BF16)?;
    /// let p = x.softmax(-1)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
    /// assert!(p.iter().all(|&v| v == 1.0 / 4096.0));
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for non-float tensors; [`TensorError::DimOutOfRange`].
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_along(dim, false)
    }

    /// `(x - max) - ln(sum(exp(x - max)))` along `dim`, the logarithm of [`softmax`]
    /// (PyTorch's `log_softmax`, for log-probabilities: beam search, a sequence's score, the
    /// cross-entropy of next-token logits), without softmax's rounding to 0 far below the
    /// maximum.
    /// Computed in `f32` for `f16`/`bf16`/`f32` (in `f64` for `f64`) in PyTorch's order, and
    /// rounded once. A row holding `inf` or NaN, or only `-inf`, is NaN throughout; a `-inf`
    /// beside a finite value stays `-inf`.
    ///
    /// [`softmax`]: Tensor::softmax
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let logits = Tensor::from_vec(vec![0.0f32, 100.0, f32::NEG_INFINITY], &[3], DType::F32)?;
    /// let lp = logits.log_softmax(0)?.to_vec::<f32>()?;
    /// // softmax gives e^-100 as a subnormal of 3 significant bits (and 0 below -104): its
    /// // logarithm is -99.983 (PyTorch gives the same).
    /// assert_eq!(lp, [-100.0, 0.0, f32::NEG_INFINITY]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for non-float tensors; [`TensorError::DimOutOfRange`].
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_along(dim, true)
    }

    /// [`softmax`](Tensor::softmax), or [`log_softmax`](Tensor::log_softmax) where `log`.
    fn softmax_along(&self, dim: isize, log: bool) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        if !self.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: if log {
                    "log_softmax needs a floating-point tensor; convert with to_dtype first"
                } else {
                    "softmax needs a floating-point tensor; convert with to_dtype first"
                },
            });
        }
        if self.dim() == 0 {
            // One element, its own row: 1 (0 for log_softmax), or NaN for an infinity or NaN,
            // as in PyTorch.
            self.wrap_dim(op, dim)?;
            return self.unsqueeze(0)?.softmax_along(0, log)?.squeeze_dim(0);
        }
        let d = self.wrap_dim(op, dim)?;
        let x = self.movedim(d as isize, -1)?.contiguous()?;
        let len = self.sizes()[d];
        // SAFETY: every row of `y` is written below.
        let y = unsafe { Tensor::output(op, x.sizes(), self.dtype(), self) }?;
        x.host_ready(op)?;
        let _g = lock_storages(op, None, &[x.storage()])?;
        let n = x.numel();
        if len > 0 {
            match_float!(self.dtype(), T => {
                // SAFETY: `x` is contiguous with `n` elements of `T`, read-locked; `y` is a
                // fresh, separate allocation of `n` elements of `T`, written through
                // `MaybeUninit`.
                let (src, dst) = unsafe {
                    (
                        core::slice::from_raw_parts(x.data_ptr() as *const T, n),
                        core::slice::from_raw_parts_mut(y.data_ptr() as *mut MaybeUninit<T>, n),
                    )
                };
                rows::<T>(src, dst, len, log)
            }, _ => {});
        }
        drop(_g);
        // Put `dim` back where it was.
        y.movedim(-1, d as isize)?.contiguous()
    }
}
