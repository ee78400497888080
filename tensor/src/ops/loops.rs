//! Inner loops of the element-wise kernels, and how an existing output (in-place, `out=`) is
//! checked and prepared.
//!
//! Every kernel computes in one type `T` (the operands' result type) and writes `O` (`T`, or
//! `bool` for comparisons). Three kinds of 1-D runs:
//! - **distinct**: operands already of type `T`, output of type `O`, the output sharing no
//!   memory with the inputs (a fresh output, or an `out=` tensor apart from them): slices, with
//!   contiguous, broadcast-scalar and strided variants the compiler vectorises;
//! - **in place**: the output is exactly the first input (`a.add_(b)`), same types: one mutable
//!   slice read and written element by element, vectorised the same way;
//! - **converting**: anything else (mixed dtypes, an in-place op computing in a wider type, an
//!   `out=` tensor of another dtype, an output aliasing the second input): blocks of 128
//!   elements are loaded (converted to `T`) into stack buffers, computed, and stored (converted
//!   to the output's dtype), so nothing is copied through memory and every element is read
//!   before it is written.
//!
//! Loops that read or write f16/bf16 elements run compiled for the CPU's widest vector
//! extension (see [`isa`](super::isa)): their per-element conversions are arithmetic the
//! compiler vectorises, 16 lanes at a time with AVX-512. Strided runs of halves go through the
//! converting blocks (gathered, computed vectorised, scattered), and so do strided casts that
//! round to halves or widen f16. Those blocks load and store f16 with F16C's conversions.
//! Arithmetic whose operands and output are all f16 runs as the f32 kernel between F16C's
//! conversions: fused into one pass over contiguous runs (and broadcast values) by
//! [`super::f16c`], through the converting blocks over strided ones.
//!
//! An existing output is refused, as in PyTorch, when it is read-only, has a dimension of
//! stride 0 (several elements at one address), or partially overlaps an input when both are
//! dense (each covers a range of memory with no gaps: `x.add_(x.t())`). An input sharing memory
//! with the output is used as it is when it covers exactly the same elements or none of the
//! output's range; otherwise (strided views such as `b[0::2].add_(b[1::2])`, or the rotary
//! `a[:, :2].sub_(a[:, 2:])`) it is copied first, so results read as if every input were read
//! before anything was written.

use core::any::TypeId;
use core::mem::{MaybeUninit, size_of};
use core::slice;

use crate::dtype::{cast, match_dtype};
use crate::iter::{Operand, Plan};
use crate::shape::{Dims, broadcast_strides_to, extent};
use crate::storage::lock_storages;
use crate::strides::is_dense;
use crate::{DType, Element, Result, Tensor, TensorError};

use half::f16;
use smallvec::SmallVec;

use super::f16c;
use super::isa::{Isa, for_types, is_half, vectorised};

/// Elements per block of the converting loops.
const BLOCK: usize = 128;

/// Whether the kernel writes a fresh output or an existing tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dest {
    /// Just allocated by the caller: nobody else sees it.
    Fresh,
    /// An existing tensor (in-place or `out=`): checked and prepared by [`prepare_into`].
    Into,
}

/// `t`'s strides broadcast to `shape`.
pub(crate) fn strides_to(op: &'static str, t: &Tensor, shape: &[usize]) -> Result<Dims> {
    broadcast_strides_to(op, t.sizes(), t.strides(), shape)
}

/// Whether the layout's elements are all at different addresses (a sufficient test: sorted by
/// stride, each dimension steps over everything the smaller ones reach).
fn elements_distinct(t: &Tensor) -> bool {
    let mut dims: SmallVec<[(usize, usize); 6]> =
        t.sizes().iter().zip(t.strides()).filter(|(s, _)| **s > 1).map(|(&s, &st)| (st, s)).collect();
    dims.sort_unstable();
    let mut reach = 0usize;
    for &(stride, size) in &dims {
        if stride <= reach {
            return false;
        }
        reach = reach.saturating_add(stride.saturating_mul(size - 1));
    }
    true
}

/// What [`prepare_into`] found: the inputs to read (copies where they partially overlapped the
/// output), which of them are exactly the output, and whether runs may go in parallel.
pub(crate) struct Prepared {
    pub(crate) inputs: SmallVec<[Tensor; 2]>,
    pub(crate) alias: SmallVec<[bool; 2]>,
    pub(crate) parallel: bool,
}

