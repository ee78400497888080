//! [`Tensor`]: a strided view of a [`Storage`], and typed element access.

use std::sync::Arc;

use tensormem::AllocatorRegistry;
use tensormem::allocators::Allocator;

use smallvec::SmallVec;

use super::shape::{Dims, checked_numel, contiguous_strides, is_contiguous, wrap_dim, wrap_index};
use super::storage::lock_storages;
use super::{DType, Element, Result, Storage, TensorError};

/// An n-dimensional array: a [`Storage`] plus sizes, strides (in elements; 0 on broadcast
/// dimensions) and a storage offset, as PyTorch's `TensorImpl`.
///
/// Cloning a tensor, and every view (`select`, `narrow`, `transpose`, `expand`, ...), shares
/// the storage and copies nothing; the memory goes back to its allocator when the last tensor
/// on it is dropped. Kernels (`add`, `sum`, `matmul`, ...) allocate their output through the
/// allocator of their first input's storage (or the registry's default for a mapped input).
///
/// ```
/// use tensormem_tensor::{DType, Tensor};
///
/// let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.view(&[2, 3])?;
/// let col = a.select(1, 2)?; // [2., 5.], no copy
/// assert!(col.shares_storage(&a));
/// assert_eq!(col.to_vec::<f32>()?, [2.0, 5.0]);
/// assert_eq!(a.t()?.strides(), [1, 3]);
/// assert_eq!(format!("{a}"), "tensor([[0., 1., 2.],\n        [3., 4., 5.]])");
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    storage: Storage,
    sizes: Dims,
    strides: Dims,
    offset: usize,
    dtype: DType,
}

/// The registry's allocator, for tensors built without one.
pub(crate) fn default_allocator(op: &'static str) -> Result<Arc<dyn Allocator>> {
    AllocatorRegistry::global().try_get().map_err(|source| TensorError::Registry { op, source })
}

/// Bytes `numel` elements of `dtype` take, with overflow and quantised-block checks.
pub(crate) fn nbytes_of(op: &'static str, sizes: &[usize], dtype: DType) -> Result<usize> {
    let overflow = || TensorError::SizeOverflow { op, shape: sizes.to_vec(), dtype };
    let numel = checked_numel(sizes).ok_or_else(overflow)?;
    if dtype.is_quantized() && sizes.last().is_none_or(|&l| l % dtype.block_len() != 0) {
        return Err(TensorError::BadShape {
            op,
            shape: sizes.to_vec(),
            target: vec![],
            reason: "a quantised tensor's last dimension must be a multiple of 32",
        });
    }
    let n = dtype.size_of(numel).ok_or_else(overflow)?;
    if n > isize::MAX as usize / 2 {
        return Err(overflow());
    }
    Ok(n)
}

impl Tensor {
    /// A tensor over `storage` with the given layout. The caller has checked that the layout
    /// stays inside the storage.
    pub(crate) fn from_parts(
        storage: Storage,
        sizes: impl Into<Dims>,
        strides: impl Into<Dims>,
        offset: usize,
        dtype: DType,
    ) -> Self {
        let (sizes, strides) = (sizes.into(), strides.into());
        debug_assert_eq!(sizes.len(), strides.len());
        Tensor { storage, sizes, strides, offset, dtype }
    }

    /// A quantised view's blocks as a `u8` view of the same storage, for copies: its last
    /// dimension counts the bytes of its blocks (views keep whole blocks along it, in order),
    /// the others step by the bytes of the blocks they step over. Sizes and strides of empty
    /// views saturate (they address nothing).
    pub(crate) fn block_bytes(&self) -> Tensor {
        let dt = self.dtype;
        debug_assert!(dt.is_quantized());
        let bytes = |elements: usize| (elements / dt.block_len()).saturating_mul(dt.block_bytes());
        let mut sizes = self.sizes.clone();
        let mut strides: Dims = self.strides.iter().map(|&s| bytes(s)).collect();
        if let (Some(size), Some(stride)) = (sizes.last_mut(), strides.last_mut()) {
            *size = bytes(*size);
            *stride = 1;
        }
        Tensor::from_parts(self.storage.clone(), sizes, strides, bytes(self.offset), DType::U8)
    }

    /// A contiguous tensor whose storage is allocated now and *not initialised*.
    ///
    /// # Safety
    /// The caller writes every element before the tensor is read or returned.
    pub(crate) unsafe fn uninit(
        op: &'static str,
        sizes: &[usize],
        dtype: DType,
        allocator: Arc<dyn Allocator>,
    ) -> Result<Tensor> {
        // SAFETY: forwarded; contiguous strides are dense.
        unsafe { Tensor::uninit_strided(op, sizes, contiguous_strides(sizes), dtype, allocator) }
    }

