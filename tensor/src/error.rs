//! [`TensorError`]: every way a tensor operation can refuse its inputs.

use std::path::PathBuf;

use tensormem::allocators::AllocError;

use super::{DType, Tensor};

/// Why a tensor operation failed. Every variant names the operation (`op`: the method that
/// was called, `sum_dim` or `add_scalar`, also where it works through another) and the shapes
/// involved, so the message alone says what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// Two shapes that cannot be broadcast together.
    #[error(
        "{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast (dimension {dim} from the right: {lhs_size} vs {rhs_size})"
    )]
    Broadcast {
        /// The operation.
        op: &'static str,
        /// Left operand's shape.
        lhs: Vec<usize>,
        /// Right operand's shape.
        rhs: Vec<usize>,
        /// The first incompatible dimension, counted from the right (0 = last).
        dim: usize,
        /// Its size on the left.
        lhs_size: usize,
        /// Its size on the right.
        rhs_size: usize,
    },
    /// A dimension index outside the `-positions..positions` the operation accepts (`ndim`
    /// positions for most ops, one for a 0-d tensor where PyTorch wraps it, `ndim + 1` for
    /// ops that insert a dimension, none for ops that need a dimension to work on).
    #[error("{op}: dimension {dim} is out of range for a tensor of shape {shape:?} ({})", dim_range(*positions))]
    DimOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension that was asked for.
        dim: isize,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// How many positions the operation accepts: valid dimensions are `-positions` to
        /// `positions - 1`; 0 when the tensor has no dimension the operation can use.
        positions: usize,
    },
    /// The same dimension given twice (`permute`).
    #[error("{op}: dimension {dim} appears more than once in {dims:?} (tensor of shape {shape:?})")]
    RepeatedDim {
        /// The operation.
        op: &'static str,
        /// The repeated dimension.
        dim: isize,
        /// All dimensions given.
        dims: Vec<isize>,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// An index outside `-size..size` of a dimension.
    #[error("{op}: index {index} is out of range for dimension {dim} of size {size} (tensor of shape {shape:?})")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// The index that was asked for.
        index: isize,
        /// The dimension it indexes.
        dim: usize,
        /// The dimension's size.
        size: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A wrong number of indices for element access.
    #[error("{op}: {given} indices given for a tensor of shape {shape:?}")]
    IndexCount {
        /// The operation.
        op: &'static str,
        /// How many indices were given.
        given: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A range (`narrow`) that does not fit in its dimension (`slice` clamps its bounds).
    #[error(
        "{op}: range start {start}, length {length} does not fit in dimension {dim} of size {size} (tensor of shape {shape:?})"
    )]
    RangeOutOfBounds {
        /// The operation.
        op: &'static str,
        /// The dimension.
        dim: usize,
        /// The start of the range.
        start: isize,
        /// Its length.
        length: isize,
        /// The dimension's size.
        size: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A zero step, chunk count or split size.
    #[error("{op}: {what} must be greater than zero (tensor of shape {shape:?})")]
    ZeroArgument {
        /// The operation.
        op: &'static str,
        /// Which argument (`step`, `chunks`, `split_size`).
        what: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A shape whose element count differs from the tensor's (`view`, `reshape`).
    #[error("{op}: shape {target:?} is invalid for a tensor of shape {shape:?} ({numel} elements)")]
    NumelMismatch {
        /// The operation.
        op: &'static str,
        /// The shape asked for (`-1` = inferred).
        target: Vec<isize>,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The tensor's element count.
        numel: usize,
    },
    /// `view` of a tensor whose strides cannot express the new shape without a copy.
    #[error(
        "{op}: a tensor of shape {shape:?} and strides {strides:?} cannot be viewed as {target:?} without a copy; use reshape()"
    )]
    NotViewable {
        /// The operation.
        op: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The tensor's strides.
        strides: Vec<usize>,
        /// The shape asked for.
        target: Vec<usize>,
    },
    /// A size that does not match what the operation needs (`from_vec`, `cat`, `t`...). The
    /// message names `target` unless it is empty (no shape was asked for), and `shape` unless
    /// both are (no tensor was given).
    #[error("{op}: {}{reason}", asked(target, shape))]
    BadShape {
        /// The operation.
        op: &'static str,
        /// The tensor's (or data's) shape.
        shape: Vec<usize>,
        /// The shape asked for.
        target: Vec<usize>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Signed sizes or dimension indices that the operation cannot take: `expand` (a negative
    /// size other than `-1`, `-1` for a new dimension, fewer sizes than dimensions, a
    /// dimension of size other than 1 changed), `permute` (not one index per dimension).
    #[error("{op}: {args:?} cannot be used with a tensor of shape {shape:?}: {reason}")]
    InvalidArguments {
        /// The operation.
        op: &'static str,
        /// The sizes or dimensions given, as given.
        args: Vec<isize>,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// A layout that reaches outside its storage (`as_strided`).
    #[error(
        "{op}: sizes {sizes:?}, strides {strides:?} and offset {offset} reach element {needed} but the storage holds {available} elements"
    )]
    OutOfStorage {
        /// The operation.
        op: &'static str,
        /// Sizes asked for.
        sizes: Vec<usize>,
        /// Strides asked for.
        strides: Vec<usize>,
        /// Storage offset asked for.
        offset: usize,
        /// Elements the layout needs (one past the last element it reaches).
        needed: usize,
        /// Elements the storage holds.
        available: usize,
    },
    /// A typed access with the wrong Rust type (`to_vec::<i32>` on an `f32` tensor).
    #[error("{op}: the tensor holds {actual} but {expected} was asked for (shape {shape:?})")]
    WrongType {
        /// The operation.
        op: &'static str,
        /// The dtype of the Rust type asked for.
        expected: DType,
        /// The tensor's dtype.
        actual: DType,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A dtype the operation does not support.
    #[error("{op}: not supported for dtype {dtype} (shape {shape:?}){}", if hint.is_empty() { String::new() } else { format!("; {hint}") })]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype.
        dtype: DType,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// What to do instead (may be empty).
        hint: &'static str,
    },
    /// Two dtypes with no common type: a quantised dtype with any dtype, itself included
    /// (quantised blocks are stored and converted, not computed on).
    #[error("{op}: no common dtype for {lhs} and {rhs}{}", if lhs.is_quantized() || rhs.is_quantized() {
        "; quantised tensors are not computed on directly: dequantize with to_dtype(DType::F32) first"
    } else {
        ""
    })]
    NoCommonDType {
        /// The operation.
        op: &'static str,
        /// Left dtype.
        lhs: DType,
        /// Right dtype.
        rhs: DType,
    },
    /// Matrix product operands whose inner dimensions differ.
    #[error(
        "matmul: shapes {lhs:?} and {rhs:?} cannot be multiplied ({lhs_inner} vs {rhs_inner} in the inner dimension)"
    )]
    MatmulShape {
        /// Left operand's shape.
        lhs: Vec<usize>,
        /// Right operand's shape.
        rhs: Vec<usize>,
        /// The left operand's last dimension.
        lhs_inner: usize,
        /// The right operand's contracted dimension.
        rhs_inner: usize,
    },
    /// `item` on a tensor with other than one element.
    #[error("{op}: a tensor with {numel} elements (shape {shape:?}) cannot be converted to a scalar")]
    NotAScalar {
        /// The operation.
        op: &'static str,
        /// Its element count.
        numel: usize,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// An in-place output that shares some, but not all, of its memory with an input.
    #[error(
        "{op}: the output (shape {output:?}) partially overlaps input {input} (shape {input_shape:?}); clone the input first"
    )]
    PartialOverlap {
        /// The operation.
        op: &'static str,
        /// The output's shape.
        output: Vec<usize>,
        /// Which input (0-based).
        input: usize,
        /// That input's shape.
        input_shape: Vec<usize>,
    },
    /// An in-place output in which several elements share one memory location (an expanded view).
    #[error(
        "{op}: more than one element of the output (shape {shape:?}, strides {strides:?}) refers to a single memory location; call contiguous() first"
    )]
    InternalOverlap {
        /// The operation.
        op: &'static str,
        /// The output's shape.
        shape: Vec<usize>,
        /// The output's strides.
        strides: Vec<usize>,
    },
    /// A write to memory mapped from a file.
    #[error(
        "{op}: the tensor (shape {shape:?}) is a read-only view of a mapped file; clone it with contiguous() or to_dtype() first"
    )]
    ReadOnly {
        /// The operation.
        op: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A byte range that does not fit in the file being mapped.
    #[error("map_file: bytes {offset}..{end} of {path:?} do not fit in the file ({file_len} bytes)", end = *offset as u128 + *len as u128)]
    FileRange {
        /// The file.
        path: PathBuf,
        /// The requested offset.
        offset: u64,
        /// The requested length.
        len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A mapped byte range that cannot hold the dtype asked for.
    #[error("{op}: {reason} (offset {offset}, {len} bytes, dtype {dtype}, shape {shape:?})")]
    BadMapping {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: &'static str,
        /// Byte offset in the file.
        offset: u64,
        /// Bytes mapped.
        len: usize,
        /// The dtype asked for.
        dtype: DType,
        /// The shape asked for.
        shape: Vec<usize>,
    },
    /// Reading or mapping a file failed.
    #[error("{op}: {path:?}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The allocator hands out device memory, which host code (every tensor kernel, zero
    /// fill, element access) must not touch.
    #[error(
        "{op}: allocator '{allocator}' hands out {device} memory, which host tensor code cannot read or write; \
         allocate on a host allocator and copy with the device's API"
    )]
    DeviceMemory {
        /// The operation.
        op: &'static str,
        /// The allocator.
        allocator: String,
        /// Where its memory lives.
        device: tensormem::allocators::MemorySpace,
    },
    /// Bytes could not be moved to or from device memory (no driver, no such device, the
    /// `cuda` feature missing).
    #[error("{op}: {source}")]
    Transfer {
        /// The operation.
        op: &'static str,
        /// Why.
        source: tensormem::allocators::transfer::TransferError,
    },
    /// This thread holds a slice of the storage ([`Tensor::as_slice`](super::Tensor::as_slice)
    /// or [`Tensor::as_mut_slice`](super::Tensor::as_mut_slice)) that the operation's access
    /// conflicts with: waiting for the lock would wait for this thread forever.
    #[error("{op}: {}; drop the slice first, or the thread would wait for itself", if *mutable { "this thread holds a mutable slice (as_mut_slice) of the tensor's storage" } else { "the operation writes a storage this thread holds a slice (as_slice) of" })]
    Borrowed {
        /// The operation.
        op: &'static str,
        /// Whether the slice held is mutable (a read-only slice conflicts only with writes).
        mutable: bool,
    },
    /// The operation needs a contiguous tensor (direct access to its elements as a slice).
    #[error("{op}: the tensor (shape {shape:?}, strides {strides:?}) is not contiguous; call contiguous() first")]
    NotContiguous {
        /// The operation.
        op: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Its strides.
        strides: Vec<usize>,
    },
    /// Index values (an index tensor's elements) outside the dimension they index.
    #[error("{op}: index {index} is out of range for dimension {dim} of size {size} (tensor of shape {shape:?})")]
    IndexValue {
        /// The operation.
        op: &'static str,
        /// The offending index value.
        index: i64,
        /// The dimension indexed.
        dim: usize,
        /// Its size.
        size: usize,
        /// The indexed tensor's shape.
        shape: Vec<usize>,
    },
    /// Tensors to join (`cat`, `stack`) that do not fit together.
    #[error("{op}: tensor {index} has shape {shape:?}, which does not match {expected:?} {reason}")]
    Mismatch {
        /// The operation.
        op: &'static str,
        /// Which tensor of the list.
        index: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// The shape it should have (the first tensor's).
        expected: Vec<usize>,
        /// In what way.
        reason: &'static str,
    },
    /// A file of tensors (safetensors) that cannot be read as one.
    #[error("{op}: {path}: {reason}")]
    BadFile {
        /// The operation.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Splitting an empty tensor would make more views than allowed.
    #[error(
        "{op}: cutting an empty tensor of shape {shape:?} would make {pieces} views of nothing (at most {limit}); \
         empty tensors need no splitting"
    )]
    TooManyViews {
        /// The operation.
        op: &'static str,
        /// The views it would make.
        pieces: usize,
        /// The most allowed.
        limit: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A byte size that does not fit in `usize`.
    #[error("{op}: shape {shape:?} of {dtype} needs more bytes than fit in memory")]
    SizeOverflow {
        /// The operation.
        op: &'static str,
        /// The shape.
        shape: Vec<usize>,
        /// The dtype.
        dtype: DType,
    },
    /// A range that `arange` cannot make: a zero or non-finite argument, a step that goes away
    /// from `end`, more elements than fit, or (for an integer dtype) a start or step outside `i64`.
    #[error("{op}: cannot make the range from {start} to {end} by {step}: {reason}")]
    BadRange {
        /// The operation.
        op: &'static str,
        /// The first value.
        start: f64,
        /// The bound, excluded.
        end: f64,
        /// The step.
        step: f64,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// No default allocator: the global registry is misconfigured.
    #[error("{op}: no allocator: {source}")]
    Registry {
        /// The operation.
        op: &'static str,
        /// The registry's error.
        source: tensormem::RegistryError,
    },
    /// The allocator refused the tensor's memory.
    #[error("{op}: {source}")]
    Alloc {
        /// The operation.
        op: &'static str,
        /// The allocator's error.
        source: AllocError,
    },
}

impl TensorError {
    /// `op` refusing the quantised tensor `t`: it computes on plain values only.
    pub(crate) fn quantized(op: &'static str, t: &Tensor) -> TensorError {
        TensorError::UnsupportedDType {
            op,
            dtype: t.dtype(),
            shape: t.sizes().to_vec(),
            hint: "dequantize with to_dtype(DType::F32) first",
        }
    }
}

/// Shorthand for results of tensor operations.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;

/// The valid dimensions of [`TensorError::DimOutOfRange`], in words.
fn dim_range(positions: usize) -> String {
    match positions {
        0 => "it needs a tensor with at least one dimension".to_string(),
        n => format!("expected {} to {}", -(n as isize), n - 1),
    }
}

/// "cannot use shape T with a tensor of shape S: " where a shape was asked for, else "a tensor
/// of shape S: ", else nothing (`cat` of no tensors: the reason says it all).
fn asked(target: &[usize], shape: &[usize]) -> String {
    match (target.is_empty(), shape.is_empty()) {
        (false, _) => format!("cannot use shape {target:?} with a tensor of shape {shape:?}: "),
        (true, false) => format!("a tensor of shape {shape:?}: "),
        (true, true) => String::new(),
    }
}