/// Checks an existing output `out` of a kernel reading `inputs` (broadcast to `out`'s shape).
///
/// # Errors
/// [`TensorError::ReadOnly`]; [`TensorError::InternalOverlap`] for a stride-0 dimension of size
/// above 1 (an expanded tensor); [`TensorError::PartialOverlap`] for a dense input partially
/// overlapping a dense output; [`TensorError::Alloc`] when a copy of an overlapping input cannot
/// be made.
pub(crate) fn prepare_into(op: &'static str, out: &Tensor, inputs: &[&Tensor]) -> Result<Prepared> {
    out.check_writable(op)?;
    // As PyTorch, an empty tensor has no two elements in one place, whatever its strides.
    if out.numel() > 0 && out.sizes().iter().zip(out.strides()).any(|(&s, &st)| s > 1 && st == 0) {
        return Err(TensorError::InternalOverlap { op, shape: out.sizes().to_vec(), strides: out.strides().to_vec() });
    }
    // Layouts PyTorch accepts but whose elements cannot be shown distinct run on one thread.
    let parallel = elements_distinct(out);
    let out_range =
        (out.storage_offset(), extent(out.sizes(), out.strides(), out.storage_offset()).unwrap_or(usize::MAX));
    let mut prepared = Prepared {
        inputs: SmallVec::with_capacity(inputs.len()),
        alias: SmallVec::with_capacity(inputs.len()),
        parallel,
    };
    let out_dense = is_dense(out.sizes(), out.strides());
    for (i, t) in inputs.iter().enumerate() {
        if !t.shares_storage(out) || t.numel() == 0 || out.numel() == 0 {
            prepared.inputs.push((*t).clone());
            prepared.alias.push(false);
            continue;
        }
        let st = strides_to(op, t, out.sizes())?;
        let same = t.storage_offset() == out.storage_offset()
            && out.sizes().iter().zip(st.iter().zip(out.strides())).all(|(&s, (a, b))| s <= 1 || a == b);
        if same {
            prepared.inputs.push((*t).clone());
            prepared.alias.push(true);
            continue;
        }
        let r = (t.storage_offset(), extent(t.sizes(), t.strides(), t.storage_offset()).unwrap_or(usize::MAX));
        if r.1 <= out_range.0 || out_range.1 <= r.0 {
            prepared.inputs.push((*t).clone());
        } else if out_dense && is_dense(t.sizes(), t.strides()) {
            // Numbered among the inputs that are not the output itself (for `a.add_(b)`, `b` is 0).
            let input = i - prepared.alias.iter().filter(|&&a| a).count();
            return Err(TensorError::PartialOverlap {
                op,
                output: out.sizes().to_vec(),
                input,
                input_shape: t.sizes().to_vec(),
            });
        } else {
            // Overlapping, not the same elements: read a copy, as if read before any write.
            prepared.inputs.push(t.fresh_copy(op)?);
        }
        prepared.alias.push(false);
    }
    Ok(prepared)
}

fn operand<'a>(t: &Tensor, strides: &'a [usize]) -> Operand<'a> {
    Operand { ptr: t.data_ptr(), strides, elem: t.elem_size() }
}

/// Loads `dst.len()` values from `src` (byte stride `stride`), converted to `T`.
type LoadFn<T> = unsafe fn(*const u8, usize, &mut [T]);
/// Stores `src` to `dst` (byte stride `stride`), converted from `O`.
type StoreFn<O> = unsafe fn(*mut u8, usize, &[O]);

/// # Safety
/// `src + i * stride` for `i < dst.len()` are valid, aligned values of `S`.
unsafe fn load<S: Element, T: Element>(src: *const u8, stride: usize, dst: &mut [T]) {
    if stride == size_of::<S>() {
        if TypeId::of::<S>() == TypeId::of::<f16>() && TypeId::of::<T>() == TypeId::of::<f32>() && f16c::has_f16c() {
            // SAFETY: the function's contract, with unit stride; `S` is `f16` and `T` is `f32`.
            let (src, dst) = unsafe {
                (
                    slice::from_raw_parts(src.cast::<f16>(), dst.len()),
                    slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<f32>(), dst.len()),
                )
            };
            return f16c::widen_f16(src, dst);
        }
        // SAFETY: the function's contract, with unit stride: one slice of valid values.
        let src = unsafe { slice::from_raw_parts(src.cast::<S>(), dst.len()) };
        return vectorised!(for_types::<S, T>(), {
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = convert::<S, T>(v);
            }
        });
    }
    if TypeId::of::<S>() != TypeId::of::<T>() && for_types::<S, T>() != Isa::Baseline {
        // Strided halves to convert: gathered as they are, then converted as a contiguous run
        // (vectorised, or F16C's). Converting one at a time cost 17 instructions per f16.
        let mut raw = [S::default(); BLOCK];
        for (k, d) in dst.chunks_mut(BLOCK).enumerate() {
            for (j, r) in raw[..d.len()].iter_mut().enumerate() {
                // SAFETY: the function's contract: element `k * BLOCK + j < dst.len()`.
                *r = unsafe { src.add((k * BLOCK + j) * stride).cast::<S>().read() };
            }
            // SAFETY: `raw` holds `d.len()` valid values of `S`, with unit stride.
            unsafe { load::<S, T>(raw.as_ptr().cast(), size_of::<S>(), d) };
        }
        return;
    }
    for (i, d) in dst.iter_mut().enumerate() {
        // SAFETY: the function's contract.
        let v = unsafe { src.add(i * stride).cast::<S>().read() };
        *d = convert::<S, T>(v);
    }
}

