//! Tensors on top of the allocators: PyTorch's Tensor -> TensorImpl -> Storage -> DataPtr ->
//! Allocator chain, in Rust.
//!
//! - [`Storage`]: reference-counted bytes from an [`Allocator`](tensormem::Allocator) (returned
//!   exactly once, when the last tensor using them goes), allocated lazily on first use, or
//!   mapped read-only from a file for model weights.
//! - [`Tensor`]: sizes, strides (in elements; 0 on broadcast dimensions), a storage offset and
//!   a [`DType`]. Views (`select`, `narrow`, `slice`, `transpose`, `permute`, `expand`,
//!   `view`, `as_strided`, ...) share the storage and copy nothing.
//! - Kernels run on one iteration engine in the spirit of PyTorch's `TensorIterator`
//!   (broadcast, reorder, coalesce, cache-tiled transposed inputs, rayon above a size
//!   threshold) and allocate their output through the allocator of their first input.
//!
//! The seed example: a row of one random 3x4 tensor broadcast over another, through a
//! tracking allocator; once the result is dropped, nothing is live.
//!
//! ```
//! use std::sync::Arc;
//! use tensormem_tensor::{Tensor, TensorOptions};
//! use tensormem::{AllocatorRegistry, TrackingAllocator};
//!
//! let tracker = Arc::new(TrackingAllocator::new(AllocatorRegistry::global().get()));
//! let opts = TensorOptions::new().allocator(tracker.clone()).seed(0);
//! let res = Tensor::rand(&[3, 4], &opts)?.select(0, 0)?.add(&Tensor::rand(&[3, 4], &opts)?)?;
//! assert_eq!(res.sizes(), [3, 4]);
//! let live = tracker.live_chunks();
//! assert_eq!(live.len(), 1); // only the 3x4 output
//! // 48 bytes asked for; what is set aside depends on the allocator (jemalloc's size class
//! // for 48 bytes is 64), so the check is on the request.
//! assert_eq!(live[0].requested_size, 3 * 4 * 4);
//! drop(res);
//! assert_eq!(tracker.sizes().live_bytes, 0);
//! # Ok::<(), tensormem_tensor::TensorError>(())
//! ```

mod core;
mod create;
mod display;
mod dtype;
mod error;
mod halfconv;
mod iter;
// The folders show the design: portable kernels in `ops/` (module `kernels`), the code written
// for one instruction set (dispatch, switches, vector math, F16C, lookup tables, AMX) in `cpu/`.
#[path = "ops/mod.rs"]
mod kernels;
mod like;
mod num;
mod operators;
mod options;
mod parallel;
mod quant;
mod safetensors;
mod shape;
mod storage;
mod strides;
mod to_allocator;
mod view;
#[path = "cpu/vmath/mod.rs"]
mod vmath;

pub use self::core::Tensor;
pub use dtype::{DType, Element, QUANT_BLOCK};
pub use error::{Result, TensorError};
pub use kernels::{
    AMX_ENV, AVX2_BLOCKS_ENV, AVX512_BF16_ENV, AVX512_BLOCKS_ENV, CPU_CAPABILITY_ENV, HALF_TABLES_ENV, Scalar,
    amx_enabled, avx2_blocks_enabled, avx512_bf16_enabled, avx512_blocks_enabled, cpu_capability, half_tables_enabled,
    set_amx, set_avx2_blocks, set_avx512_bf16, set_avx512_blocks, set_half_tables,
};
pub use like::{TensorSlice, TensorSliceMut};
pub use options::{DEFAULT_SEED, Generator, TensorOptions, manual_seed};
pub use parallel::{
    DEFAULT_KERNEL_SPIN, KERNEL_SPIN_ENV, NUM_THREADS_ENV, kernel_spin, num_threads, set_kernel_spin, set_num_threads,
};
pub use quant::{dequantize, quantize};
pub use safetensors::{SafeTensors, save_safetensors};
pub use storage::{STORAGE_ALIGNMENT, Storage};
