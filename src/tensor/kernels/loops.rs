//! Inner loops of the element-wise kernels and the checks that guard in-place outputs.
//!
//! Every loop has a contiguous fast path over slices, which the compiler vectorises, a path
//! for a broadcast (stride 0) operand, and a general strided path. A fresh output is written
//! through `&mut [MaybeUninit<O>]` (it aliases nothing); an in-place output, which may be an
//! input too, through raw pointers only.

use core::mem::{MaybeUninit, size_of};
use core::slice;

use crate::tensor::iter::{Operand, Plan};
use crate::tensor::shape::{broadcast_strides_to, extent};
use crate::tensor::storage::lock_storages;
use crate::tensor::{Element, Result, Tensor, TensorError};

/// `t`'s strides broadcast to `shape`.
pub(crate) fn strides_to(op: &'static str, t: &Tensor, shape: &[usize]) -> Result<Vec<usize>> {
    broadcast_strides_to(op, t.sizes(), t.strides(), shape)
}

/// Refuses an in-place output that is read-only, has elements sharing memory, or partially
/// overlaps one of `inputs` (exactly the same elements is fine: `a.add_(&a)`).
pub(crate) fn check_inplace(op: &'static str, out: &Tensor, inputs: &[&Tensor]) -> Result<()> {
    out.check_writable(op)?;
    let mut dims: Vec<(usize, usize)> =
        out.sizes().iter().zip(out.strides()).filter(|(s, _)| **s > 1).map(|(&s, &st)| (st, s)).collect();
    dims.sort_unstable();
    let mut reach = 0usize;
    for &(stride, size) in &dims {
        if stride <= reach {
            return Err(TensorError::InternalOverlap {
                op,
                shape: out.sizes().to_vec(),
                strides: out.strides().to_vec(),
            });
        }
        reach += stride * (size - 1);
    }
    let out_range = (out.storage_offset(), extent(out.sizes(), out.strides(), out.storage_offset()).unwrap_or(0));
    for (i, t) in inputs.iter().enumerate() {
        if !t.shares_storage(out) || t.numel() == 0 || out.numel() == 0 {
            continue;
        }
        let st = strides_to(op, t, out.sizes())?;
        let same = t.storage_offset() == out.storage_offset()
            && out.sizes().iter().zip(st.iter().zip(out.strides())).all(|(&s, (a, b))| s <= 1 || a == b);
        if same {
            continue;
        }
        let r = (t.storage_offset(), extent(t.sizes(), t.strides(), t.storage_offset()).unwrap_or(0));
        if r.0 < out_range.1 && out_range.0 < r.1 {
            return Err(TensorError::PartialOverlap {
                op,
                output: out.sizes().to_vec(),
                input: i,
                input_shape: t.sizes().to_vec(),
            });
        }
    }
    Ok(())
}

fn operand<'a>(t: &Tensor, strides: &'a [usize]) -> Operand<'a> {
    Operand { ptr: t.data_ptr(), strides, elem: t.elem_size() }
}

/// `out[i] = f(a[i], b[i])` over `out`'s shape, `a` and `b` broadcast to it. `fresh`: `out`
/// was just allocated by the caller (nobody else can see it); otherwise the caller has run
/// [`check_inplace`]. Element types must be the tensors' dtypes (checked by the callers'
/// dispatch, asserted in debug builds).
pub(crate) fn run_binary<A: Element, B: Element, O: Element>(
    op: &'static str,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    fresh: bool,
    f: impl Fn(A, B) -> O + Sync,
) -> Result<()> {
    debug_assert!(a.dtype() == A::DTYPE && b.dtype() == B::DTYPE && out.dtype() == O::DTYPE);
    let (sa, sb) = (strides_to(op, a, out.sizes())?, strides_to(op, b, out.sizes())?);
    a.materialize()?;
    b.materialize()?;
    out.materialize()?;
    let _g = lock_storages((!fresh).then(|| out.storage()), &[a.storage(), b.storage()]);
    let plan = Plan::new(out.sizes(), [operand(out, out.strides()), operand(a, &sa), operand(b, &sb)]);
    // SAFETY: the plan walks `out`, `a` and `b` inside their storages (layouts are checked
    // when made), with their dtypes' element sizes; `out` is fresh or checked against partial
    // overlap, and its elements are distinct memory (fresh, or `check_inplace`), so parallel
    // runs write disjoint elements; the guards keep other writers out.
    plan.run(true, &|p, s, n| unsafe { binary_loop(&f, p, s, n, fresh) });
    Ok(())
}

