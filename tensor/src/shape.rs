//! Shape arithmetic: dimension wrapping, broadcasting, strides of views.

use smallvec::SmallVec;

use super::{Result, TensorError};

/// A tensor's sizes or strides: inline up to 6 dimensions (PyTorch keeps them in a
/// `SmallVector<int64_t, 5>`), so that making, viewing, cloning and iterating over tensors of
/// up to 6 dimensions allocates nothing for their layout.
pub(crate) type Dims = SmallVec<[usize; 6]>;

/// Row-major strides (in elements) of a contiguous tensor of `sizes`.
#[inline]
pub(crate) fn contiguous_strides(sizes: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; sizes.len()];
    let mut acc = 1usize;
    for d in (0..sizes.len()).rev() {
        strides[d] = acc;
        acc = acc.saturating_mul(sizes[d].max(1));
    }
    strides
}

/// Whether `sizes`/`strides` are row-major contiguous (dimensions of size 1 may have any
/// stride, as in PyTorch).
#[inline]
pub(crate) fn is_contiguous(sizes: &[usize], strides: &[usize]) -> bool {
    packed_in_order(sizes, strides, (0..sizes.len()).rev())
}

/// Whether the dimensions, walked innermost first in `order`, are packed one after another
/// (each stride the product of the sizes before it; dimensions of size 1 may have any stride;
/// an empty tensor is packed): row-major contiguity, or another memory format's.
#[inline]
pub(crate) fn packed_in_order(sizes: &[usize], strides: &[usize], order: impl IntoIterator<Item = usize>) -> bool {
    if sizes.contains(&0) {
        return true;
    }
    let mut expected = 1usize;
    for d in order {
        if sizes[d] == 1 {
            continue;
        }
        if strides[d] != expected {
            return false;
        }
        expected = expected.saturating_mul(sizes[d]);
    }
    true
}

/// The number of elements, or `None` on overflow.
pub(crate) fn checked_numel(sizes: &[usize]) -> Option<usize> {
    if sizes.contains(&0) {
        return Some(0);
    }
    sizes.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s))
}

/// One past the largest element index the layout reaches; `offset` itself when it has no
/// elements (an empty view still points at its offset, which must lie inside the storage).
pub(crate) fn extent(sizes: &[usize], strides: &[usize], offset: usize) -> Option<usize> {
    if sizes.contains(&0) {
        return Some(offset);
    }
    let mut last = offset;
    for (&s, &st) in sizes.iter().zip(strides) {
        last = last.checked_add((s - 1).checked_mul(st)?)?;
    }
    last.checked_add(1)
}

/// `dim` in `-ndim..ndim` as an index (a 0-d tensor accepts -1 and 0, as in PyTorch).
pub(crate) fn wrap_dim(op: &'static str, dim: isize, shape: &[usize]) -> Result<usize> {
    wrap(op, dim, shape.len().max(1), shape).and_then(|d| {
        if shape.is_empty() && d == 0 {
            Ok(0)
        } else if d < shape.len() {
            Ok(d)
        } else {
            Err(TensorError::DimOutOfRange { op, dim, shape: shape.to_vec(), positions: shape.len().max(1) })
        }
    })
}

/// `dim` in `-(ndim+1)..=ndim` (positions to insert a dimension at).
pub(crate) fn wrap_insert_dim(op: &'static str, dim: isize, shape: &[usize]) -> Result<usize> {
    wrap(op, dim, shape.len() + 1, shape)
}

fn wrap(op: &'static str, dim: isize, n: usize, shape: &[usize]) -> Result<usize> {
    let n = n as isize;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n {
        return Err(TensorError::DimOutOfRange { op, dim, shape: shape.to_vec(), positions: n as usize });
    }
    Ok(d as usize)
}

/// `index` in `-size..size` as an index into a dimension of `size`.
pub(crate) fn wrap_index(op: &'static str, index: isize, dim: usize, shape: &[usize]) -> Result<usize> {
    let size = shape[dim];
    // In `usize`: the size of an empty tensor's dimension may pass `isize::MAX` (`cat` of two
    // of 2^62), where `index + size as isize` overflowed.
    let i = if index < 0 { size.checked_sub(index.unsigned_abs()) } else { Some(index.unsigned_abs()) };
    i.filter(|&i| i < size).ok_or_else(|| TensorError::IndexOutOfRange { op, index, dim, size, shape: shape.to_vec() })
}