    /// As [`uninit`](Self::uninit), with `strides`: a dense layout (see
    /// [`layout`](super::layout)), whose elements fill the `numel` elements of the storage.
    ///
    /// # Safety
    /// As [`uninit`](Self::uninit); `strides` is dense for `sizes` (then writing every element
    /// initialises the whole storage, and the layout stays inside it).
    pub(crate) unsafe fn uninit_strided(
        op: &'static str,
        sizes: &[usize],
        strides: impl Into<Dims>,
        dtype: DType,
        allocator: Arc<dyn Allocator>,
    ) -> Result<Tensor> {
        let strides = strides.into();
        let nbytes = nbytes_of(op, sizes, dtype)?;
        // After the size check: the strides of a shape whose element count overflows saturate
        // and are not dense; such a shape is a `SizeOverflow`, not a caller's mistake.
        debug_assert!(strides.len() == sizes.len() && super::strides::is_dense(sizes, &strides));
        // SAFETY: forwarded: the caller fills the tensor before anything reads it.
        let storage = unsafe { Storage::new_uninit(op, nbytes, allocator) }?.described(dtype, sizes);
        Ok(Tensor::from_parts(storage, sizes, strides, 0, dtype))
    }

    /// A fresh contiguous output for a kernel, allocated where `like`'s storage was.
    ///
    /// # Safety
    /// As [`uninit`](Self::uninit): the kernel writes every element before returning it.
    pub(crate) unsafe fn output(op: &'static str, sizes: &[usize], dtype: DType, like: &Tensor) -> Result<Tensor> {
        // SAFETY: forwarded to the caller; contiguous strides are dense.
        unsafe { Tensor::output_strided(op, sizes, contiguous_strides(sizes), dtype, like) }
    }

    /// As [`output`](Self::output), with `strides`, a dense layout for `sizes` (from
    /// [`layout`](super::layout): an element-wise kernel's output is laid out as PyTorch's).
    ///
    /// # Safety
    /// As [`uninit_strided`](Self::uninit_strided).
    pub(crate) unsafe fn output_strided(
        op: &'static str,
        sizes: &[usize],
        strides: impl Into<Dims>,
        dtype: DType,
        like: &Tensor,
    ) -> Result<Tensor> {
        let allocator = match like.storage.allocator() {
            Some(a) => Arc::clone(a),
            None => default_allocator(op)?,
        };
        // SAFETY: forwarded to the caller.
        unsafe { Tensor::uninit_strided(op, sizes, strides, dtype, allocator) }
    }

