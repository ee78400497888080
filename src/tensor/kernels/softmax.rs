//! `softmax`: `exp(x - max) / sum(exp(x - max))` along one dimension.
//!
//! Each row is computed in `f32` (`f64` for `f64` tensors) and rounded once into the output, as
//! PyTorch's CPU kernel does (its `opmath` type): f16 and bf16 rows are widened first, so that
//! their sums do not stall (in f16, `2048 + 1` is 2048: a 4096-element row of zeros summed in
//! f16 gave 1/2048 for each element, in bf16 1/256). The maximum and the sum run in 16
//! independent lanes and `exp` is [`vmath::exp`](crate::tensor::vmath), so that the compiler
//! vectorises every pass; the row loop is compiled for the CPU's widest vector extension, and
//! where the CPU has AVX-512 the exponentials of a row go through the blocks of
//! [`vmath::avx512`](crate::tensor::vmath::avx512), four vectors side by side (the same bits).
//! Each exponential is then multiplied by `1 / sum`, as PyTorch's kernel does: one division a
//! row instead of one an element, and PyTorch's two roundings. On the 12x256x256 attention
//! scores of a GPT-2 block (Emerald Rapids, 1 thread, medians of 12 alternated runs), the
//! blocks and the product took f32 softmax from 0.63 to 0.51 ms and bf16 from 0.80 to 0.68.

use core::any::TypeId;
use core::mem::MaybeUninit;

use crate::tensor::dtype::match_float;
use crate::tensor::iter::GRAIN;
use crate::tensor::num::{Float, Num, Opmath};
use crate::tensor::parallel::{for_each_part, threads_for};
use crate::tensor::storage::lock_storages;
use crate::tensor::{Result, Tensor, TensorError};

use super::isa::{self, vectorised};
use super::lanes;
use super::switch::avx512_blocks_enabled;

/// Rows up to this long keep their exponentials in a scratch row (64 KiB of f32, in L2);
/// longer ones compute each exponential twice rather than allocate scratch as large as the row.
const SCRATCH: usize = 16 << 10;

/// One row, with `tmp` as scratch (see [`SCRATCH`]); `blocks`: the exponentials of an `f32`
/// scratch row go through the AVX-512 blocks ([`exp_in_place`]).
#[inline(always)]
fn row<T: Opmath>(src: &[T], dst: &mut [MaybeUninit<T>], tmp: &mut [T::C], blocks: bool) {
    // NaN anywhere makes the maximum NaN, and with it the whole row, as in PyTorch.
    let m = lanes(src, T::C::LOWEST, T::to_op, Num::maximum);
    let e = |x: T| Float::exp(Num::sub(x.to_op(), m));
    if let Some(tmp) = tmp.get_mut(..src.len()) {
        if blocks {
            for (t, &x) in tmp.iter_mut().zip(src) {
                *t = Num::sub(x.to_op(), m);
            }
            exp_in_place(tmp);
        } else {
            for (t, &x) in tmp.iter_mut().zip(src) {
                *t = e(x);
            }
        }
        let scale = Float::div(T::C::ONE, lanes(tmp, T::C::ZERO, |v| v, Num::add));
        for (d, &v) in dst.iter_mut().zip(tmp.iter()) {
            d.write(T::from_op(Num::mul(v, scale)));
        }
    } else {
        let scale = Float::div(T::C::ONE, lanes(src, T::C::ZERO, e, Num::add));
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(T::from_op(Num::mul(e(x), scale)));
        }
    }
}

/// `tmp[i] = e^tmp[i]`, through the AVX-512 blocks of
/// [`vmath::avx512`](crate::tensor::vmath::avx512) (four vectors side by side, the same bits as
/// [`Float::exp`]); only for `f32` scratch, where the CPU has AVX-512 and the blocks are on
/// (the `blocks` of [`row`]).
#[inline(always)]
fn exp_in_place<C: Float>(tmp: &mut [C]) {
    #[cfg(target_arch = "x86_64")]
    if TypeId::of::<C>() == TypeId::of::<f32>() {
        use crate::tensor::vmath::{Func, avx512};
        // SAFETY: `C` is `f32`, so `tmp` is `tmp.len()` readable and writable `f32`s, read and
        // written in place; `row` is told `blocks` only where the CPU has AVX-512 F, BW and VL
        // (`avx512_blocks_enabled`).
        unsafe { avx512::run(Func::Exp, tmp.as_ptr().cast(), tmp.as_mut_ptr().cast(), tmp.len()) };
        return;
    }
    for t in tmp {
        *t = Float::exp(*t);
    }
}

/// Every row of `len` elements of `src` into `dst`, split across the kernel threads by rows.
fn rows<T: Opmath>(src: &[T], dst: &mut [MaybeUninit<T>], len: usize) {
    // f32 scratch rows (f16, bf16 and f32 tensors) take the AVX-512 blocks for their
    // exponentials where they are on.
    let blocks = TypeId::of::<T::C>() == TypeId::of::<f32>() && avx512_blocks_enabled();
    let run = |first: usize, part: &mut [MaybeUninit<T>]| {
        let mut tmp = vec![T::C::ZERO; len.min(SCRATCH)];
        vectorised!(isa::detected(), {
            for (s, d) in src[first..first + part.len()].chunks(len).zip(part.chunks_mut(len)) {
                row(s, d, &mut tmp, blocks);
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
    /// use tensormem::tensor::{DType, Tensor};
    ///
    /// let x = Tensor::zeros(&[2, 4096], DType::BF16)?;
    /// let p = x.softmax(-1)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
    /// assert!(p.iter().all(|&v| v == 1.0 / 4096.0));
    /// # Ok::<(), tensormem::tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for non-float tensors; [`TensorError::DimOutOfRange`].
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        let op = "softmax";
        if !self.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: "softmax needs a floating-point tensor; convert with to_dtype first",
            });
        }
        if self.dim() == 0 {
            // One element, its own row: 1, or NaN for an infinity or NaN, as in PyTorch.
            self.wrap_dim(op, dim)?;
            return self.unsqueeze(0)?.softmax(0)?.squeeze_dim(0);
        }
        let d = self.wrap_dim(op, dim)?;
        let x = self.movedim(d as isize, -1)?.contiguous()?;
        let len = self.sizes()[d];
        // SAFETY: every row of `y` is written below.
        let y = unsafe { Tensor::output(op, x.sizes(), self.dtype(), self) }?;
        x.host_ready(op)?;
        let _g = lock_storages(None, &[x.storage()]);
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
                rows::<T>(src, dst, len)
            }, _ => {});
        }
        drop(_g);
        // Put `dim` back where it was.
        y.movedim(-1, d as isize)?.contiguous()
    }
}
