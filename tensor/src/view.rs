//! Views: new sizes/strides/offset over the same storage, no copy.

use smallvec::SmallVec;

use super::core::byte_offset;
use super::shape::{
    Dims, broadcast_strides, broadcast_strides_to, checked_numel, extent, infer_size, view_strides, wrap_dim,
    wrap_index, wrap_insert_dim,
};
use super::{QUANT_BLOCK, Result, Tensor, TensorError};

impl Tensor {
    /// A view with the given layout over the same storage: its element count must fit in
    /// `usize`; quantised tensors keep whole blocks (at least one dimension, last stride 1,
    /// everything else a multiple of 32).
    fn make_view(
        &self,
        op: &'static str,
        sizes: impl Into<Dims>,
        strides: impl Into<Dims>,
        offset: usize,
    ) -> Result<Tensor> {
        let (sizes, strides) = (sizes.into(), strides.into());
        if checked_numel(&sizes).is_none() || byte_offset(offset, self.dtype()).is_none() {
            return Err(TensorError::SizeOverflow { op, shape: sizes.to_vec(), dtype: self.dtype() });
        }
        if self.dtype().is_quantized() && sizes.is_empty() {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: self.dtype(),
                shape: self.sizes().to_vec(),
                hint: "a quantised tensor needs at least one dimension (its blocks); dequantize first",
            });
        }
        if self.dtype().is_quantized() {
            // An empty view holds no block to split, whatever its strides and offset (the
            // contiguous strides of `[2, 0]` are `[1, 1]`); its last size still counts blocks.
            let empty = sizes.contains(&0);
            let ok = sizes.last().is_none_or(|&l| l % QUANT_BLOCK == 0)
                && (empty
                    || strides.last().is_none_or(|&s| s == 1)
                        && offset.is_multiple_of(QUANT_BLOCK)
                        && strides.iter().rev().skip(1).all(|s| s % QUANT_BLOCK == 0));
            if !ok {
                return Err(TensorError::UnsupportedDType {
                    op,
                    dtype: self.dtype(),
                    shape: self.sizes().to_vec(),
                    hint: "views of quantised tensors must keep whole blocks of 32 along the last dimension",
                });
            }
        }
        Ok(Tensor::from_parts(self.storage().clone(), sizes, strides, offset, self.dtype()))
    }

    /// The sub-tensor at `index` of dimension `dim`, which is removed (`t[.., index, ..]`).
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`], [`TensorError::IndexOutOfRange`].
    pub fn select(&self, dim: isize, index: isize) -> Result<Tensor> {
        let op = "select";
        if self.dim() == 0 {
            return Err(TensorError::DimOutOfRange { op, dim, shape: vec![], positions: 0 });
        }
        let d = self.wrap_dim(op, dim)?;
        let i = wrap_index(op, index, d, self.sizes())?;
        let (mut sizes, mut strides) = (Dims::from_slice(self.sizes()), Dims::from_slice(self.strides()));
        let offset = self.offset_at(op, i, strides[d])?;
        sizes.remove(d);
        strides.remove(d);
        self.make_view(op, sizes, strides, offset)
    }

    /// `length` elements of dimension `dim` from `start` (negative counts from the end).
    ///
    /// # Errors
    /// [`TensorError::RangeOutOfBounds`] when the range does not fit.
    pub fn narrow(&self, dim: isize, start: isize, length: usize) -> Result<Tensor> {
        self.narrow_as("narrow", dim, start, length)
    }

    /// [`narrow`](Self::narrow), its errors naming `op` (`chunk` and `split` are narrows).
    fn narrow_as(&self, op: &'static str, dim: isize, start: isize, length: usize) -> Result<Tensor> {
        let d = self.nonscalar_dim(op, dim)?;
        let size = self.sizes()[d];
        let s = if start < 0 { size.checked_sub(start.unsigned_abs()) } else { Some(start.unsigned_abs()) };
        let Some(s) = s.filter(|&s| s <= size && length <= size - s) else {
            return Err(TensorError::RangeOutOfBounds {
                op,
                dim: d,
                start,
                length: isize::try_from(length).unwrap_or(isize::MAX),
                size,
                shape: self.sizes().to_vec(),
            });
        };
        self.narrow_at(op, d, s, length)
    }

    /// Elements `start..start + length` of dimension `d`, a range already checked to fit (in
    /// `usize`: `split` of a dimension past `isize::MAX` starts pieces there).
    fn narrow_at(&self, op: &'static str, d: usize, start: usize, length: usize) -> Result<Tensor> {
        let (mut sizes, strides) = (Dims::from_slice(self.sizes()), Dims::from_slice(self.strides()));
        sizes[d] = length;
        let offset = self.offset_at(op, start, strides[d])?;
        self.make_view(op, sizes, strides, offset)
    }

    /// Elements `start, start + step, ...` below `end` of dimension `dim`: Python's and
    /// PyTorch's `t[start:end:step]`. A negative bound counts from the end; then both bounds
    /// are clamped to `0..=size`, and an end at or before the start gives an empty view, so
    /// `t.slice(0, -100, 100, 1)` is all of a dimension of size 3.
    ///
    /// # Errors
    /// [`TensorError::ZeroArgument`] for `step == 0`; [`TensorError::DimOutOfRange`].
    pub fn slice(&self, dim: isize, start: isize, end: isize, step: usize) -> Result<Tensor> {
        let op = "slice";
        if step == 0 {
            return Err(TensorError::ZeroArgument { op, what: "step", shape: self.sizes().to_vec() });
        }
        let d = self.nonscalar_dim(op, dim)?;
        // In `i128`: a negative bound counts from a size that may pass `isize::MAX` (an empty
        // tensor's), and `-1` of a size of `usize::MAX` is `usize::MAX - 1`.
        let size = self.sizes()[d] as i128;
        let bound = |i: isize| (if i < 0 { i as i128 + size } else { i as i128 }).clamp(0, size) as usize;
        let (s, e) = (bound(start), bound(end));
        let e = e.max(s);
        let overflow = || TensorError::SizeOverflow { op, shape: self.sizes().to_vec(), dtype: self.dtype() };
        let (mut sizes, mut strides) = (Dims::from_slice(self.sizes()), Dims::from_slice(self.strides()));
        sizes[d] = (e - s).div_ceil(step);
        let offset = self.offset_at(op, s, strides[d])?;
        // The stride is `stride * step` as in PyTorch, also when one element or none is taken;
        // then a product past `isize::MAX` reaches nothing and the stride stays as it was.
        strides[d] = match strides[d].checked_mul(step).filter(|&s| isize::try_from(s).is_ok()) {
            Some(s) => s,
            None if sizes[d] <= 1 => strides[d],
            None => return Err(overflow()),
        };
        self.make_view(op, sizes, strides, offset)
    }

    /// Swaps dimensions `dim0` and `dim1`.
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`].
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Result<Tensor> {
        self.transpose_as("transpose", dim0, dim1)
    }

    /// [`transpose`](Self::transpose), its errors naming `op` (`t` is a transpose).
    fn transpose_as(&self, op: &'static str, dim0: isize, dim1: isize) -> Result<Tensor> {
        if self.dim() == 0 {
            wrap_dim(op, dim0, &[])?;
            wrap_dim(op, dim1, &[])?;
            return Ok(self.clone());
        }
        let (a, b) = (self.wrap_dim(op, dim0)?, self.wrap_dim(op, dim1)?);
        let (mut sizes, mut strides) = (Dims::from_slice(self.sizes()), Dims::from_slice(self.strides()));
        sizes.swap(a, b);
        strides.swap(a, b);
        self.make_view(op, sizes, strides, self.storage_offset())
    }

    /// The transpose of a tensor of at most 2 dimensions (`transpose(0, 1)`).
    ///
    /// # Errors
    /// [`TensorError::BadShape`] for more than 2 dimensions; as
    /// [`transpose`](Self::transpose) otherwise.
    pub fn t(&self) -> Result<Tensor> {
        match self.dim() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose_as("t", 0, 1),
            _ => Err(TensorError::BadShape {
                op: "t",
                shape: self.sizes().to_vec(),
                target: vec![],
                reason: "t() expects at most 2 dimensions; use transpose(dim0, dim1)",
            }),
        }
    }

    /// Reorders the dimensions: dimension `i` of the result is dimension `dims[i]` of `self`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArguments`] unless `dims` has one entry per dimension;
    /// [`TensorError::DimOutOfRange`]; [`TensorError::RepeatedDim`].
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        self.permute_as("permute", dims)
    }

    /// [`permute`](Self::permute), its errors naming `op`.
    fn permute_as(&self, op: &'static str, dims: &[isize]) -> Result<Tensor> {
        if dims.len() != self.dim() {
            return Err(TensorError::InvalidArguments {
                op,
                args: dims.to_vec(),
                shape: self.sizes().to_vec(),
                reason: "permute needs exactly one dimension index per dimension",
            });
        }
        let mut seen: SmallVec<[bool; 6]> = smallvec::smallvec![false; self.dim()];
        let (mut sizes, mut strides) = (Dims::with_capacity(dims.len()), Dims::with_capacity(dims.len()));
        for &dim in dims {
            let d = self.wrap_dim(op, dim)?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(TensorError::RepeatedDim { op, dim, dims: dims.to_vec(), shape: self.sizes().to_vec() });
            }
            sizes.push(self.sizes()[d]);
            strides.push(self.strides()[d]);
        }
        self.make_view(op, sizes, strides, self.storage_offset())
    }

    /// Moves dimension `source` to position `destination`, keeping the others in order
    /// (`torch.movedim`).
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`].
    pub fn movedim(&self, source: isize, destination: isize) -> Result<Tensor> {
        let op = "movedim";
        if self.dim() == 0 {
            wrap_dim(op, source, &[])?;
            wrap_dim(op, destination, &[])?;
            return Ok(self.clone());
        }
        let (s, d) = (self.wrap_dim(op, source)?, self.wrap_dim(op, destination)?);
        let mut perm: SmallVec<[isize; 6]> = (0..self.dim() as isize).filter(|&i| i != s as isize).collect();
        perm.insert(d, s as isize);
        self.permute_as(op, &perm)
    }

    /// Inserts a dimension of size 1 at `dim` (in `-(ndim+1)..=ndim`).
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`].
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        self.unsqueeze_as("unsqueeze", dim)
    }

    /// [`unsqueeze`](Self::unsqueeze), its errors naming `op` (`stack` unsqueezes its tensors).
    pub(crate) fn unsqueeze_as(&self, op: &'static str, dim: isize) -> Result<Tensor> {
        let d = wrap_insert_dim(op, dim, self.sizes())?;
        let (mut sizes, mut strides) = (Dims::from_slice(self.sizes()), Dims::from_slice(self.strides()));
        // PyTorch's stride for the new dimension. The product fits for a tensor with elements
        // (it is within the extent, or one size step past it); an empty tensor's may not, and
        // saturates as contiguous strides do (a dimension of size 1 never steps by it).
        let stride = if d < sizes.len() { sizes[d].saturating_mul(strides[d]) } else { 1 };
        sizes.insert(d, 1);
        strides.insert(d, stride);
        self.make_view(op, sizes, strides, self.storage_offset())
    }

    /// Removes every dimension of size 1.
    pub fn squeeze(&self) -> Result<Tensor> {
        let keep = (0..self.dim()).filter(|&d| self.sizes()[d] != 1);
        let sizes: Dims = keep.clone().map(|d| self.sizes()[d]).collect();
        let strides: Dims = keep.map(|d| self.strides()[d]).collect();
        self.make_view("squeeze", sizes, strides, self.storage_offset())
    }

    /// Removes dimension `dim` if its size is 1 (otherwise returns the same view, as PyTorch).
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`].
    pub fn squeeze_dim(&self, dim: isize) -> Result<Tensor> {
        let op = "squeeze_dim";
        let d = self.wrap_dim(op, dim)?;
        if self.dim() == 0 || self.sizes()[d] != 1 {
            return Ok(self.clone());
        }
        let (mut sizes, mut strides) = (Dims::from_slice(self.sizes()), Dims::from_slice(self.strides()));
        sizes.remove(d);
        strides.remove(d);
        self.make_view(op, sizes, strides, self.storage_offset())
    }

    /// Broadcasts to `sizes` (stride 0 on the broadcast dimensions; `-1` keeps a size; new
    /// dimensions may be added on the left).
    ///
    /// # Errors
    /// [`TensorError::InvalidArguments`] when a dimension of size other than 1 would change, for
    /// fewer sizes than dimensions, for a negative size other than `-1`, and for `-1` on a new
    /// dimension.
    pub fn expand(&self, sizes: &[isize]) -> Result<Tensor> {
        let op = "expand";
        let bad =
            |reason| TensorError::InvalidArguments { op, args: sizes.to_vec(), shape: self.sizes().to_vec(), reason };
        if sizes.len() < self.dim() {
            return Err(bad("the target has fewer dimensions than the tensor"));
        }
        let lead = sizes.len() - self.dim();
        let mut target = Dims::with_capacity(sizes.len());
        for (i, &s) in sizes.iter().enumerate() {
            target.push(match s {
                -1 if i >= lead => self.sizes()[i - lead],
                s if s >= 0 => s as usize,
                _ => return Err(bad("sizes must be >= 0, or -1 to keep an existing dimension")),
            });
        }
        let strides = broadcast_strides(self.sizes(), self.strides(), &target)
            .ok_or_else(|| bad("only dimensions of size 1 can be expanded"))?;
        let strides = lead_strides(&target, strides, lead);
        self.make_view(op, target, strides, self.storage_offset())
    }

    /// Broadcasts to `sizes` ([`expand`](Self::expand) without `-1`).
    ///
    /// # Errors
    /// [`TensorError::Broadcast`] when the shapes are not compatible; [`TensorError::BadShape`]
    /// when they are only compatible the other way round (`[3]` to `[1]`).
    pub fn broadcast_to(&self, sizes: &[usize]) -> Result<Tensor> {
        self.broadcast_to_as("broadcast_to", sizes)
    }

    /// [`broadcast_to`](Self::broadcast_to), its errors naming `op` (`matmul` broadcasts its
    /// batch dimensions).
    pub(crate) fn broadcast_to_as(&self, op: &'static str, sizes: &[usize]) -> Result<Tensor> {
        let strides = broadcast_strides_to(op, self.sizes(), self.strides(), sizes)?;
        let lead = sizes.len() - self.dim();
        self.make_view(op, sizes, lead_strides(sizes, strides, lead), self.storage_offset())
    }

    /// The same elements with a new shape, without copying (`-1` infers one size).
    ///
    /// # Errors
    /// [`TensorError::NumelMismatch`]; [`TensorError::NotViewable`] when the strides cannot
    /// express the new shape (e.g. a transposed tensor): use [`reshape`](Self::reshape).
    pub fn view(&self, sizes: &[isize]) -> Result<Tensor> {
        let op = "view";
        let target = infer_size(op, sizes, self.sizes(), self.numel())?;
        self.view_as(op, &target)
    }

    /// [`view`](Self::view) to sizes given in full, its errors naming `op` (`embedding` views
    /// its rows in the indices' shape, whose sizes may pass `isize::MAX` when it is empty).
    pub(crate) fn view_as(&self, op: &'static str, target: &[usize]) -> Result<Tensor> {
        if checked_numel(target) != Some(self.numel()) {
            return Err(TensorError::NumelMismatch {
                op,
                target: target.iter().map(|&s| isize::try_from(s).unwrap_or(isize::MAX)).collect(),
                shape: self.sizes().to_vec(),
                numel: self.numel(),
            });
        }
        let strides = view_strides(self.sizes(), self.strides(), target).ok_or_else(|| TensorError::NotViewable {
            op,
            shape: self.sizes().to_vec(),
            strides: self.strides().to_vec(),
            target: target.to_vec(),
        })?;
        self.make_view(op, target, strides, self.storage_offset())
    }

    /// Like [`view`](Self::view) when possible, else a contiguous copy with the new shape.
    ///
    /// # Errors
    /// [`TensorError::NumelMismatch`].
    pub fn reshape(&self, sizes: &[isize]) -> Result<Tensor> {
        self.reshape_as("reshape", sizes)
    }

    /// [`reshape`](Self::reshape), its errors naming `op` (`flatten` is a reshape).
    fn reshape_as(&self, op: &'static str, sizes: &[isize]) -> Result<Tensor> {
        let target = infer_size(op, sizes, self.sizes(), self.numel())?;
        match view_strides(self.sizes(), self.strides(), &target) {
            Some(strides) => self.make_view(op, target, strides, self.storage_offset()),
            None => {
                let c = self.contiguous()?;
                let strides = super::shape::contiguous_strides(&target);
                c.make_view(op, target, strides, 0)
            }
        }
    }

    /// All elements as one dimension (a view when possible, else a copy).
    ///
    /// # Errors
    /// As [`reshape`](Self::reshape).
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape_as("flatten", &[-1])
    }

    /// `chunks` views along `dim` of `ceil(size / chunks)` elements each (the last may be
    /// smaller, and there may be fewer than `chunks`, as in PyTorch). A dimension of size 0
    /// gives `chunks` empty views, as in PyTorch.
    ///
    /// # Errors
    /// [`TensorError::ZeroArgument`] for `chunks == 0`; [`TensorError::DimOutOfRange`];
    /// [`TensorError::TooManyViews`] when an empty tensor would be cut into more than
    /// [`MAX_EMPTY_PIECES`](Self::MAX_EMPTY_PIECES) views.
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        let op = "chunk";
        if chunks == 0 {
            return Err(TensorError::ZeroArgument { op, what: "chunks", shape: self.sizes().to_vec() });
        }
        let d = self.nonscalar_dim(op, dim)?;
        let size = self.sizes()[d];
        if size == 0 {
            self.check_empty_pieces(op, chunks)?;
            return Ok(vec![self.clone(); chunks]);
        }
        self.split_as(op, size.div_ceil(chunks), dim)
    }

    /// The most views `chunk` and `split` make of a tensor with no elements: views of nothing
    /// cost memory and time, not data, and a huge dimension of an empty tensor asks for
    /// billions of them.
    pub const MAX_EMPTY_PIECES: usize = 1 << 16;

    fn check_empty_pieces(&self, op: &'static str, pieces: usize) -> Result<()> {
        if self.numel() == 0 && pieces > Self::MAX_EMPTY_PIECES {
            return Err(TensorError::TooManyViews {
                op,
                pieces,
                limit: Self::MAX_EMPTY_PIECES,
                shape: self.sizes().to_vec(),
            });
        }
        Ok(())
    }

    /// Views along `dim` of `split_size` elements each (the last may be smaller). A dimension
    /// of size 0 gives the tensor itself, whatever `split_size` (0 included), as in PyTorch.
    ///
    /// # Errors
    /// [`TensorError::ZeroArgument`] for `split_size == 0` on a non-empty dimension;
    /// [`TensorError::DimOutOfRange`].
    pub fn split(&self, split_size: usize, dim: isize) -> Result<Vec<Tensor>> {
        self.split_as("split", split_size, dim)
    }

    /// [`split`](Self::split), its errors naming `op`.
    fn split_as(&self, op: &'static str, split_size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = self.nonscalar_dim(op, dim)?;
        let size = self.sizes()[d];
        if size == 0 {
            return Ok(vec![self.clone()]);
        }
        if split_size == 0 {
            return Err(TensorError::ZeroArgument { op, what: "split_size", shape: self.sizes().to_vec() });
        }
        self.check_empty_pieces(op, size.div_ceil(split_size))?;
        (0..size).step_by(split_size).map(|start| self.narrow_at(op, d, start, split_size.min(size - start))).collect()
    }

    /// A view with any sizes, strides and offset over this tensor's storage, checked to stay
    /// inside it.
    ///
    /// # Errors
    /// [`TensorError::BadShape`] when `sizes` and `strides` differ in length;
    /// [`TensorError::OutOfStorage`] when the layout reaches past the end of the storage.
    pub fn as_strided(&self, sizes: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        let op = "as_strided";
        if sizes.len() != strides.len() {
            return Err(TensorError::BadShape {
                op,
                shape: sizes.to_vec(),
                target: strides.to_vec(),
                reason: "sizes and strides must have the same length",
            });
        }
        let available = self.storage().nbytes() / self.dtype().block_bytes() * self.dtype().block_len();
        let needed = extent(sizes, strides, offset);
        if needed.is_none_or(|n| n > available) {
            return Err(TensorError::OutOfStorage {
                op,
                sizes: sizes.to_vec(),
                strides: strides.to_vec(),
                offset,
                needed: needed.unwrap_or(usize::MAX),
                available,
            });
        }
        self.make_view(op, sizes, strides, offset)
    }

    /// The offset of index `i` along a dimension of stride `stride`. It lies inside the
    /// storage, or one step past the end, except where a view of an empty tensor starts along
    /// a dimension of nonzero size (`zeros(&[4, 0]).narrow(0, 3, 1)`, as PyTorch allows): no
    /// element is ever read there, and a sum past `usize` is an error.
    fn offset_at(&self, op: &'static str, i: usize, stride: usize) -> Result<usize> {
        i.checked_mul(stride)
            .and_then(|o| o.checked_add(self.storage_offset()))
            .ok_or_else(|| TensorError::SizeOverflow { op, shape: self.sizes().to_vec(), dtype: self.dtype() })
    }

    /// `dim` wrapped, for ops that need at least one dimension.
    fn nonscalar_dim(&self, op: &'static str, dim: isize) -> Result<usize> {
        if self.dim() == 0 {
            return Err(TensorError::DimOutOfRange { op, dim, shape: vec![], positions: 0 });
        }
        self.wrap_dim(op, dim)
    }
}

/// The strides of the `lead` new leading dimensions of an `expand` as PyTorch sets them: a new
/// dimension of size 1 gets the stride a contiguous layout would give it over the dimensions
/// after it (`[3]` to `[1, 3]` has strides `[3, 1]`), an expanded one 0. Only a size-1
/// dimension's stride changes, which no element's address depends on.
fn lead_strides(target: &[usize], mut strides: Dims, lead: usize) -> Dims {
    for d in (0..lead).rev() {
        if target[d] == 1 {
            let next = target.get(d + 1).zip(strides.get(d + 1)).map_or(Some(0), |(s, t)| s.checked_mul(*t));
            strides[d] = next.unwrap_or(0);
        }
    }
    strides
}
