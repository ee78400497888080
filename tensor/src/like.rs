//! A tensor's options, tensors made like it (`zeros_like`, `new_zeros`, ...), and direct
//! access to its elements as slices for custom kernels and interop.

use core::fmt;
use core::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::storage::{SliceRead, SliceWrite};
use super::strides::preserved_strides;

use super::{Element, Result, Tensor, TensorError, TensorOptions};

/// `fresh` (just made with `like`'s shape, every element the same value) with the strides
/// PyTorch's `preserve_format` gives a tensor made like `like`.
fn laid_out_as(like: &Tensor, fresh: Tensor) -> Tensor {
    if fresh.dtype().is_quantized() {
        // Blocks of 32 along the last dimension: the one layout such a storage holds.
        return fresh;
    }
    let strides = preserved_strides(like.sizes(), like.strides());
    // The strides are dense (`layout`), so they address the fresh storage's `numel` elements.
    Tensor::from_parts(fresh.storage().clone(), fresh.sizes(), strides, 0, fresh.dtype())
}

impl Tensor {
    /// The options this tensor was made with: its dtype and its storage's allocator (none for
    /// a mapped file, whose copies go to the registry's default), so that new tensors land in
    /// the same allocator (`x.options()` in PyTorch).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensormem_tensor::{DType, Tensor, TensorOptions};
    /// use tensormem::{SystemAllocator, TrackingAllocator};
    ///
    /// let tracker = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
    /// let x = Tensor::ones(&[4], TensorOptions::new().dtype(DType::F16).allocator(tracker.clone()))?;
    /// let y = x.new_zeros(&[2, 3])?;
    /// assert_eq!((y.dtype(), y.storage().allocator_name()), (DType::F16, "cpu"));
    /// let z = Tensor::full_like(&x, 7.0)?;
    /// assert_eq!(z.to_vec::<half::f16>()?[0].to_f32(), 7.0);
    /// y.materialize()?; // zeros are allocated on first use
    /// assert_eq!(tracker.live_chunks().len(), 3);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    pub fn options(&self) -> TensorOptions {
        let opts = TensorOptions::new().dtype(self.dtype());
        match self.storage().allocator() {
            Some(a) => opts.allocator(Arc::clone(a)),
            None => opts,
        }
    }

    /// Zeros of this tensor's shape, dtype and allocator (lazily allocated), laid out as it is
    /// (PyTorch's `preserve_format`: a dense tensor's strides, transposed for a transposed
    /// one; else its dimensions' order, packed).
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::ones(&[4, 3], DType::F32)?;
    /// assert_eq!(Tensor::zeros_like(&x.t()?)?.strides(), [1, 3]);
    /// assert_eq!(Tensor::zeros_like(&x.narrow(1, 0, 2)?)?.strides(), [2, 1]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Tensor::zeros`].
    pub fn zeros_like(t: &Tensor) -> Result<Tensor> {
        Ok(laid_out_as(t, Tensor::empty_as("zeros_like", t.sizes(), t.options())?))
    }

    /// Ones of this tensor's shape, dtype and allocator, laid out as
    /// [`zeros_like`](Self::zeros_like).
    ///
    /// # Errors
    /// As [`Tensor::ones`].
    pub fn ones_like(t: &Tensor) -> Result<Tensor> {
        Ok(laid_out_as(t, Tensor::full_as("ones_like", t.sizes(), 1.0, t.options())?))
    }

    /// An uninitialised (lazily zeroed) tensor of this tensor's shape, dtype and allocator,
    /// laid out as [`zeros_like`](Self::zeros_like).
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn empty_like(t: &Tensor) -> Result<Tensor> {
        Ok(laid_out_as(t, Tensor::empty_as("empty_like", t.sizes(), t.options())?))
    }

    /// `value` everywhere, in this tensor's shape, dtype and allocator, laid out as
    /// [`zeros_like`](Self::zeros_like).
    ///
    /// # Errors
    /// As [`Tensor::full`].
    pub fn full_like(t: &Tensor, value: f64) -> Result<Tensor> {
        Ok(laid_out_as(t, Tensor::full_as("full_like", t.sizes(), value, t.options())?))
    }

    /// Zeros of `sizes` in this tensor's dtype and allocator (`x.new_zeros` in PyTorch).
    ///
    /// # Errors
    /// As [`Tensor::zeros`].
    pub fn new_zeros(&self, sizes: &[usize]) -> Result<Tensor> {
        Tensor::empty_as("new_zeros", sizes, self.options())
    }

    /// Ones of `sizes` in this tensor's dtype and allocator.
    ///
    /// # Errors
    /// As [`Tensor::ones`].
    pub fn new_ones(&self, sizes: &[usize]) -> Result<Tensor> {
        Tensor::full_as("new_ones", sizes, 1.0, self.options())
    }

    /// A lazily allocated tensor of `sizes` in this tensor's dtype and allocator.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn new_empty(&self, sizes: &[usize]) -> Result<Tensor> {
        Tensor::empty_as("new_empty", sizes, self.options())
    }

    /// `value` everywhere in a tensor of `sizes`, in this tensor's dtype and allocator.
    ///
    /// # Errors
    /// As [`Tensor::full`].
    pub fn new_full(&self, sizes: &[usize], value: f64) -> Result<Tensor> {
        Tensor::full_as("new_full", sizes, value, self.options())
    }

    fn check_slice<T: Element>(&self, op: &'static str) -> Result<()> {
        self.check_type::<T>(op)?;
        if !self.is_contiguous() {
            return Err(TensorError::NotContiguous {
                op,
                shape: self.sizes().to_vec(),
                strides: self.strides().to_vec(),
            });
        }
        self.host_ready(op)
    }

    /// The elements of a contiguous tensor as a slice, in row-major order, for custom kernels
    /// and interop. The storage's read lock is held while the returned guard lives: kernels
    /// that read it run (on this thread too, and more slices can be taken), kernels on other
    /// threads that write it (on any view) wait. On this thread, an operation that writes the
    /// storage, or [`as_mut_slice`](Self::as_mut_slice), returns [`TensorError::Borrowed`]
    /// instead of waiting for itself.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.view(&[2, 3])?;
    /// let s = x.as_slice::<f32>()?;
    /// assert_eq!(s.iter().sum::<f32>(), 15.0);
    /// assert!(x.t()?.as_slice::<f32>().is_err(), "a transposed view is not contiguous");
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::WrongType`] when `T` is not the dtype; [`TensorError::NotContiguous`];
    /// [`TensorError::Alloc`] when a lazy storage cannot be allocated;
    /// [`TensorError::Borrowed`] when this thread holds a mutable slice of the storage.
    pub fn as_slice<T: Element>(&self) -> Result<TensorSlice<'_, T>> {
        self.check_slice::<T>("as_slice")?;
        let guard = self.storage().slice_read("as_slice")?;
        // SAFETY: the view is contiguous, so its `numel` elements of `T` (its dtype) are
        // consecutive from its first element, inside the materialised (initialised) storage;
        // the read lock, held as long as the slice, keeps every writer out.
        let slice = unsafe { core::slice::from_raw_parts(self.data_ptr() as *const T, self.numel()) };
        Ok(TensorSlice { _guard: guard, slice })
    }

    /// The elements of a contiguous tensor as a mutable slice; every view of the storage sees
    /// the writes. The storage's write lock is held while the guard lives: kernels on other
    /// threads that use the storage wait; on this thread, every operation on it returns
    /// [`TensorError::Borrowed`] instead of waiting for itself.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::zeros(&[4], DType::I32)?;
    /// x.as_mut_slice::<i32>()?.copy_from_slice(&[1, 2, 3, 4]);
    /// assert_eq!(x.sum()?.item::<i64>()?, 10);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// As [`as_slice`](Self::as_slice), [`TensorError::ReadOnly`] for a mapped file, and
    /// [`TensorError::Borrowed`] when this thread holds any slice of the storage.
    pub fn as_mut_slice<T: Element>(&self) -> Result<TensorSliceMut<'_, T>> {
        self.check_writable("as_mut_slice")?;
        self.check_slice::<T>("as_mut_slice")?;
        let guard = self.storage().slice_write("as_mut_slice")?;
        // SAFETY: as in `as_slice`; the write lock, held as long as the slice, excludes every
        // other reader and writer of the storage, so this is the only reference to the elements.
        let slice = unsafe { core::slice::from_raw_parts_mut(self.data_ptr() as *mut T, self.numel()) };
        Ok(TensorSliceMut { _guard: guard, slice })
    }
}

/// A tensor's elements, read-locked: see [`Tensor::as_slice`]. Not `Send` (the lock belongs
/// to the thread that took it) but `Sync`: scoped threads may read it by reference.
pub struct TensorSlice<'a, T> {
    _guard: SliceRead<'a>,
    slice: &'a [T],
}

impl<T> Deref for TensorSlice<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T: fmt::Debug> fmt::Debug for TensorSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.slice, f)
    }
}

/// A tensor's elements, write-locked: see [`Tensor::as_mut_slice`]. Not `Send` (the lock
/// belongs to the thread that took it) but `Sync`.
pub struct TensorSliceMut<'a, T> {
    _guard: SliceWrite<'a>,
    slice: &'a mut [T],
}

impl<T> Deref for TensorSliceMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T> DerefMut for TensorSliceMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.slice
    }
}

impl<T: fmt::Debug> fmt::Debug for TensorSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.slice, f)
    }
}