/// # Safety
/// `dst + i * stride` for `i < src.len()` are valid for writes of an `D`, aligned.
unsafe fn store<O: Element, D: Element>(dst: *mut u8, stride: usize, src: &[O]) {
    if stride == size_of::<D>() {
        if TypeId::of::<O>() == TypeId::of::<f32>() && TypeId::of::<D>() == TypeId::of::<f16>() && f16c::has_f16c() {
            // SAFETY: the function's contract, with unit stride; `O` is `f32` and `D` is `f16`.
            let (src, dst) = unsafe {
                (
                    slice::from_raw_parts(src.as_ptr().cast::<f32>(), src.len()),
                    slice::from_raw_parts_mut(dst.cast::<MaybeUninit<f16>>(), src.len()),
                )
            };
            return f16c::narrow_f16(src, dst);
        }
        // SAFETY: the function's contract, with unit stride: one slice of writable values.
        let dst = unsafe { slice::from_raw_parts_mut(dst.cast::<MaybeUninit<D>>(), src.len()) };
        return vectorised!(for_types::<O, D>(), {
            for (d, &v) in dst.iter_mut().zip(src) {
                d.write(convert::<O, D>(v));
            }
        });
    }
    if TypeId::of::<O>() != TypeId::of::<D>() && for_types::<O, D>() != Isa::Baseline {
        // As in `load`: converted as a contiguous run, then scattered as they are.
        let mut raw = [D::default(); BLOCK];
        for (k, c) in src.chunks(BLOCK).enumerate() {
            // SAFETY: `raw` has room for `c.len()` values of `D`, with unit stride.
            unsafe { store::<O, D>(raw.as_mut_ptr().cast(), size_of::<D>(), c) };
            for (j, &v) in raw[..c.len()].iter().enumerate() {
                // SAFETY: the function's contract: element `k * BLOCK + j < src.len()`.
                unsafe { dst.add((k * BLOCK + j) * stride).cast::<D>().write(v) };
            }
        }
        return;
    }
    for (i, &v) in src.iter().enumerate() {
        // SAFETY: the function's contract.
        unsafe { dst.add(i * stride).cast::<D>().write(convert::<O, D>(v)) };
    }
}

/// `cast`, without the round trip through `f64` when the types are the same.
#[inline(always)]
fn convert<S: Element, D: Element>(v: S) -> D {
    if TypeId::of::<S>() == TypeId::of::<D>() {
        // SAFETY: `S` and `D` are the same type.
        unsafe { core::mem::transmute_copy::<S, D>(&v) }
    } else {
        cast::<S, D>(v)
    }
}

fn loader<T: Element>(dtype: DType) -> Option<LoadFn<T>> {
    match_dtype!(dtype, S => Some(load::<S, T> as LoadFn<T>), _ => None)
}

fn storer<O: Element>(dtype: DType) -> Option<StoreFn<O>> {
    match_dtype!(dtype, D => Some(store::<O, D> as StoreFn<O>), _ => None)
}

