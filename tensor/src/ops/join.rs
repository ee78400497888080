//! `cat` and `stack`: joining tensors along a dimension (a KV cache grows by them).

use smallvec::SmallVec;

use crate::shape::{Dims, wrap_dim, wrap_insert_dim};
use crate::{DType, Result, Tensor, TensorError};

use super::cast::cast_into;
use super::loops::Dest;

impl Tensor {
    /// The tensors joined along `dim` (`torch.cat`): every tensor has the same number of
    /// dimensions and the same sizes except along `dim`; the result has their promoted dtype
    /// and lives in the first tensor's allocator. As in PyTorch, 1-D tensors of size 0 are
    /// skipped whatever the others' shape.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let cache = Tensor::zeros(&[2, 3, 4], DType::F32)?; // [heads, tokens, head_dim]
    /// let step = Tensor::ones(&[2, 1, 4], DType::F32)?;
    /// let grown = Tensor::cat(&[&cache, &step], 1)?;
    /// assert_eq!(grown.sizes(), [2, 4, 4]);
    /// assert_eq!(grown.get::<f32>(&[1, 3, 0])?, 1.0);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// Quantised tensors of one dtype are joined block by block, their bytes copied as they
    /// are (a quantised KV cache grows without a round trip through f32); along the last
    /// dimension, whole blocks of 32 join whole blocks.
    ///
    /// # Errors
    /// [`TensorError::BadShape`] for an empty list; [`TensorError::Mismatch`] naming the first
    /// tensor that does not fit; [`TensorError::DimOutOfRange`]; [`TensorError::NoCommonDType`]
    /// (a quantised dtype beside another dtype); [`TensorError::SizeOverflow`];
    /// [`TensorError::Alloc`].
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        Tensor::cat_as("cat", tensors, dim)
    }

    /// [`cat`](Self::cat), its errors naming `op` (`stack` is a cat).
    fn cat_as(op: &'static str, tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(TensorError::BadShape {
                op,
                shape: vec![],
                target: vec![],
                reason: "no tensors given (it needs at least one)",
            });
        };
        let parts: SmallVec<[(usize, &Tensor); 4]> =
            tensors.iter().copied().enumerate().filter(|(_, t)| !(t.dim() == 1 && t.sizes()[0] == 0)).collect();
        let mut dtype = first.dtype();
        for t in tensors {
            // A quantised dtype has a common dtype only with itself.
            if t.dtype() != dtype {
                dtype = DType::promote(dtype, t.dtype()).ok_or(TensorError::NoCommonDType {
                    op,
                    lhs: dtype,
                    rhs: t.dtype(),
                })?;
            }
        }
        let Some(&(_, reference)) = parts.first() else {
            // Only empty 1-D tensors.
            return Tensor::empty(&[0], first.options().dtype(dtype));
        };
        let d = wrap_dim(op, dim, reference.sizes())?;
        if reference.dim() == 0 {
            return Err(TensorError::DimOutOfRange { op, dim, shape: vec![], positions: 0 });
        }
        let mut total = 0usize;
        for &(index, t) in &parts {
            let fits = t.dim() == reference.dim()
                && t.sizes().iter().zip(reference.sizes()).enumerate().all(|(i, (a, b))| i == d || a == b);
            if !fits {
                return Err(TensorError::Mismatch {
                    op,
                    index,
                    shape: t.sizes().to_vec(),
                    expected: reference.sizes().to_vec(),
                    reason: "in a dimension other than the one joined along (or in the number of dimensions)",
                });
            }
            total = total.checked_add(t.sizes()[d]).ok_or_else(|| TensorError::SizeOverflow {
                op,
                shape: t.sizes().to_vec(),
                dtype,
            })?;
        }
        let mut shape = Dims::from_slice(reference.sizes());
        shape[d] = total;
        // SAFETY: the copies below write every element: the narrows are consecutive along `d`
        // and their sizes sum to `total`. On an error, `out` is dropped unread.
        let out = unsafe { Tensor::output(op, &shape, dtype, first) }?;
        if out.numel() == 0 {
            return Ok(out); // nothing to copy, whatever the sizes
        }
        let mut at = 0;
        for &(_, t) in &parts {
            let n = t.sizes()[d];
            if n > 0 {
                cast_into(op, &out.narrow(d as isize, at as isize, n)?, t, Dest::Into)?;
            }
            at += n;
        }
        Ok(out)
    }

    /// The tensors stacked along a new dimension `dim` (`torch.stack`): all of the same shape.
    ///
    /// # Errors
    /// As [`cat`](Self::cat); [`TensorError::Mismatch`] when shapes differ;
    /// [`TensorError::UnsupportedDType`] for quantised tensors stacked along a new last
    /// dimension.
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let op = "stack";
        let Some(first) = tensors.first() else {
            return Err(TensorError::BadShape {
                op,
                shape: vec![],
                target: vec![],
                reason: "no tensors given (it needs at least one)",
            });
        };
        let d = wrap_insert_dim(op, dim, first.sizes())?;
        if first.dtype().is_quantized() && d == first.dim() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: first.dtype(),
                shape: first.sizes().to_vec(),
                hint: "a new last dimension would split the blocks of 32: stack along an earlier one, or dequantize first",
            });
        }
        let mut unsqueezed = Vec::with_capacity(tensors.len());
        for (index, t) in tensors.iter().enumerate() {
            if t.sizes() != first.sizes() {
                return Err(TensorError::Mismatch {
                    op,
                    index,
                    shape: t.sizes().to_vec(),
                    expected: first.sizes().to_vec(),
                    reason: "(stack needs tensors of equal shape)",
                });
            }
            unsqueezed.push(t.unsqueeze_as(op, d as isize)?);
        }
        let refs: Vec<&Tensor> = unsqueezed.iter().collect();
        Tensor::cat_as(op, &refs, d as isize)
    }
}
