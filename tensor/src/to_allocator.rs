//! [`Tensor::to_allocator`]: a tensor's copy in another allocator's memory, host or device
//! (PyTorch's `tensor.to(device)`).

use std::sync::Arc;

use tensormem::allocators::{Allocator, MemorySpace, transfer};

use super::core::{Tensor, nbytes_of};
use super::shape::contiguous_strides;
use super::storage::{Storage, lock_storages};
use super::{Result, TensorError};

impl Tensor {
    /// A contiguous copy of the tensor in memory from `allocator`: host to host, host to a
    /// device, a device to the host, or between devices (through the host), with the same
    /// dtype, shape and values. Device copies go through the device's driver (`cuMemcpy`,
    /// feature `cuda`); host kernels refuse the device tensor it makes, so bring it back with
    /// `to_allocator` on a host allocator to read it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensormem::allocators::{Allocator, SystemAllocator};
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let cpu: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.view(&[2, 3])?.t()?;
    /// let y = x.to_allocator(&cpu)?;
    /// assert!(y.is_contiguous() && !y.shares_storage(&x));
    /// assert_eq!(y.storage().allocator_name(), cpu.name());
    /// assert_eq!(y.to_vec::<f32>()?, x.to_vec::<f32>()?);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when `allocator` refuses (a device out of memory names the device
    /// and its numbers), [`TensorError::Transfer`] when a device cannot be reached (no driver,
    /// no `cuda` feature); nothing is leaked either way.
    pub fn to_allocator(&self, allocator: &Arc<dyn Allocator>) -> Result<Tensor> {
        let op = "to_allocator";
        if !self.storage().memory_space().is_host_accessible() && !self.is_contiguous() {
            // A strided device view: bring its whole storage to the host, gather there.
            return self.storage_to_host(op)?.to_allocator(allocator);
        }
        // On the host, gather a strided view first; a device view is contiguous here.
        let src = if self.storage().memory_space().is_host_accessible() { self.contiguous()? } else { self.clone() };
        let nbytes = nbytes_of(op, self.sizes(), self.dtype())?;
        // SAFETY: every byte is written below (copied or zeroed), or the storage is dropped
        // unread.
        let storage = unsafe { Storage::new_uninit_in_any_space(op, nbytes, Arc::clone(allocator)) }?
            .described(self.dtype(), self.sizes());
        let written = if src.storage().is_materialized() {
            let _g = lock_storages(op, None, &[src.storage()])?;
            // SAFETY: `src` is contiguous, so its `nbytes` bytes start at its first element,
            // inside its materialised storage (in its memory space); the new storage holds
            // `nbytes` bytes in `allocator`'s space; two allocations cannot overlap; the read
            // lock keeps writers out of `src`.
            unsafe {
                transfer::copy_bytes(
                    storage.data_ptr(),
                    allocator.memory_space(),
                    src.data_ptr(),
                    src.storage().memory_space(),
                    nbytes,
                )
            }
        } else {
            // A lazy source reads as zeros: zero the copy instead of allocating the source.
            // SAFETY: the new storage holds `nbytes` bytes in `allocator`'s space.
            unsafe { transfer::fill_zero(storage.data_ptr(), allocator.memory_space(), nbytes) }
        };
        written.map_err(|source| TensorError::Transfer { op, source })?;
        Ok(Tensor::from_parts(storage, self.sizes(), contiguous_strides(self.sizes()), 0, self.dtype()))
    }

    /// The same view over a host copy of this (device) tensor's whole storage.
    fn storage_to_host(&self, op: &'static str) -> Result<Tensor> {
        let host = super::core::default_allocator(op)?;
        super::storage::check_host(op, &*host)?;
        let nbytes = self.storage().nbytes();
        let storage = if self.storage().is_materialized() {
            // SAFETY: every byte is written by the copy below, or the storage is dropped unread.
            let storage = unsafe { Storage::new_uninit_in_any_space(op, nbytes, host) }?;
            let _g = lock_storages(op, None, &[self.storage()])?;
            // SAFETY: both storages hold `nbytes` bytes, the new one on the host, this one in
            // its (device) space, materialised (checked above; storages never go back to lazy);
            // distinct allocations; the read lock keeps writers out.
            unsafe {
                transfer::copy_bytes(
                    storage.data_ptr(),
                    MemorySpace::Host,
                    self.storage().data_ptr(),
                    self.storage().memory_space(),
                    nbytes,
                )
            }
            .map_err(|source| TensorError::Transfer { op, source })?;
            storage
        } else {
            // Lazy device zeros: lazy host zeros.
            Storage::new_lazy(nbytes, host)?
        };
        Ok(Tensor::from_parts(storage, self.sizes(), self.strides(), self.storage_offset(), self.dtype()))
    }
}