    /// The sizes of the dimensions.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The size of dimension `dim` (negative counts from the end).
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`].
    pub fn size(&self, dim: isize) -> Result<usize> {
        if self.sizes.is_empty() {
            // A 0-d tensor has no dimension to ask about (PyTorch: an IndexError).
            return Err(TensorError::DimOutOfRange { op: "size", dim, shape: vec![], positions: 0 });
        }
        let d = wrap_dim("size", dim, &self.sizes)?;
        Ok(self.sizes[d])
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.offset
    }

    /// The number of dimensions.
    pub fn dim(&self) -> usize {
        self.sizes.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        // Every layout's element count was checked to fit when it was made.
        checked_numel(&self.sizes).unwrap_or(usize::MAX)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The storage this tensor is a view of.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Whether the two tensors are views of the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        self.storage.same(&other.storage)
    }

    /// Row-major contiguous (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.sizes, &self.strides)
    }

    /// Allocates a lazy storage now (see [`Storage::materialize`]), on the device for a device
    /// allocator.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when the allocator refuses, [`TensorError::Transfer`] when device
    /// memory cannot be zeroed.
    pub fn materialize(&self) -> Result<()> {
        self.storage.materialize()
    }

    /// Readies the storage for host code in `op`: [`TensorError::DeviceMemory`] naming `op`
    /// and the device when the bytes are device memory, else materialised. Every kernel and
    /// element access goes through this before touching bytes.
    pub(crate) fn host_ready(&self, op: &'static str) -> Result<()> {
        self.storage.check_host(op)?;
        self.storage.materialize()
    }

    /// Bytes per element; only called on plain dtypes.
    pub(crate) fn elem_size(&self) -> usize {
        self.dtype.element_size().unwrap_or(1)
    }

    /// The address of element 0 of the view. The storage must be materialised and the dtype
    /// plain (or the offset a whole number of quantised blocks).
    pub(crate) fn data_ptr(&self) -> *mut u8 {
        // Every non-empty tensor's layout lies inside its storage (checked where layouts are
        // made), so this is inside the allocation. An empty view may start past it (a narrow
        // of an empty tensor); its address is never read or written, and every view's byte
        // offset fits `isize` (`make_view`, `as_strided`). Wrapping arithmetic: a device
        // storage's address is not a host allocation.
        self.storage.data_ptr().wrapping_add(byte_offset(self.offset, self.dtype).unwrap_or(0))
    }

    pub(crate) fn check_type<T: Element>(&self, op: &'static str) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::WrongType {
                op,
                expected: T::DTYPE,
                actual: self.dtype,
                shape: self.sizes.to_vec(),
            });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self, op: &'static str) -> Result<()> {
        if self.storage.is_read_only() {
            return Err(TensorError::ReadOnly { op, shape: self.sizes.to_vec() });
        }
        Ok(())
    }

    /// The elements in row-major order.
    ///
    /// # Errors
    /// [`TensorError::WrongType`] when `T` is not the tensor's element type;
    /// [`TensorError::Alloc`] when a lazy storage cannot be materialised.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_type::<T>("to_vec")?;
        self.host_ready("to_vec")?;
        let _g = lock_storages("to_vec", None, &[&self.storage])?;
        let base = self.data_ptr() as *const T;
        let mut out = Vec::with_capacity(self.numel());
        if self.is_contiguous() {
            // SAFETY: the view is contiguous, so its `numel` elements are consecutive from
            // `base`, inside the materialised (initialised) storage; the read lock keeps
            // writers out while we copy.
            out.extend_from_slice(unsafe { core::slice::from_raw_parts(base, self.numel()) });
        } else {
            for_each_offset(&self.sizes, &self.strides, |off| {
                // SAFETY: `off` is a valid element index of the layout, inside the storage.
                out.push(unsafe { base.add(off).read() });
            });
        }
        Ok(out)
    }

    fn element_offset(&self, op: &'static str, index: &[isize]) -> Result<usize> {
        if index.len() != self.sizes.len() {
            return Err(TensorError::IndexCount { op, given: index.len(), shape: self.sizes.to_vec() });
        }
        let indices: SmallVec<[usize; 6]> =
            index.iter().enumerate().map(|(d, &i)| wrap_index(op, i, d, &self.sizes)).collect::<Result<_>>()?;
        // Every index is in range (checked first: an empty dimension anywhere refuses them
        // all), so the element exists and its offset lies inside the storage: the sum cannot
        // overflow.
        Ok(indices.iter().zip(&self.strides).map(|(i, s)| i * s).sum())
    }

    /// The element at `index` (one entry per dimension; negative counts from the end).
    ///
    /// # Errors
    /// [`TensorError::IndexCount`], [`TensorError::IndexOutOfRange`], [`TensorError::WrongType`].
    pub fn get<T: Element>(&self, index: &[isize]) -> Result<T> {
        self.check_type::<T>("get")?;
        let off = self.element_offset("get", index)?;
        self.host_ready("get")?;
        let _g = lock_storages("get", None, &[&self.storage])?;
        // SAFETY: `off` indexes an element of the view (checked above), inside the storage.
        Ok(unsafe { (self.data_ptr() as *const T).add(off).read() })
    }

    /// Writes the element at `index`; every view of the storage sees it.
    ///
    /// # Errors
    /// As [`get`](Self::get), and [`TensorError::ReadOnly`] for a mapped file.
    pub fn set<T: Element>(&self, index: &[isize], value: T) -> Result<()> {
        self.check_type::<T>("set")?;
        self.check_writable("set")?;
        let off = self.element_offset("set", index)?;
        self.host_ready("set")?;
        let _g = lock_storages("set", Some(&self.storage), &[])?;
        // SAFETY: as in `get`; the write lock excludes every reader of the storage.
        unsafe { (self.data_ptr() as *mut T).add(off).write(value) };
        Ok(())
    }

    /// The value of a one-element tensor.
    ///
    /// # Errors
    /// [`TensorError::NotAScalar`] unless `numel() == 1`; [`TensorError::WrongType`].
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(TensorError::NotAScalar { op: "item", numel: self.numel(), shape: self.sizes.to_vec() });
        }
        let zeros: SmallVec<[isize; 6]> = smallvec::smallvec![0; self.dim()];
        self.get(&zeros)
    }

    /// The dimension `dim` wrapped into `0..ndim`.
    pub(crate) fn wrap_dim(&self, op: &'static str, dim: isize) -> Result<usize> {
        wrap_dim(op, dim, &self.sizes)
    }
}

/// Calls `f` with the storage offset (relative to the view's first element) of every element,
/// in row-major order.
pub(crate) fn for_each_offset(sizes: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    if sizes.contains(&0) {
        return;
    }
    let n = sizes.len();
    if n == 0 {
        f(0);
        return;
    }
    let mut idx = vec![0usize; n];
    let mut off = 0usize;
    let (inner, inner_stride) = (sizes[n - 1], strides[n - 1]);
    loop {
        for i in 0..inner {
            f(off + i * inner_stride);
        }
        let mut d = n - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += strides[d];
            if idx[d] < sizes[d] {
                break;
            }
            off -= strides[d] * sizes[d];
            idx[d] = 0;
        }
    }
}

impl core::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tensor")
            .field("sizes", &self.sizes)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("dtype", &self.dtype)
            .field("storage", &self.storage)
            .finish()
    }
}

/// The byte offset of element `offset` of a storage of `dtype` (whole quantised blocks), when
/// it fits `isize`.
pub(crate) fn byte_offset(offset: usize, dtype: DType) -> Option<usize> {
    (offset / dtype.block_len()).checked_mul(dtype.block_bytes()).filter(|&b| isize::try_from(b).is_ok())
}