/// `out[i] = f(a[i], b[i])` over `out`'s shape, `a` and `b` broadcast to it, computed in `T`
/// and written as `O` (both converted from and to the tensors' dtypes as needed).
pub(crate) fn run_binary<T: Element, O: Element>(
    op: &'static str,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    dest: Dest,
    f: impl Fn(T, T) -> O + Sync + Send + Copy,
) -> Result<()> {
    let prepared;
    let (a, b, alias, parallel) = match dest {
        Dest::Fresh => (a, b, [false, false], true),
        Dest::Into => {
            prepared = prepare_into(op, out, &[a, b])?;
            let p = &prepared;
            (&p.inputs[0], &p.inputs[1], [p.alias[0], p.alias[1]], p.parallel)
        }
    };
    let (sa, sb) = (strides_to(op, a, out.sizes())?, strides_to(op, b, out.sizes())?);
    if out.numel() == 0 {
        // Nothing to do, whatever the sizes of the other dimensions: O(1).
        return Ok(());
    }
    a.host_ready(op)?;
    b.host_ready(op)?;
    out.host_ready(op)?;
    let (la, lb) = (
        loader::<T>(a.dtype()).ok_or_else(|| TensorError::quantized(op, a))?,
        loader::<T>(b.dtype()).ok_or_else(|| TensorError::quantized(op, b))?,
    );
    let so = storer::<O>(out.dtype()).ok_or_else(|| TensorError::quantized(op, out))?;
    let _g = lock_storages(op, (dest == Dest::Into).then(|| out.storage()), &[a.storage(), b.storage()])?;
    let plan = Plan::new(out.sizes(), [operand(out, out.strides()), operand(a, &sa), operand(b, &sb)]);
    let typed = a.dtype() == T::DTYPE && b.dtype() == T::DTYPE && out.dtype() == O::DTYPE;
    let same_type = TypeId::of::<T>() == TypeId::of::<O>();
    let f16_in_f32 = computes_f32::<T, O>() && [a.dtype(), b.dtype(), out.dtype()] == [DType::F16; 3];
    // The converting blocks read and write the operands of the kernel's types where they lie,
    // the output only when no input is it.
    let direct = Direct {
        a: a.dtype() == T::DTYPE,
        b: b.dtype() == T::DTYPE,
        out: out.dtype() == O::DTYPE && !alias[0] && !alias[1],
    };
    // Why the loops below are sound: the plan walks `out`, `a` and `b` inside their storages
    // (layouts are checked when made) with their dtypes' element sizes, which the loops read as
    // `T`/`O` only when the dtypes say so (`typed`) and convert otherwise; the guards keep other
    // writers out; runs write distinct elements of `out` (fresh, or `prepare_into` checked it,
    // else `parallel` is false), so parallel runs never write the same memory; an input that is
    // not exactly the output does not overlap it (`prepare_into` copied it otherwise).
    match (typed, alias[0], alias[1]) {
        (true, false, false) => plan.run(parallel, &|p, s, n| {
            // SAFETY: see above; no input is the output, so the output run overlaps none.
            unsafe { distinct_binary(&f, p, s, n) }
        }),
        (true, true, false) if same_type => {
            let g = move |x: T, y: T| -> T {
                let r = f(x, y);
                // SAFETY: `T` and `O` are the same type (checked above).
                unsafe { core::mem::transmute_copy::<O, T>(&r) }
            };
            plan.run(parallel, &|p, s, n| {
                // SAFETY: see above; the output is exactly the first input (same run).
                unsafe { inplace_binary(&g, p, s, n) }
            })
        }
        _ if f16_in_f32 => plan.run(parallel, &|p, s, n| {
            // SAFETY: see above; every operand is f16, `T` and `O` are `f32`; the loaders and
            // storer match the dtypes; an output run overlaps an input run only element for
            // element (an input that is exactly the output).
            unsafe { f16_binary(&f, la, lb, so, p, s, n) }
        }),
        _ => plan.run(parallel, &|p, s, n| {
            // SAFETY: see above; the loaders and storer match the operands' dtypes.
            unsafe { converting_binary(&f, la, lb, so, direct, p, s, n) }
        }),
    }
    Ok(())
}

/// Whether a kernel computing in `T` and writing `O` is an f32 kernel, which f16 tensors run
/// with F16C's conversions around it where the CPU has them ([`f16c`]).
#[inline(always)]
fn computes_f32<T: 'static, O: 'static>() -> bool {
    TypeId::of::<T>() == TypeId::of::<f32>() && TypeId::of::<O>() == TypeId::of::<f32>() && f16c::has_f16c()
}

/// `f` as the `f32` function it is.
///
/// # Safety
/// `T` and `O` are `f32`.
#[inline(always)]
unsafe fn as_f32<T: Element, O: Element>(f: &impl Fn(T, T) -> O) -> impl Fn(f32, f32) -> f32 {
    move |x: f32, y: f32| {
        // SAFETY: `T` and `O` are `f32` (the function's contract): copies of the same type.
        unsafe {
            let r = f(core::mem::transmute_copy::<f32, T>(&x), core::mem::transmute_copy::<f32, T>(&y));
            core::mem::transmute_copy::<O, f32>(&r)
        }
    }
}

/// The function a unary kernel applies to each element: any closure, or a type whose `call`
/// is `#[inline(always)]`. The loops call it in many places (each run kind, each vector
/// extension), so the compiler does not inline a large closure into them; a call through
/// such a type is always inlined, and vectorised with the loop (see
/// [`vmath`](crate::vmath)).
pub(crate) trait UnaryFn<T, O>: Copy + Send + Sync {
    /// Elements per thread below which the function's kernels do not split their work
    /// ([`threads_for`](crate::parallel::threads_for)'s grain): PyTorch's
    /// `GRAIN_SIZE` by default.
    const GRAIN: usize = crate::iter::GRAIN;

    fn call(&self, x: T) -> O;

    /// `o[i] = call(x[i])` for `i < n`, contiguous, by a faster route than a loop of `call`
    /// where the function has one in `isa` (the same bits); false, and nothing written, where
    /// it has none.
    ///
    /// # Safety
    /// `x` is readable and `o` writable for `n` elements; `o` is `x` or overlaps it nowhere.
    #[inline(always)]
    unsafe fn call_run(&self, isa: Isa, x: *const T, o: *mut O, n: usize) -> bool {
        let _ = (isa, x, o, n);
        false
    }

