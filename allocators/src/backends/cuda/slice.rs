//! [`TensormemSlice`]: a block of a tensormem device allocator lent to cudarc as a
//! `CudaSlice`, so that Rust GPU code written against cudarc (kernels, cuBLAS, copies) runs on
//! memory from `cuda:N`, with leak checks, scopes, history and metrics seeing it.

use core::alloc::Layout;
use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

use crate::{AllocError, AllocationAttributes, Allocator, MemorySpace, StreamError, StreamId};

/// Alignment of the blocks lent to cudarc: what `cuMemAlloc` guarantees, so that any kernel
/// written for cudarc's own allocations can use them.
const ALIGN: usize = 256;

/// Why a block could not be lent to cudarc.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SliceError {
    /// The allocator refused the request.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The allocator does not hand out memory of the stream's device.
    #[error("allocator {allocator} holds {space:?} memory, not memory of cuda:{ordinal} (the stream's device)")]
    WrongDevice {
        /// The allocator's name.
        allocator: String,
        /// Where its memory lives.
        space: MemorySpace,
        /// The stream's device.
        ordinal: u32,
    },
}

/// A block of device memory from a tensormem allocator, lent to cudarc as a `CudaSlice<T>` of
/// `len` elements on `stream`. It dereferences to the slice, so cudarc's launches, copies and
/// cuBLAS calls take it where they take a `CudaSlice`; dropping it takes the slice back from
/// cudarc (which does not free it) and returns the block to the allocator, which records the
/// free as it records any.
///
/// ```no_run
/// use std::sync::Arc;
/// use cudarc::driver::CudaContext;
/// use tensormem_allocators::cuda::{CudaDevice, CudaSubAllocator, TensormemSlice};
/// use tensormem_allocators::{Allocator, BfcAllocator};
///
/// let bfc: Arc<dyn Allocator> = Arc::new(
///     BfcAllocator::builder()
///         .name("cuda:0")
///         .memory_limit(1 << 30)
///         .sub_allocator(Arc::new(CudaSubAllocator::new(CudaDevice::open(0)?)))
///         .build()?,
/// );
/// let stream = CudaContext::new(0)?.default_stream();
/// let mut x: TensormemSlice<f32> = TensormemSlice::alloc(&bfc, &stream, 1024)?;
/// stream.memcpy_htod(&vec![1.0f32; 1024], &mut *x)?;
/// let back = stream.clone_dtoh(&*x)?;
/// assert_eq!(back[1023], 1.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # The stream rule
/// The block is allocated for the slice's stream ([`AllocationAttributes::stream`]). When the
/// slice drops, kernels already queued on that stream may still use the memory and the block
/// goes back to the allocator at once: a stream-ordered allocator (the registry's `cuda:N`, a
/// [`StreamOrderedBfc`](crate::StreamOrderedBfc), [`CudaAsyncAllocator`](super::CudaAsyncAllocator))
/// hands it only to later work of the same stream, which is queued after them. Work on another
/// stream that uses the slice must be recorded with [`record_stream`](Self::record_stream)
/// before the slice drops. With an allocator that does not order by stream, every user of its
/// blocks must run on one stream, or synchronise before the slice drops.
pub struct TensormemSlice<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    allocator: Arc<dyn Allocator>,
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `ptr` is a device address that is never dereferenced on the host (the memory is
// reached through the slice); the slice moves between threads as cudarc allows, and allocators
// are `Send + Sync`.
unsafe impl<T> Send for TensormemSlice<T> where CudaSlice<T>: Send {}
// SAFETY: as above; shared access gives out only `&CudaSlice<T>`.
unsafe impl<T> Sync for TensormemSlice<T> where CudaSlice<T>: Sync {}

impl<T: DeviceRepr> TensormemSlice<T> {
    /// Allocates `len` elements of `T` from `allocator` (device memory of `stream`'s device)
    /// and lends them to cudarc on `stream`. The memory is not initialised.
    ///
    /// # Errors
    /// [`SliceError::WrongDevice`] when the allocator's memory is not the stream's device's;
    /// [`SliceError::Alloc`] when the allocator refuses (out of memory, over its limit, or a
    /// size that overflows). Never panics.
    pub fn alloc(allocator: &Arc<dyn Allocator>, stream: &Arc<CudaStream>, len: usize) -> Result<Self, SliceError> {
        let ordinal = u32::try_from(stream.context().ordinal()).unwrap_or(u32::MAX);
        let space = allocator.memory_space();
        if space != (MemorySpace::Device { ordinal }) {
            return Err(SliceError::WrongDevice { allocator: allocator.name().to_string(), space, ordinal });
        }
        let element = Layout::new::<T>();
        let layout = element
            .size()
            .checked_mul(len)
            .and_then(|bytes| Layout::from_size_align(bytes.max(1), ALIGN.max(element.align())).ok())
            .ok_or_else(|| AllocError::array_overflow(len, element, allocator.name()))?;
        let attrs = AllocationAttributes::DEFAULT.on_stream(StreamId::from_raw(stream.cu_stream() as u64));
        let ptr = allocator.allocate_raw(layout, &attrs)?;
        // SAFETY: `ptr` is device memory of the stream's device (checked above) valid for
        // `len` elements of `T` until it is returned in `drop`, which takes the slice back with
        // `leak` first, so cudarc never frees it.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr.as_ptr() as u64, len) };
        Ok(Self { slice: ManuallyDrop::new(slice), allocator: allocator.clone(), ptr, layout })
    }
}

impl<T> TensormemSlice<T> {
    /// The allocator the block came from.
    pub fn allocator(&self) -> &Arc<dyn Allocator> {
        &self.allocator
    }

    /// The block's device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Records that work queued on `stream` (not the slice's own) uses the block, so that its
    /// allocator reuses it only after that work (PyTorch's `record_stream`).
    ///
    /// # Errors
    /// [`StreamError::NotStreamOrdered`] when the allocator does not order blocks by stream
    /// (synchronise `stream` before the slice drops instead).
    pub fn record_stream(&self, stream: &CudaStream) -> Result<(), StreamError> {
        let Some(ordered) = self.allocator.stream_ordered() else {
            return Err(StreamError::NotStreamOrdered { allocator: self.allocator.name().to_string() });
        };
        ordered.record_stream(self.ptr, StreamId::from_raw(stream.cu_stream() as u64))
    }
}

impl<T> Deref for TensormemSlice<T> {
    type Target = CudaSlice<T>;

    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for TensormemSlice<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for TensormemSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken once, here, and `self.slice` is not used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // cudarc orders its stream after the slice's recorded reads and writes and lets go of
        // the pointer without freeing it.
        let _ = slice.leak();
        // SAFETY: `ptr` came from this allocator with `layout` and is returned once; cudarc no
        // longer holds it (the stream rule in the type's docs covers pending kernels).
        unsafe { self.allocator.deallocate_raw(self.ptr, self.layout) };
    }
}

impl<T> fmt::Debug for TensormemSlice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensormemSlice")
            .field("allocator", &self.allocator.name())
            .field("ptr", &self.ptr)
            .field("len", &self.slice.len())
            .finish()
    }
}
