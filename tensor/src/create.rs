//! Constructors: `empty`, `zeros`, `ones`, `full`, `arange`, `rand`, `randn`, `from_vec`,
//! `from_slice`, and `from_file` (memory-mapped weights).

use std::path::Path;
use std::sync::Arc;

use tensormem::allocators::Allocator;

use super::core::{default_allocator, nbytes_of};
use super::dtype::{match_dtype, match_float};
use super::kernels::FILL_HINT;
use super::options::with_generator;
use super::shape::{checked_numel, contiguous_strides};
use super::{DType, Element, Generator, Result, Scalar, Storage, Tensor, TensorError, TensorOptions};

fn allocator_of(op: &'static str, opts: &TensorOptions) -> Result<Arc<dyn Allocator>> {
    match opts.get_allocator() {
        Some(a) => Ok(Arc::clone(a)),
        None => default_allocator(op),
    }
}

impl Tensor {
    /// A tensor whose storage is allocated on first use (OneFlow's and InferLLM's lazy
    /// allocation): nothing is asked of the allocator until the first write, read or
    /// [`materialize`](Tensor::materialize). Unlike PyTorch's `empty`, its elements then read
    /// as zeros (Rust forbids reading uninitialised memory).
    ///
    /// # Errors
    /// [`TensorError::SizeOverflow`]; [`TensorError::Registry`] without an allocator.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let t = Tensor::empty(&[1024, 1024], DType::F32)?;
    /// assert!(!t.storage().is_materialized());
    /// t.set(&[0, 0], 1.0f32)?; // the first write allocates
    /// assert!(t.storage().is_materialized());
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    pub fn empty(sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::empty_as("empty", sizes, opts.into())
    }

    /// [`empty`](Self::empty), its errors naming `op` (`zeros`, `empty_like`, ...).
    pub(crate) fn empty_as(op: &'static str, sizes: &[usize], opts: TensorOptions) -> Result<Tensor> {
        let dtype = opts.get_dtype().unwrap_or(DType::F32);
        let nbytes = nbytes_of(op, sizes, dtype)?;
        let storage = Storage::new_lazy(nbytes, allocator_of(op, &opts)?)?.described(dtype, sizes);
        Ok(Tensor::from_parts(storage, sizes, contiguous_strides(sizes), 0, dtype))
    }

    /// A tensor of zeros (lazily allocated, like [`empty`](Tensor::empty)).
    ///
    /// # Errors
    /// As [`empty`](Tensor::empty).
    pub fn zeros(sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::empty_as("zeros", sizes, opts.into())
    }

    /// A tensor of ones.
    ///
    /// # Errors
    /// As [`full`](Tensor::full).
    pub fn ones(sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_as("ones", sizes, 1.0, opts.into())
    }

    /// A tensor with every element `value` (converted as `to_dtype` converts).
    ///
    /// # Errors
    /// As [`empty`](Tensor::empty); [`TensorError::UnsupportedDType`] for quantised dtypes and
    /// for a value the dtype cannot hold, as `torch.full` refuses it: an infinity or NaN into
    /// an integer dtype, -1.0 into `u8`, 128.0 into `i8` (127.9 is 127), 1e39 into `f32`,
    /// 70000.0 into `f16`.
    pub fn full(sizes: &[usize], value: f64, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_as("full", sizes, value, opts.into())
    }

    /// [`full`](Self::full), its errors naming `op` (`ones`, `full_like`, ...).
    pub(crate) fn full_as(op: &'static str, sizes: &[usize], value: f64, opts: TensorOptions) -> Result<Tensor> {
        let dtype = opts.get_dtype().unwrap_or(DType::F32);
        if !dtype.is_quantized() && !Scalar::Float(value).fits(dtype) {
            return Err(TensorError::UnsupportedDType { op, dtype, shape: sizes.to_vec(), hint: FILL_HINT });
        }
        match_dtype!(dtype, T => {
            let v = T::from_f64(value);
            Tensor::filled(op, sizes, &opts, |_| v)
        }, _ => Err(unsupported(op, dtype, sizes)))
    }

    /// A 0-dimensional tensor holding `value`.
    ///
    /// # Errors
    /// As [`full`](Tensor::full).
    pub fn scalar(value: f64, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_as("scalar", &[], value, opts.into())
    }