    /// As [`call_run`](UnaryFn::call_run), for an `f32` function over a contiguous run of
    /// `half` (bf16 or f16) elements: each widened, computed and rounded once in registers,
    /// with the bits of the converting loops around [`call`](UnaryFn::call). False, and
    /// nothing written, where there is no such route.
    ///
    /// # Safety
    /// `x` is readable and `o` writable for `n` elements of `half`; `o` is `x` or overlaps it
    /// nowhere.
    #[inline(always)]
    unsafe fn call_run_half(&self, isa: Isa, half: DType, x: *const u16, o: *mut u16, n: usize) -> bool {
        let _ = (isa, half, x, o, n);
        false
    }
}

impl<T, O, F: Fn(T) -> O + Copy + Send + Sync> UnaryFn<T, O> for F {
    #[inline(always)]
    fn call(&self, x: T) -> O {
        self(x)
    }
}

/// `f` giving `T`, for `O` the same type as `T` (the kernels that use it check; `call` checks
/// again, at compile time).
struct SameType<F, O>(F, core::marker::PhantomData<fn() -> O>);

impl<F: Copy, O> Clone for SameType<F, O> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<F: Copy, O> Copy for SameType<F, O> {}

impl<T: 'static, O: 'static, F: UnaryFn<T, O>> UnaryFn<T, T> for SameType<F, O> {
    #[inline(always)]
    fn call(&self, x: T) -> T {
        // A constant for each instance: the branch not taken is compiled out.
        assert!(TypeId::of::<T>() == TypeId::of::<O>(), "SameType over two types");
        let r = self.0.call(x);
        // SAFETY: `T` and `O` are the same type (asserted above).
        unsafe { core::mem::transmute_copy::<O, T>(&r) }
    }

    #[inline(always)]
    unsafe fn call_run(&self, isa: Isa, x: *const T, o: *mut T, n: usize) -> bool {
        assert!(TypeId::of::<T>() == TypeId::of::<O>(), "SameType over two types");
        // SAFETY: `T` and `O` are the same type (asserted above); the caller's promise.
        unsafe { self.0.call_run(isa, x, o as *mut O, n) }
    }
}

/// `out[i] = f(a[i])`; as [`run_binary`].
pub(crate) fn run_unary<T: Element, O: Element>(
    op: &'static str,
    out: &Tensor,
    a: &Tensor,
    dest: Dest,
    f: impl Fn(T) -> O + Sync + Send + Copy,
) -> Result<()> {
    unary_in(op, out, a, dest, false, f)
}

/// As [`run_unary`], for a function that computes more than it moves (`exp`, GELU: see
/// [`vmath`](crate::vmath)): its loops are compiled for the CPU's widest vector
/// extension whatever the types. f16 tensors computing in f32 go through the converting
/// blocks (F16C conversions, then `f` vectorised).
pub(crate) fn run_unary_wide<T: Element, O: Element>(
    op: &'static str,
    out: &Tensor,
    a: &Tensor,
    dest: Dest,
    f: impl UnaryFn<T, O>,
) -> Result<()> {
    unary_in(op, out, a, dest, true, f)
}

