//! `contiguous()` and `to_dtype()`, including quantisation to and from Q8_0/Q4_0.

use crate::dtype::{cast, match_dtype};
use crate::quant::{dequantize_into, quantize_into};
use crate::storage::lock_storages;
use crate::strides::preserved_strides;
use crate::{DType, Result, Tensor, TensorError};

use super::loops::{Dest, run_unary};

/// Writes `src` (broadcast to `out`'s shape), converted to `out`'s dtype, into `out`: the one
/// copy kernel behind `contiguous`, `to_dtype`, `copy_` and `cat` (a plain copy loop when the
/// dtypes match; blocks of one quantised format are copied as their bytes).
pub(crate) fn cast_into(op: &'static str, out: &Tensor, src: &Tensor, dest: Dest) -> Result<()> {
    if out.dtype() == src.dtype() {
        if src.dtype().is_quantized() {
            // Whole blocks, copied as the bytes they are.
            return cast_into(op, &out.block_bytes(), &src.block_bytes(), dest);
        }
        return match_dtype!(src.dtype(), T => run_unary(op, out, src, dest, |x: T| x), _ => Err(TensorError::quantized(op, src)));
    }
    match_dtype!(out.dtype(), D => match_dtype!(src.dtype(), S => {
        run_unary(op, out, src, dest, |x: S| cast::<S, D>(x))
    }, _ => Err(TensorError::quantized(op, src))), _ => Err(TensorError::quantized(op, out)))
}

impl Tensor {
    /// A contiguous copy of this tensor's elements in the same allocator that shares nothing
    /// with it (even when it is contiguous already).
    pub(crate) fn fresh_copy(&self, op: &'static str) -> Result<Tensor> {
        // SAFETY: `cast_into` writes every element of `out` or fails, dropping it unread.
        let out = unsafe { Tensor::output(op, self.sizes(), self.dtype(), self) }?;
        cast_into(op, &out, self, Dest::Fresh)?;
        Ok(out)
    }
}

impl Tensor {
    /// This tensor if it is already contiguous (no copy), else a contiguous copy.
    ///
    /// A transposed input is copied through cache tiles (see the iteration engine), not
    /// element by element.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when the copy cannot be allocated.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let op = "contiguous";
        // SAFETY: `cast_into` writes every element of `out` or fails, dropping it unread.
        let out = unsafe { Tensor::output(op, self.sizes(), self.dtype(), self) }?;
        cast_into(op, &out, self, Dest::Fresh)?;
        Ok(out)
    }

    /// The tensor converted to `dtype` (this tensor, shared, when it already has that dtype).
    ///
    /// Floats to integers truncate toward zero and saturate; numbers to bool test `!= 0`;
    /// conversions go through `f64` when either side is floating point. To Q8_0/Q4_0 quantises
    /// (the last dimension must be a multiple of 32); from them dequantises.
    ///
    /// # Errors
    /// [`TensorError::BadShape`] when quantising a last dimension that is not a multiple of 32;
    /// [`TensorError::Alloc`].
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let w = Tensor::randn(&[4, 64], DType::F32)?;
    /// let q = w.to_dtype(DType::Q8_0)?;
    /// assert_eq!(q.storage().nbytes(), 4 * 2 * 34);
    /// let back = q.to_dtype(DType::F32)?;
    /// let err = w.sub(&back)?.abs()?.max()?.item::<f32>()?;
    /// assert!(err < 0.05);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let op = "to_dtype";
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if self.dtype().is_quantized() {
            let f = self.dequantize(op)?;
            return if dtype == DType::F32 { Ok(f) } else { f.to_dtype(dtype) };
        }
        if dtype.is_quantized() {
            return self.quantize(op, dtype);
        }
        // Laid out as this tensor (PyTorch's `preserve_format`).
        let strides = preserved_strides(self.sizes(), self.strides());
        // SAFETY: `cast_into` writes every element of `out` or fails, dropping it unread;
        // `preserved_strides` are dense.
        let out = unsafe { Tensor::output_strided(op, self.sizes(), strides, dtype, self) }?;
        cast_into(op, &out, self, Dest::Fresh)?;
        Ok(out)
    }

    fn quantize(&self, op: &'static str, dtype: DType) -> Result<Tensor> {
        let src = self.to_dtype(DType::F32)?.contiguous()?;
        // SAFETY: `quantize_into` writes every block of `out`.
        let out = unsafe { Tensor::output(op, self.sizes(), dtype, self) }?;
        src.host_ready(op)?;
        let _g = lock_storages(op, None, &[src.storage()])?;
        let n = src.numel();
        // SAFETY: `src` is contiguous f32 with `n` elements; `out` is a fresh allocation of
        // exactly `dtype.size_of(n)` bytes (its shape's last dimension is a multiple of 32,
        // checked by `output`), separate from `src`.
        let (values, bytes) = unsafe {
            (
                core::slice::from_raw_parts(src.data_ptr() as *const f32, n),
                core::slice::from_raw_parts_mut(out.data_ptr(), out.storage().nbytes()),
            )
        };
        quantize_into(dtype, values, bytes);
        Ok(out)
    }

    fn dequantize(&self, op: &'static str) -> Result<Tensor> {
        let src = self.contiguous()?;
        // SAFETY: `dequantize_into` writes every element of `out`.
        let out = unsafe { Tensor::output(op, self.sizes(), DType::F32, self) }?;
        src.host_ready(op)?;
        let _g = lock_storages(op, None, &[src.storage()])?;
        let n = src.numel();
        let nbytes = src.dtype().size_of(n).ok_or(TensorError::SizeOverflow {
            op,
            shape: self.sizes().to_vec(),
            dtype: self.dtype(),
        })?;
        // SAFETY: `src` is contiguous with whole blocks from its data pointer (`nbytes` bytes
        // inside its storage); `out` is a fresh f32 allocation of `n` elements.
        let (bytes, values) = unsafe {
            (
                core::slice::from_raw_parts(src.data_ptr() as *const u8, nbytes),
                core::slice::from_raw_parts_mut(out.data_ptr() as *mut f32, n),
            )
        };
        dequantize_into(src.dtype(), bytes, values);
        Ok(out)
    }
}
