//! CUDA device memory (feature `cuda`): the driver API through `cudarc`, loaded at run time, so
//! this builds and runs on machines without CUDA (constructors then return
//! [`CudaError::NoDriver`]).
//!
//! - [`CudaDevice`]: a device and its primary context; free/total memory; host-device copies.
//! - [`CudaSubAllocator`] + [`CudaMemory`]: device memory for the
//!   [`BfcAllocator`](crate::BfcAllocator), by `cuMemAlloc` regions or expandable
//!   (`cuMemAddressReserve`, then one `cuMemCreate` + `cuMemMap` per granule, so that free
//!   granules go back and move like host pages: [`UnitMemory`](crate::UnitMemory)).
//! - [`CudaEvents`]: the events of a [`StreamOrderedBfc`](crate::StreamOrderedBfc) over device
//!   memory (what the registry's `cuda:N` is), which ties blocks to the streams they are
//!   allocated for.
//! - [`CudaAsyncAllocator`]: stream-ordered allocation from a CUDA memory pool.
//! - [`CudaHostAllocator`]: pinned host memory.
//! - [`TensormemSlice`]: a block of any of these device allocators lent to cudarc as a
//!   `CudaSlice`, for kernels, cuBLAS and copies written against cudarc ([`cudarc`], re-exported:
//!   the version whose `CudaSlice` and `CudaStream` these types take and give).
//!
//! Every allocator here reports its [`MemorySpace`](crate::MemorySpace); device memory is never
//! read or written on the host by tensormem.

mod async_alloc;
mod driver;
mod events;
mod host;
mod memory;
mod slice;

/// The cudarc crate this module is built on (driver API loaded at run time; `nvrtc` for
/// [`Ptx`](cudarc::nvrtc::Ptx)), so that code lending blocks to cudarc names the same version.
pub use cudarc;

pub use async_alloc::CudaAsyncAllocator;
pub use driver::{CudaDevice, CudaError, device_count, driver_present};
pub use events::{CudaEvent, CudaEvents};
pub use host::CudaHostAllocator;
pub use memory::{CudaMemory, CudaSubAllocator};
pub use slice::{SliceError, TensormemSlice};