/// [`run_unary`], compiled for the widest extension when `wide`.
fn unary_in<T: Element, O: Element, F: UnaryFn<T, O>>(
    op: &'static str,
    out: &Tensor,
    a: &Tensor,
    dest: Dest,
    wide: bool,
    f: F,
) -> Result<()> {
    let isa = if wide { super::isa::detected() } else { for_types::<T, O>() };
    let prepared;
    let (a, alias, parallel) = match dest {
        Dest::Fresh => (a, [false], true),
        Dest::Into => {
            prepared = prepare_into(op, out, &[a])?;
            (&prepared.inputs[0], [prepared.alias[0]], prepared.parallel)
        }
    };
    let sa = strides_to(op, a, out.sizes())?;
    if out.numel() == 0 {
        return Ok(());
    }
    a.host_ready(op)?;
    out.host_ready(op)?;
    let la = loader::<T>(a.dtype()).ok_or_else(|| TensorError::quantized(op, a))?;
    let so = storer::<O>(out.dtype()).ok_or_else(|| TensorError::quantized(op, out))?;
    let _g = lock_storages(op, (dest == Dest::Into).then(|| out.storage()), &[a.storage()])?;
    let plan = Plan::new(out.sizes(), [operand(out, out.strides()), operand(a, &sa)]);
    let grain = parallel.then_some(F::GRAIN);
    let typed = a.dtype() == T::DTYPE && out.dtype() == O::DTYPE;
    // Sound as in `run_binary`.
    match (typed, alias[0]) {
        (true, false) => plan.run_grain(grain, &|p, s, n| {
            // SAFETY: as in `run_binary`: the output run overlaps the input run nowhere.
            unsafe { distinct_unary(&f, isa, p, s, n) }
        }),
        (true, true) if TypeId::of::<T>() == TypeId::of::<O>() => {
            // `T` and `O` are the same type (checked above).
            let g = SameType(f, core::marker::PhantomData);
            plan.run_grain(grain, &|p, s, n| {
                // SAFETY: as in `run_binary`: the output is exactly the input.
                unsafe { inplace_unary(&g, isa, p, s, n) }
            })
        }
        _ => {
            // An f32 function on bf16 or f16 in and out: contiguous runs go through
            // `call_run_half` where the function has it.
            let same_half = a.dtype() == out.dtype() && matches!(a.dtype(), DType::BF16 | DType::F16);
            let half = (same_half && computes_f32::<T, O>()).then(|| a.dtype());
            const H: usize = size_of::<u16>();
            plan.run_grain(grain, &|p, s, n| {
                // SAFETY: as in `run_binary`: the loader and storer match the dtypes; a run of
                // `half` elements with unit strides is `n` contiguous elements of each, the
                // output exactly the input (`alias`) or apart from it.
                unsafe {
                    if let Some(h) = half
                        && s == [H; 2]
                        && f.call_run_half(isa, h, p[1].cast(), p[0].cast(), n)
                    {
                        return;
                    }
                    converting_unary(&f, isa, la, so, p, s, n)
                }
            })
        }
    }
    Ok(())
}

/// One run of a binary kernel into memory no input shares.
///
/// # Safety
/// `p[k] + i * s[k]` for `i < n` are valid elements (`O`, `T`, `T`); `p[0]` is writable and
/// overlaps neither input run.
#[inline(always)]
unsafe fn distinct_binary<T: Element, O: Element>(f: &impl Fn(T, T) -> O, p: [*mut u8; 3], s: [usize; 3], n: usize) {
    let (o, a, b) = (p[0] as *mut O, p[1] as *const T, p[2] as *const T);
    let (eo, et) = (size_of::<O>(), size_of::<T>());
    let isa = for_types::<T, O>();
    // SAFETY: the function's contract; slices are made only over runs with unit strides.
    unsafe {
        if s[0] == eo {
            let out = slice::from_raw_parts_mut(o as *mut MaybeUninit<O>, n);
            if s[1] == et && s[2] == et {
                let (a, b) = (slice::from_raw_parts(a, n), slice::from_raw_parts(b, n));
                return vectorised!(isa, {
                    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                        o.write(f(x, y));
                    }
                });
            }
            if s[1] == et && s[2] == 0 {
                let (a, y) = (slice::from_raw_parts(a, n), b.read());
                return vectorised!(isa, {
                    for (o, &x) in out.iter_mut().zip(a) {
                        o.write(f(x, y));
                    }
                });
            }
            if s[1] == 0 && s[2] == et {
                let (x, b) = (a.read(), slice::from_raw_parts(b, n));
                return vectorised!(isa, {
                    for (o, &y) in out.iter_mut().zip(b) {
                        o.write(f(x, y));
                    }
                });
            }
        }
        if isa != Isa::Baseline {
            // Strided halves: gathered in blocks, computed vectorised, scattered.
            return converting_binary(f, load::<T, T>, load::<T, T>, store::<O, O>, Direct::ALL, p, s, n);
        }
        for i in 0..n {
            let x = a.byte_add(i * s[1]).read();
            let y = b.byte_add(i * s[2]).read();
            o.byte_add(i * s[0]).write(f(x, y));
        }
    }
}

/// One run of a binary kernel whose output is its first input.
///
/// # Safety
/// `p[0] == p[1]` with `s[0] == s[1]` (the same elements of `T`, valid, writable); `p[2] + i *
/// s[2]` valid elements of `T` that do not overlap the output run unless they are exactly it.
#[inline(always)]
unsafe fn inplace_binary<T: Element>(f: &impl Fn(T, T) -> T, p: [*mut u8; 3], s: [usize; 3], n: usize) {
    let (o, b) = (p[0] as *mut T, p[2] as *const T);
    let et = size_of::<T>();
    let isa = for_types::<T, T>();
    let unit = s[0] == et && (s[2] == et || s[2] == 0 || (p[2] == p[0] && s[2] == s[0]));
    // SAFETY: the function's contract; the mutable slice is the only reference to the output
    // run while it lives, and `b` is read through it when it is the same run. The converting
    // blocks read every input element of a block before writing its output elements.
    unsafe {
        if isa != Isa::Baseline && !unit {
            // Strided halves: gathered in blocks, computed vectorised, scattered.
            return converting_binary(f, load::<T, T>, load::<T, T>, store::<T, T>, Direct::INPUTS, p, s, n);
        }
        if s[0] == et {
            let out = slice::from_raw_parts_mut(o, n);
            if p[2] == p[0] && s[2] == s[0] {
                vectorised!(isa, {
                    for x in out.iter_mut() {
                        *x = f(*x, *x);
                    }
                });
            } else if s[2] == et {
                let b = slice::from_raw_parts(b, n);
                vectorised!(isa, {
                    for (x, &y) in out.iter_mut().zip(b) {
                        *x = f(*x, y);
                    }
                });
            } else if s[2] == 0 {
                let y = b.read();
                vectorised!(isa, {
                    for x in out.iter_mut() {
                        *x = f(*x, y);
                    }
                });
            } else {
                for (i, x) in out.iter_mut().enumerate() {
                    *x = f(*x, b.byte_add(i * s[2]).read());
                }
            }
            return;
        }
        for i in 0..n {
            let d = o.byte_add(i * s[0]);
            let y = b.byte_add(i * s[2]).read();
            d.write(f(d.read(), y));
        }
    }
}

