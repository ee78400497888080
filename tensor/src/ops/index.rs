//! Indexing by tensors: `index_select`, `embedding`, `gather`.
//!
//! Elements are moved as bytes (any dtype), in the largest contiguous pieces the layouts allow:
//! an embedding lookup copies whole rows.

use core::mem::MaybeUninit;

use crate::core::for_each_offset;
use crate::parallel::{for_each_part, threads_for};
use crate::shape::{Dims, is_contiguous, wrap_dim};
use crate::storage::lock_storages;
use crate::{DType, Result, Tensor, TensorError};

/// Bytes of output per kernel thread, at least: below twice this, a gather runs on one thread
/// (an embedding lookup for one token's row stays serial; 1024 GPT-2 rows, 3 MiB, split).
const GRAIN_BYTES: usize = 256 << 10;

/// Byte offset of element offset `off` (a multiple of a block for quantised dtypes).
fn byte_offset(dtype: DType, off: usize) -> usize {
    off / dtype.block_len() * dtype.block_bytes()
}

impl Tensor {
    /// The values of an integer index tensor, checked to lie in `0..size`.
    fn index_values(&self, op: &'static str, index: &Tensor, dim: usize) -> Result<Vec<i64>> {
        if !(index.dtype().is_integer()) {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: index.dtype(),
                shape: index.sizes().to_vec(),
                hint: "indices must be an integer tensor (i64, i32, ...)",
            });
        }
        let values = index.to_dtype(DType::I64)?.to_vec::<i64>()?;
        let size = self.sizes()[dim];
        if let Some(&bad) = values.iter().find(|&&v| v < 0 || v as u64 >= size as u64) {
            return Err(TensorError::IndexValue { op, index: bad, dim, size, shape: self.sizes().to_vec() });
        }
        Ok(values)
    }

    /// The slices of `self` along `dim` at the positions in `index` (a 1-D or 0-d integer
    /// tensor), in order (`torch.index_select`): the result has `index.numel()` entries along
    /// `dim` and is contiguous. Quantised tensors can be indexed along any but the last
    /// dimension (whole blocks move).
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32)?.view(&[3, 4])?;
    /// let idx = Tensor::from_vec(vec![2i64, 0, 2], &[3], DType::I64)?;
    /// assert_eq!(x.index_select(0, &idx)?.to_vec::<f32>()?, [8., 9., 10., 11., 0., 1., 2., 3., 8., 9., 10., 11.]);
    /// assert_eq!(x.index_select(1, &idx)?.sizes(), [3, 3]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`]; [`TensorError::BadShape`] for an index of more than one
    /// dimension; [`TensorError::UnsupportedDType`] for a non-integer index (or the last
    /// dimension of a quantised tensor); [`TensorError::IndexValue`] naming the first index out
    /// of `0..size`; [`TensorError::Alloc`].
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        self.index_select_as("index_select", dim, index)
    }

    /// [`index_select`](Self::index_select), its errors naming `op`.
    fn index_select_as(&self, op: &'static str, dim: isize, index: &Tensor) -> Result<Tensor> {
        if self.dim() == 0 {
            return Err(TensorError::DimOutOfRange { op, dim, shape: vec![], positions: 0 });
        }
        let d = wrap_dim(op, dim, self.sizes())?;
        if index.dim() > 1 {
            return Err(TensorError::BadShape {
                op,
                shape: index.sizes().to_vec(),
                target: vec![],
                reason: "the index must have one dimension (or none)",
            });
        }
        if self.dtype().is_quantized() && d + 1 == self.dim() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: "a quantised tensor is indexed by whole blocks: not along its last dimension",
            });
        }
        let values = self.index_values(op, index, d)?;
        let mut shape = Dims::from_slice(self.sizes());
        shape[d] = values.len();
        // SAFETY: the loop below writes every element (every outer position, every index, the
        // whole inner block), or nothing is returned.
        let out = unsafe { Tensor::output(op, &shape, self.dtype(), self) }?;
        if out.numel() == 0 {
            return Ok(out);
        }
        self.host_ready(op)?;
        let _g = lock_storages(op, None, &[self.storage()])?;
        let dtype = self.dtype();
        let (outer, inner) = (&self.sizes()[..d], &self.sizes()[d + 1..]);
        let (outer_st, inner_st) = (&self.strides()[..d], &self.strides()[d + 1..]);
        let inner_n: usize = inner.iter().product();
        let unit = dtype.element_size().unwrap_or(0);
        let inner_bytes = dtype.size_of(inner_n).unwrap_or(0);
        let inner_contiguous = is_contiguous(inner, inner_st);
        let (src, dst) = (self.data_ptr() as *const u8, out.data_ptr());
        let out_bytes = values.len() * inner_bytes;
        if outer.is_empty() && inner_contiguous {
            // Whole rows of the first dimension (an embedding lookup), split across the kernel
            // threads by output rows when there are enough of them.
            let stride = self.strides()[0];
            // SAFETY: the view's rows `0..sizes[0]` (at least one: an index was in range) start
            // `stride` elements apart from `src` and hold `inner_bytes` each, inside the storage,
            // which is read-locked and is not `out`. `out` is fresh: `out_bytes` bytes that
            // nothing else refers to, each written below before `out` is returned.
            let (from, to) = unsafe {
                (
                    core::slice::from_raw_parts(src, byte_offset(dtype, (self.sizes()[0] - 1) * stride) + inner_bytes),
                    core::slice::from_raw_parts_mut(dst as *mut MaybeUninit<u8>, out_bytes),
                )
            };
            let pieces = threads_for(out_bytes, GRAIN_BYTES).min(out_bytes / GRAIN_BYTES).max(1);
            for_each_part(to, pieces, inner_bytes, |first, part| {
                for (k, row) in part.chunks_mut(inner_bytes).enumerate() {
                    let at = byte_offset(dtype, values[first / inner_bytes + k] as usize * stride);
                    for (d, &v) in row.iter_mut().zip(&from[at..at + inner_bytes]) {
                        d.write(v);
                    }
                }
            });
            return Ok(out);
        }
        let mut row = 0usize;
        for_each_offset(outer, outer_st, |o| {
            for &i in &values {
                let base = o + i as usize * self.strides()[d];
                // SAFETY: `base` is the offset of element (outer, i, 0...) of `self` (i checked
                // in range), `row` counts the output's rows of `inner_bytes`, which is fresh and
                // holds exactly all of them.
                unsafe {
                    let to = dst.add(row * inner_bytes);
                    if inner_contiguous {
                        core::ptr::copy_nonoverlapping(src.add(byte_offset(dtype, base)), to, inner_bytes);
                    } else {
                        // Plain dtypes only (quantised rows are whole blocks, contiguous).
                        let mut k = 0;
                        for_each_offset(inner, inner_st, |e| {
                            core::ptr::copy_nonoverlapping(src.add((base + e) * unit), to.add(k * unit), unit);
                            k += 1;
                        });
                    }
                }
                row += 1;
            }
        });
        Ok(out)
    }

    /// Rows of this weight matrix (`[vocabulary, dim]`) picked by `indices` of any shape
    /// (`F.embedding(indices, weight)`): the result is `indices.shape + [dim]`.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let wte = Tensor::arange(0.0, 8.0, 1.0, DType::F32)?.view(&[4, 2])?;
    /// let ids = Tensor::from_vec(vec![3i32, 1, 1, 0], &[2, 2], DType::I32)?;
    /// let e = wte.embedding(&ids)?;
    /// assert_eq!(e.sizes(), [2, 2, 2]);
    /// assert_eq!(e.to_vec::<f32>()?, [6., 7., 2., 3., 2., 3., 0., 1.]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::BadShape`] unless the weight has two dimensions; as
    /// [`index_select`](Self::index_select) otherwise.
    pub fn embedding(&self, indices: &Tensor) -> Result<Tensor> {
        let op = "embedding";
        if self.dim() != 2 {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: vec![],
                reason: "the embedding weight must have two dimensions: [vocabulary, dim]",
            });
        }
        let flat = indices.reshape(&[-1])?;
        let rows = self.index_select_as(op, 0, &flat)?;
        let mut shape = indices.sizes().to_vec();
        shape.push(self.sizes()[1]);
        rows.view_as(op, &shape)
    }

    /// `out[p] = self[p with p[dim] replaced by index[p]]` for every position `p` of `index`
    /// (`torch.gather`): `index` has as many dimensions as `self`, and no larger size than
    /// `self` in the other dimensions; the result has `index`'s shape.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2., 3., 4.], &[2, 2], DType::F32)?;
    /// let idx = Tensor::from_vec(vec![0i64, 0, 1, 0], &[2, 2], DType::I64)?;
    /// assert_eq!(x.gather(1, &idx)?.to_vec::<f32>()?, [1., 1., 4., 3.]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`]; [`TensorError::BadShape`] when the shapes do not fit;
    /// [`TensorError::UnsupportedDType`] for a non-integer index or a quantised tensor;
    /// [`TensorError::IndexValue`].
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let op = "gather";
        let d = wrap_dim(op, dim, self.sizes())?;
        if self.dtype().is_quantized() {
            return Err(TensorError::quantized(op, self));
        }
        let fits = index.dim() == self.dim()
            && index.sizes().iter().zip(self.sizes()).enumerate().all(|(i, (a, b))| i == d || a <= b);
        if !fits {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: index.sizes().to_vec(),
                reason: "the index needs as many dimensions, and no larger sizes outside the gathered one",
            });
        }
        if self.dim() == 0 {
            return self.contiguous();
        }
        let values = self.index_values(op, index, d)?;
        // SAFETY: the loop writes one element per index position, all of them.
        let out = unsafe { Tensor::output(op, index.sizes(), self.dtype(), self) }?;
        if out.numel() == 0 {
            return Ok(out);
        }
        self.host_ready(op)?;
        let _g = lock_storages(op, None, &[self.storage()])?;
        let unit = self.elem_size();
        let (src, dst) = (self.data_ptr() as *const u8, out.data_ptr());
        let shape = index.sizes();
        let mut pos: Dims = smallvec::smallvec![0; shape.len()];
        for (k, &v) in values.iter().enumerate() {
            let mut off = 0;
            for (a, (&p, &st)) in pos.iter().zip(self.strides()).enumerate() {
                off += if a == d { v as usize * st } else { p * st };
            }
            // SAFETY: `pos` is a position of `index`, inside `self` in every dimension but `d`
            // (checked sizes), and `v` is in range along `d`: `off` is an element of `self`;
            // `k` indexes the fresh output's elements in row-major order.
            unsafe { core::ptr::copy_nonoverlapping(src.add(off * unit), dst.add(k * unit), unit) };
            for a in (0..shape.len()).rev() {
                pos[a] += 1;
                if pos[a] < shape[a] {
                    break;
                }
                pos[a] = 0;
            }
        }
        Ok(out)
    }
}