/// `out[i] = f(a[i])`; as [`run_binary`].
pub(crate) fn run_unary<A: Element, O: Element>(
    op: &'static str,
    out: &Tensor,
    a: &Tensor,
    fresh: bool,
    f: impl Fn(A) -> O + Sync,
) -> Result<()> {
    debug_assert!(a.dtype() == A::DTYPE && out.dtype() == O::DTYPE);
    let sa = strides_to(op, a, out.sizes())?;
    a.materialize()?;
    out.materialize()?;
    let _g = lock_storages((!fresh).then(|| out.storage()), &[a.storage()]);
    let plan = Plan::new(out.sizes(), [operand(out, out.strides()), operand(a, &sa)]);
    // SAFETY: as in `run_binary`.
    plan.run(true, &|p, s, n| unsafe { unary_loop(&f, p, s, n, fresh) });
    Ok(())
}

/// One run of a binary kernel.
///
/// # Safety
/// `p[k] + i * s[k]` for `i < n` are valid elements of the operands' types; `p[0]` is
/// writable; with `fresh`, the output run overlaps neither input.
#[inline(always)]
unsafe fn binary_loop<A: Element, B: Element, O: Element>(
    f: &impl Fn(A, B) -> O,
    p: [*mut u8; 3],
    s: [usize; 3],
    n: usize,
    fresh: bool,
) {
    let (o, a, b) = (p[0] as *mut O, p[1] as *const A, p[2] as *const B);
    let (eo, ea, eb) = (size_of::<O>(), size_of::<A>(), size_of::<B>());
    // SAFETY: the function's contract; slices are made only over runs with unit strides,
    // and a `&mut` output slice only when `fresh` says nothing else refers to it.
    unsafe {
        if fresh && s[0] == eo {
            let out = slice::from_raw_parts_mut(o as *mut MaybeUninit<O>, n);
            if s[1] == ea && s[2] == eb {
                let (a, b) = (slice::from_raw_parts(a, n), slice::from_raw_parts(b, n));
                for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                    o.write(f(x, y));
                }
                return;
            }
            if s[1] == ea && s[2] == 0 {
                let (a, y) = (slice::from_raw_parts(a, n), b.read());
                for (o, &x) in out.iter_mut().zip(a) {
                    o.write(f(x, y));
                }
                return;
            }
            if s[1] == 0 && s[2] == eb {
                let (x, b) = (a.read(), slice::from_raw_parts(b, n));
                for (o, &y) in out.iter_mut().zip(b) {
                    o.write(f(x, y));
                }
                return;
            }
        }
        for i in 0..n {
            let x = a.byte_add(i * s[1]).read();
            let y = b.byte_add(i * s[2]).read();
            o.byte_add(i * s[0]).write(f(x, y));
        }
    }
}

/// One run of a unary kernel; as [`binary_loop`].
///
/// # Safety
/// As [`binary_loop`].
#[inline(always)]
unsafe fn unary_loop<A: Element, O: Element>(
    f: &impl Fn(A) -> O,
    p: [*mut u8; 2],
    s: [usize; 2],
    n: usize,
    fresh: bool,
) {
    let (o, a) = (p[0] as *mut O, p[1] as *const A);
    // SAFETY: as in `binary_loop`.
    unsafe {
        if fresh && s[0] == size_of::<O>() && s[1] == size_of::<A>() {
            let out = slice::from_raw_parts_mut(o as *mut MaybeUninit<O>, n);
            for (o, &x) in out.iter_mut().zip(slice::from_raw_parts(a, n)) {
                o.write(f(x));
            }
            return;
        }
        for i in 0..n {
            o.byte_add(i * s[0]).write(f(a.byte_add(i * s[1]).read()));
        }
    }
}