/// Which operands a converting run reads or writes where they lie, without a block copy: an
/// input whose dtype is the compute type `T`, the output when its dtype is `O` and no input is
/// the output ([`converting_binary`]); each where its run is contiguous.
#[derive(Clone, Copy, Debug)]
struct Direct {
    a: bool,
    b: bool,
    out: bool,
}

impl Direct {
    /// Every operand: all of the kernel's types, the output apart from the inputs.
    const ALL: Direct = Direct { a: true, b: true, out: true };
    /// The inputs only: the output is (exactly) an input.
    const INPUTS: Direct = Direct { a: true, b: true, out: false };
    /// None: every operand converts.
    const NONE: Direct = Direct { a: false, b: false, out: false };
}

/// One run of a binary kernel through converting blocks: each block of an operand loaded
/// (converted to `T`) into a stack buffer, or read where it lies (`direct`, contiguous, of
/// type `T`); computed; stored (converted from `O`), or written where it lies. A mixed add
/// (f16 + f32 into f32) would spend a third of its time copying its f32 operand and output
/// through the buffers.
///
/// # Safety
/// As [`distinct_binary`], with the operands' real dtypes those of `la`, `lb` and `so`; the
/// output run may overlap an input run only element for element. An operand `direct` marks
/// has the kernel's type (`T` for inputs, `O` for the output), and a `direct` output overlaps
/// no input run.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the run, its operands' converters and which are direct
unsafe fn converting_binary<T: Element, O: Element>(
    f: &impl Fn(T, T) -> O,
    la: LoadFn<T>,
    lb: LoadFn<T>,
    so: StoreFn<O>,
    direct: Direct,
    p: [*mut u8; 3],
    s: [usize; 3],
    n: usize,
) {
    let mut xa = [T::default(); BLOCK];
    let mut xb = [T::default(); BLOCK];
    let mut xo = [O::default(); BLOCK];
    let isa = for_types::<T, O>();
    let (et, eo) = (size_of::<T>(), size_of::<O>());
    let (da, db, dout) = (direct.a && s[1] == et, direct.b && s[2] == et, direct.out && s[0] == eo);
    let mut start = 0;
    while start < n {
        let m = BLOCK.min(n - start);
        let (pa, pb, po) =
            (p[1].wrapping_add(start * s[1]), p[2].wrapping_add(start * s[2]), p[0].wrapping_add(start * s[0]));
        // SAFETY: the function's contract: elements `start..start + m` of each run are valid;
        // a direct input is `m` contiguous values of `T`. A direct output overlaps neither
        // input, so the input slices alias nothing written; otherwise both blocks are read
        // (into the buffers or these slices) before the output block is written.
        unsafe {
            let ra: &[T] = if da {
                slice::from_raw_parts(pa.cast(), m)
            } else {
                la(pa, s[1], &mut xa[..m]);
                &xa[..m]
            };
            let rb: &[T] = if db {
                slice::from_raw_parts(pb.cast(), m)
            } else {
                lb(pb, s[2], &mut xb[..m]);
                &xb[..m]
            };
            if dout {
                let o = slice::from_raw_parts_mut(po.cast::<MaybeUninit<O>>(), m);
                vectorised!(isa, {
                    for ((o, &x), &y) in o.iter_mut().zip(ra).zip(rb) {
                        o.write(f(x, y));
                    }
                });
            } else {
                vectorised!(isa, {
                    for ((o, &x), &y) in xo[..m].iter_mut().zip(ra).zip(rb) {
                        *o = f(x, y);
                    }
                });
                so(po, s[0], &xo[..m]);
            }
        }
        start += m;
    }
}