/// The broadcast of two shapes (NumPy rules: align on the right; sizes equal or one is 1).
pub(crate) fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let n = a.len().max(b.len());
    let mut out: Dims = smallvec::smallvec![0; n];
    for i in 0..n {
        let sa = if i < a.len() { a[a.len() - 1 - i] } else { 1 };
        let sb = if i < b.len() { b[b.len() - 1 - i] } else { 1 };
        out[n - 1 - i] = if sa == sb || sb == 1 {
            sa
        } else if sa == 1 {
            sb
        } else {
            return Err(TensorError::Broadcast {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                dim: i,
                lhs_size: sa,
                rhs_size: sb,
            });
        };
    }
    Ok(out)
}

/// Strides of `sizes`/`strides` broadcast to `target` (0 on broadcast dimensions), or `None`
/// when the shape does not broadcast to `target`.
pub(crate) fn broadcast_strides(sizes: &[usize], strides: &[usize], target: &[usize]) -> Option<Dims> {
    if sizes.len() > target.len() {
        return None;
    }
    let lead = target.len() - sizes.len();
    let mut out: Dims = smallvec::smallvec![0; target.len()];
    for d in 0..sizes.len() {
        let t = target[lead + d];
        out[lead + d] = if sizes[d] == t {
            strides[d]
        } else if sizes[d] == 1 {
            0
        } else {
            return None;
        };
    }
    Some(out)
}

/// [`broadcast_strides`], or the error saying why `sizes` does not broadcast to `target`.
pub(crate) fn broadcast_strides_to(
    op: &'static str,
    sizes: &[usize],
    strides: &[usize],
    target: &[usize],
) -> Result<Dims> {
    broadcast_strides(sizes, strides, target).ok_or_else(|| match broadcast_shapes(op, sizes, target) {
        Err(e) => e,
        // The shapes broadcast together, but not one onto the other.
        Ok(_) => TensorError::BadShape {
            op,
            shape: sizes.to_vec(),
            target: target.to_vec(),
            reason: "only dimensions of size 1 expand, and the target needs at least as many dimensions",
        },
    })
}

/// The target shape of `view`/`reshape` with a `-1` inferred.
pub(crate) fn infer_size(op: &'static str, target: &[isize], shape: &[usize], numel: usize) -> Result<Dims> {
    let bad = || TensorError::NumelMismatch { op, target: target.to_vec(), shape: shape.to_vec(), numel };
    let mut infer = None;
    let mut known = 1usize;
    let mut out = Dims::with_capacity(target.len());
    for (i, &t) in target.iter().enumerate() {
        if t == -1 {
            if infer.replace(i).is_some() {
                return Err(bad());
            }
            out.push(0);
        } else if t < 0 {
            return Err(bad());
        } else {
            known = known.checked_mul(t as usize).ok_or_else(bad)?;
            out.push(t as usize);
        }
    }
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(bad());
            }
            out[i] = numel / known;
        }
        None if known != numel => return Err(bad()),
        None => {}
    }
    Ok(out)
}

/// Strides that view `old_sizes`/`old_strides` as `new_sizes` without copying, if any exist
/// (PyTorch's `computeStride`): each run of old dimensions that is contiguous in memory may
/// be split or merged freely; runs may not be mixed.
pub(crate) fn view_strides(old_sizes: &[usize], old_strides: &[usize], new_sizes: &[usize]) -> Option<Dims> {
    let numel = checked_numel(old_sizes)?;
    if numel == 0 {
        // PyTorch's computeStride: an empty tensor viewed as its own shape keeps its strides.
        return Some(if old_sizes == new_sizes {
            Dims::from_slice(old_strides)
        } else {
            contiguous_strides(new_sizes)
        });
    }
    let (old_sizes, old_strides): (&[usize], &[usize]) =
        if old_sizes.is_empty() { (&[1], &[1]) } else { (old_sizes, old_strides) };
    let mut new_strides: Dims = smallvec::smallvec![0; new_sizes.len()];
    let mut view_d = new_sizes.len() as isize - 1;
    let mut chunk_base = *old_strides.last()?;
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for tensor_d in (0..old_sizes.len()).rev() {
        tensor_numel *= old_sizes[tensor_d];
        let boundary =
            tensor_d == 0 || (old_sizes[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base);
        if boundary {
            while view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d as usize] == 1) {
                new_strides[view_d as usize] = view_numel * chunk_base;
                view_numel *= new_sizes[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    Some(new_strides)
}