    /// `start, start + step, ...` up to but excluding `end`: `ceil((end - start) / step)`
    /// elements, as `torch.arange` makes them.
    ///
    /// - A floating-point dtype holds `start + i * step` computed in `f64` and rounded once (no
    ///   accumulated rounding; PyTorch's vectorised loop can differ in the last bit).
    /// - An integer dtype first truncates `start` and `step` toward zero, as PyTorch and NumPy
    ///   do: `arange(0.0, 3.0, 0.5)` into `i64` is six zeros. The values are computed in `i64`
    ///   and wrap into a narrower dtype (`arange(250.0, 260.0, 1.0)` into `u8` ends `.., 255, 0,
    ///   1, 2, 3`).
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let x = Tensor::arange(1.0, 2.0, 0.25, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, [1.0, 1.25, 1.5, 1.75]);
    /// let down = Tensor::arange(3.0, 0.0, -1.0, DType::I64)?;
    /// assert_eq!(down.to_vec::<i64>()?, [3, 2, 1]);
    /// assert!(Tensor::arange(3.0, 0.0, 1.0, DType::I64).is_err()); // the step goes away from the end
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// [`TensorError::BadRange`] for a zero or non-finite argument, a step going away from
    /// `end` (`start == end` is an empty range, either way), more than `isize::MAX` elements,
    /// or, for an integer dtype, a start or step that does not fit in `i64`;
    /// [`TensorError::UnsupportedDType`] for bool and quantised dtypes.
    pub fn arange(start: f64, end: f64, step: f64, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let op = "arange";
        let opts = opts.into();
        let bad = |reason| TensorError::BadRange { op, start, end, step, reason };
        if !(start.is_finite() && end.is_finite() && step.is_finite()) {
            return Err(bad("start, end and step must be finite"));
        }
        if step == 0.0 {
            return Err(bad("the step must not be zero"));
        }
        if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
            return Err(bad("the step goes away from the end"));
        }
        let n = ((end - start) / step).ceil();
        if n > isize::MAX as f64 {
            return Err(bad("more elements than fit in memory"));
        }
        let dtype = opts.get_dtype().unwrap_or(DType::F32);
        let sizes = [n as usize];
        if dtype.is_integer() {
            // `i64::MIN as f64` is exact and `-(i64::MIN as f64)` is 2^63, just past `i64::MAX`.
            let to_i64 = |v: f64| (v.trunc() >= i64::MIN as f64 && v.trunc() < -(i64::MIN as f64)).then_some(v as i64);
            let (Some(first), Some(by)) = (to_i64(start), to_i64(step)) else {
                return Err(bad("an integer dtype needs a start and step that fit in i64"));
            };
            return match_dtype!(dtype, T => Tensor::filled(op, &sizes, &opts, |i| {
                T::from_i64(first.wrapping_add(by.wrapping_mul(i as i64)))
            }), _ => Err(unsupported(op, dtype, &sizes)));
        }
        match_float!(dtype, T => Tensor::filled(op, &sizes, &opts, |i| T::from_f64(start + i as f64 * step)),
            _ => Err(unsupported(op, dtype, &sizes)))
    }

    /// Uniform random values in `[0, 1)` (floating dtypes), from the options' seed or the
    /// global generator ([`manual_seed`](super::manual_seed)).
    ///
    /// # Errors
    /// As [`empty`](Tensor::empty); [`TensorError::UnsupportedDType`] for non-float dtypes.
    pub fn rand(sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        let dtype = opts.get_dtype().unwrap_or(DType::F32);
        // Only as many random bits as the mantissa holds, so the value never rounds up to 1.
        let bits = match dtype {
            DType::F16 => 11,
            DType::BF16 => 8,
            DType::F32 => 24,
            _ => 53,
        };
        let scale = 1.0 / (1u64 << bits) as f64;
        match_float!(dtype, T => with_generator(&opts, |g: &mut Generator| {
            Tensor::filled("rand", sizes, &opts, |_| T::from_f64((g.next_u64() >> (64 - bits)) as f64 * scale))
        }), _ => Err(unsupported("rand", dtype, sizes)))
    }

    /// Standard normal random values (floating dtypes); seeded as [`rand`](Tensor::rand).
    ///
    /// # Errors
    /// As [`rand`](Tensor::rand).
    pub fn randn(sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        let dtype = opts.get_dtype().unwrap_or(DType::F32);
        match_float!(dtype, T => with_generator(&opts, |g: &mut Generator| {
            Tensor::filled("randn", sizes, &opts, |_| T::from_f64(g.normal()))
        }), _ => Err(unsupported("randn", dtype, sizes)))
    }

    /// A tensor of `sizes` holding `data` (row-major), copied into the options' allocator. A
    /// dtype in the options converts the values.
    ///
    /// # Errors
    /// [`TensorError::BadShape`] when `data.len()` is not the element count of `sizes`.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2], DType::F64)?;
    /// assert_eq!(t.to_vec::<f64>()?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::from_slice(&data, sizes, opts)
    }

    /// Like [`from_vec`](Tensor::from_vec), from a slice.
    ///
    /// # Errors
    /// As [`from_vec`](Tensor::from_vec).
    pub fn from_slice<T: Element>(data: &[T], sizes: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        if checked_numel(sizes) != Some(data.len()) {
            return Err(TensorError::BadShape {
                op: "from_vec",
                shape: vec![data.len()],
                target: sizes.to_vec(),
                reason: "the data's length must be the shape's element count",
            });
        }
        let t = Tensor::filled("from_vec", sizes, &opts, |i| data[i])?;
        match opts.get_dtype() {
            Some(d) if d != T::DTYPE => t.to_dtype(d),
            _ => Ok(t),
        }
    }

    /// A read-only tensor over `len = dtype.size_of(numel)` bytes of the file at `path`,
    /// from byte `offset`: model weights are mapped, not copied. The storage's allocator name
    /// is `mmap`; writes fail with [`TensorError::ReadOnly`]; views and kernels work.
    ///
    /// # Errors
    /// [`TensorError::FileRange`] when the bytes are past the end of the file;
    /// [`TensorError::BadMapping`] when `offset` is not a multiple of the element size or a
    /// `bool` byte is neither 0 nor 1; [`TensorError::Io`].
    ///
    /// # Safety
    /// As [`Storage::map_file`]: the file must not change or shrink while mapped.
    pub unsafe fn from_file(path: impl AsRef<Path>, offset: u64, dtype: DType, sizes: &[usize]) -> Result<Tensor> {
        let op = "from_file";
        let len = nbytes_of(op, sizes, dtype)?;
        let align = dtype.element_size().unwrap_or(2) as u64;
        let bad = |reason| TensorError::BadMapping { op, reason, offset, len, dtype, shape: sizes.to_vec() };
        if !offset.is_multiple_of(align) {
            return Err(bad("the offset is not a multiple of the element size"));
        }
        // SAFETY: forwarded to our caller.
        let storage = unsafe { Storage::map_file(path, offset, len) }?;
        let t = Tensor::from_parts(storage, sizes, contiguous_strides(sizes), 0, dtype);
        if dtype == DType::Bool && len > 0 {
            // SAFETY: the mapping holds `len` readable bytes, read as bytes.
            let bytes = unsafe { core::slice::from_raw_parts(t.data_ptr() as *const u8, len) };
            if bytes.iter().any(|&b| b > 1) {
                return Err(bad("a bool tensor's bytes must all be 0 or 1"));
            }
        }
        Ok(t)
    }

    /// A contiguous tensor with element `i` set to `f(i)`.
    pub(crate) fn filled<T: Element>(
        op: &'static str,
        sizes: &[usize],
        opts: &TensorOptions,
        mut f: impl FnMut(usize) -> T,
    ) -> Result<Tensor> {
        let allocator = allocator_of(op, opts)?;
        if !allocator.memory_space().is_host_accessible() {
            // Device memory: built on the host (the registry's default), then copied over in
            // one transfer.
            let host = default_allocator(op)?;
            super::storage::check_host(op, &*host)?;
            return Tensor::filled(op, sizes, &opts.clone().allocator(host), f)?.to_allocator(&allocator);
        }
        // SAFETY: the loop below writes all `numel` elements before the tensor is returned.
        let t = unsafe { Tensor::uninit(op, sizes, T::DTYPE, allocator) }?;
        let p = t.data_ptr() as *mut T;
        for i in 0..t.numel() {
            // SAFETY: `p` is the start of a fresh, 64-byte aligned allocation of `numel`
            // elements of `T`; `i < numel`.
            unsafe { p.add(i).write(f(i)) };
        }
        Ok(t)
    }
}

/// A dtype the creation `op` cannot fill: a quantised one (any op), or a non-float one
/// (`rand`, `randn`).
fn unsupported(op: &'static str, dtype: DType, sizes: &[usize]) -> TensorError {
    let hint = if dtype.is_quantized() {
        "quantised tensors are made by quantising: create the values in f32 and convert with to_dtype"
    } else {
        "random values are made in floating-point dtypes; convert with to_dtype"
    };
    TensorError::UnsupportedDType { op, dtype, shape: sizes.to_vec(), hint }
}