/// One run of an `f32` kernel on f16 operands and output: the fused F16C loop when the output
/// is contiguous and each input contiguous or one broadcast value, else the converting blocks.
///
/// # Safety
/// As [`converting_binary`], with `T` and `O` `f32` and every operand f16.
#[inline(always)]
unsafe fn f16_binary<T: Element, O: Element>(
    f: &impl Fn(T, T) -> O,
    la: LoadFn<T>,
    lb: LoadFn<T>,
    so: StoreFn<O>,
    p: [*mut u8; 3],
    s: [usize; 3],
    n: usize,
) {
    const H: usize = size_of::<f16>();
    // SAFETY: the function's contract: f16 elements, runs valid for `n` (steps of 0 or 1
    // element where the fused loop takes them), the output overlapping an input only element
    // for element.
    unsafe {
        if s[0] == H && matches!(s[1], 0 | H) && matches!(s[2], 0 | H) {
            let g = as_f32(f);
            return f16c::map2_f16(&g, p[0].cast(), p[1].cast(), s[1] / H, p[2].cast(), s[2] / H, n);
        }
        converting_binary(f, la, lb, so, Direct::NONE, p, s, n)
    }
}

/// One run of a unary kernel into memory the input does not share.
///
/// # Safety
/// As [`distinct_binary`].
#[inline(always)]
unsafe fn distinct_unary<T: Element, O: Element>(
    f: &impl UnaryFn<T, O>,
    isa: Isa,
    p: [*mut u8; 2],
    s: [usize; 2],
    n: usize,
) {
    let (o, a) = (p[0] as *mut O, p[1] as *const T);
    // SAFETY: as in `distinct_binary`.
    unsafe {
        if s[0] == size_of::<O>() && s[1] == size_of::<T>() {
            if f.call_run(isa, a, o, n) {
                return;
            }
            let (out, a) = (slice::from_raw_parts_mut(o as *mut MaybeUninit<O>, n), slice::from_raw_parts(a, n));
            return vectorised!(isa, {
                for (o, &x) in out.iter_mut().zip(a) {
                    o.write(f.call(x));
                }
            });
        }
        let rounds =
            TypeId::of::<T>() != TypeId::of::<O>() && (is_half::<O>() || TypeId::of::<T>() == TypeId::of::<f16>());
        if rounds && for_types::<T, O>() != Isa::Baseline {
            // A strided cast that rounds to halves or widens f16: gathered in blocks, converted
            // vectorised, scattered. Other unary ops keep the direct loop: most of them convert
            // nothing (or shift, from bf16), and the blocks cost more than they save there.
            return converting_unary(f, isa, load::<T, T>, store::<O, O>, p, s, n);
        }
        for i in 0..n {
            o.byte_add(i * s[0]).write(f.call(a.byte_add(i * s[1]).read()));
        }
    }
}

/// One run of a unary kernel in place.
///
/// # Safety
/// `p[0] == p[1]`, `s[0] == s[1]`: valid, writable elements of `T`.
#[inline(always)]
unsafe fn inplace_unary<T: Element>(f: &impl UnaryFn<T, T>, isa: Isa, p: [*mut u8; 2], s: [usize; 2], n: usize) {
    let o = p[0] as *mut T;
    // SAFETY: as in `inplace_binary`.
    unsafe {
        if s[0] == size_of::<T>() {
            if f.call_run(isa, o, o, n) {
                return;
            }
            let out = slice::from_raw_parts_mut(o, n);
            return vectorised!(isa, {
                for x in out {
                    *x = f.call(*x);
                }
            });
        }
        for i in 0..n {
            let d = o.byte_add(i * s[0]);
            d.write(f.call(d.read()));
        }
    }
}

/// One run of a unary kernel through converting blocks.
///
/// # Safety
/// As [`converting_binary`].
#[inline(always)]
unsafe fn converting_unary<T: Element, O: Element>(
    f: &impl UnaryFn<T, O>,
    isa: Isa,
    la: LoadFn<T>,
    so: StoreFn<O>,
    p: [*mut u8; 2],
    s: [usize; 2],
    n: usize,
) {
    let mut xa = [T::default(); BLOCK];
    let mut xo = [O::default(); BLOCK];
    let mut start = 0;
    while start < n {
        let m = BLOCK.min(n - start);
        // SAFETY: as in `converting_binary`.
        unsafe { la(p[1].add(start * s[1]), s[1], &mut xa[..m]) };
        // SAFETY: two distinct arrays of `BLOCK >= m` elements.
        if !unsafe { f.call_run(isa, xa.as_ptr(), xo.as_mut_ptr(), m) } {
            vectorised!(isa, {
                for (o, &x) in xo[..m].iter_mut().zip(&xa[..m]) {
                    *o = f.call(x);
                }
            });
        }
        // SAFETY: as in `converting_binary`.
        unsafe { so(p[0].add(start * s[0]), s[0], &xo[..m]) };
        start += m;
    }
}
