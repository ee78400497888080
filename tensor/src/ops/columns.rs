//! Reductions along a dimension that is not innermost, read where the values lie.
//!
//! A contiguous tensor reduced along dimension `d` is `outer` blocks of `len` rows of `inner`
//! elements (the dimensions before `d`, `d` itself, the ones after). Each output element is
//! one column of a block. So the rows are added (or compared) into a row of accumulators,
//! vectorised along the columns, a row at a time: every value is read once, in memory order
//! within each row's segment. The row reductions of [`reduce`](super::reduce) need the reduced
//! dimension innermost, which for these tensors took a copy of the whole tensor first, several
//! times PyTorch's time (which, like numpy, adds rows into rows).
//!
//! The output is cut into tasks of at most [`WIDTH`] columns of one block, shared among the
//! kernel threads; a task's accumulators stay in L1. Every column's result is the same whatever
//! the split, so results do not depend on the thread count.

use core::mem::MaybeUninit;

use crate::iter::GRAIN;
use crate::num::Num;
use crate::storage::lock_storages;
use crate::{DType, Element, Result, Tensor};

use half::f16;

use super::extreme::better;
use super::f16c;
use crate::halfconv::HalfFloat;

/// The most columns one task reduces: its accumulators (4 KiB of `f32`, 8 KiB of `f64`, or the
/// argmax's values and indices) stay in L1 beside the row segments it reads.
const WIDTH: usize = 1024;

/// Rows a float sum adds in its compute type before it moves the partial sums to `f64`: 256,
/// as the row sums add 256 values per lane.
const BLOCK_ROWS: usize = 256;

/// The fewest columns (elements after the reduced dimension) for which the column path is
/// taken: one AVX-512 vector of `f32`. Narrower blocks are moved innermost with a copy and
/// reduced as rows, where a row's loop setup is not paid per handful of values.
const MIN_INNER: usize = 16;

/// A reduction of a contiguous tensor along a dimension that is not innermost: `outer` blocks
/// of `len` rows of `inner` elements.
#[derive(Clone, Copy, Debug)]
pub(super) struct Columns {
    outer: usize,
    pub(super) len: usize,
    inner: usize,
}

impl Columns {
    /// The column layout of reducing `t` along `d`, where it pays: `t` contiguous, not bool,
    /// with at least [`MIN_INNER`] elements after `d`, rows that fit a `u32` index (argmax's).
    pub(super) fn of(t: &Tensor, d: usize) -> Option<Columns> {
        let s = t.sizes();
        // Empty tensors first: the other sizes of an empty one may multiply past `usize`.
        if t.numel() == 0 || !t.is_contiguous() || t.dtype() == DType::Bool {
            return None;
        }
        // Each product is a part of `numel`'s, so neither overflows.
        let inner: usize = s[d + 1..].iter().product();
        let ok = inner >= MIN_INNER && u32::try_from(s[d]).is_ok();
        ok.then(|| Columns { outer: s[..d].iter().product(), len: s[d], inner })
    }
}

/// The `len` row segments of one task: `width` columns of one block.
pub(super) struct Segments<'a, T> {
    data: &'a [T],
    base: usize,
    inner: usize,
    width: usize,
    len: usize,
}

impl<'a, T> Segments<'a, T> {
    /// Row `r`'s segment, `width` values.
    #[inline(always)]
    fn row(&self, r: usize) -> &'a [T] {
        &self.data[self.base + r * self.inner..][..self.width]
    }
}

/// A task's accumulator buffer, unset: [`filled`] sets the part a task uses.
#[inline(always)]
fn uninit<T>() -> [MaybeUninit<T>; WIDTH] {
    [const { MaybeUninit::uninit() }; WIDTH]
}

/// The first `w` elements of `buf` (a task's width, at most [`WIDTH`]), each set to `v`.
/// Setting only these, where a whole `[v; WIDTH]` array was set, keeps tasks of few columns
/// from writing 1024 accumulators each (a 49152x4x16 tensor summed over dimension 1 is 49152
/// tasks of 16 columns).
#[inline(always)]
fn filled<T: Copy>(buf: &mut [MaybeUninit<T>; WIDTH], w: usize, v: T) -> &mut [T] {
    // Sliced to exactly `w`, so that loops over `0..w` index the result without bounds checks.
    let part = &mut buf[..w];
    for x in part.iter_mut() {
        x.write(v);
    }
    // SAFETY: every element of `part` was written just above, and `MaybeUninit<T>` has the
    // size, alignment and layout of `T`, so the slice of initialised elements is a `[T]`.
    unsafe { &mut *(part as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// Runs `task` over every task of `x` (contiguous `T`, laid out as `c` says) into `out` (a fresh
/// tensor of `outer * inner` elements of `O`): `task(segments, dst)` writes every element of
/// `dst`, the outputs of the segments' columns.
pub(super) fn reduce_columns<T, O>(
    x: &Tensor,
    c: Columns,
    out: &Tensor,
    task: impl Fn(&Segments<'_, T>, &mut [MaybeUninit<O>]) + Sync,
) -> Result<()>
where
    T: Element,
    O: Element,
{
    x.host_ready("reduction")?;
    let _g = lock_storages("reduction", None, &[x.storage()])?;
    let total = c.outer * c.len * c.inner;
    // SAFETY: `x` is contiguous with `outer * len * inner` elements of `T` (its dtype) inside
    // its materialised storage, read-locked; `out` is a fresh allocation of `outer * inner`
    // elements of `O` (its dtype) that nothing else refers to, written through `MaybeUninit`.
    let (data, dst) = unsafe {
        (
            core::slice::from_raw_parts(x.data_ptr() as *const T, total),
            core::slice::from_raw_parts_mut(out.data_ptr() as *mut MaybeUninit<O>, c.outer * c.inner),
        )
    };
    // Output elements `first..` of `part`, a task of at most `WIDTH` columns of one block at a
    // time.
    let run = |first: usize, part: &mut [MaybeUninit<O>]| {
        let mut e = first;
        let mut rest = part;
        while !rest.is_empty() {
            let (o, j) = (e / c.inner, e % c.inner);
            let width = (c.inner - j).min(WIDTH).min(rest.len());
            let (head, tail) = rest.split_at_mut(width);
            task(&Segments { data, base: o * c.len * c.inner + j, inner: c.inner, width, len: c.len }, head);
            e += width;
            rest = tail;
        }
    };
    let threads = crate::parallel::threads_for(total, GRAIN);
    let pieces = threads.min(total.div_ceil(GRAIN));
    if pieces > 1 {
        // Parts start at multiples of 16 outputs (a cache line of f32, two of i64), so two
        // threads share at most the line where one part's 2-byte outputs end.
        crate::parallel::for_each_part(dst, pieces, 16, run);
    } else {
        run(0, dst);
    }
    Ok(())
}

/// How [`sum`] reads its rows' values into its compute type `C` and adds them into the
/// accumulators, with the reader's own addition.
pub(super) trait Reader<T, C> {
    /// `acc[j] = acc[j] + ((x0[j] + x1[j]) + (x2[j] + x3[j]))` over the segments' columns
    /// (pairwise, so each step loads and stores the accumulators once per four rows).
    fn add4(&self, x: [&[T]; 4], acc: &mut [C]);
    /// `acc[j] = acc[j] + x[j]`.
    fn add1(&self, x: &[T], acc: &mut [C]);
}

/// Values converted by `map` as they are read, added by `add`.
pub(super) struct Mapped<M, A> {
    pub(super) map: M,
    pub(super) add: A,
}

impl<T: Copy, C: Copy, M: Fn(T) -> C, A: Fn(C, C) -> C> Reader<T, C> for Mapped<M, A> {
    #[inline(always)]
    fn add4(&self, [x0, x1, x2, x3]: [&[T]; 4], acc: &mut [C]) {
        let (map, add) = (&self.map, &self.add);
        let w = acc.len().min(x0.len()).min(x1.len()).min(x2.len()).min(x3.len());
        for j in 0..w {
            let pair = add(add(map(x0[j]), map(x1[j])), add(map(x2[j]), map(x3[j])));
            acc[j] = add(acc[j], pair);
        }
    }
    #[inline(always)]
    fn add1(&self, x: &[T], acc: &mut [C]) {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a = (self.add)(*a, (self.map)(v));
        }
    }
}

/// f16 rows widened to f32 and added with f32's `+`, by F16C in the loop
/// ([`f16c::add_rows_f16`]; where the CPU has it: [`has_f16c`](super::f16c::has_f16c)), four
/// rows at a time, the columns F16C's groups of 8 leave converted as they are read: converting
/// each value with [`HalfFloat`]'s bit operations is several times slower
/// (`docs/reductions.md`).
pub(super) struct F16c;

impl F16c {
    /// The columns F16C's groups leave, with the same arithmetic.
    #[inline(always)]
    fn rest() -> impl Reader<f16, f32> {
        Mapped { map: <f16 as HalfFloat>::widen, add: |a: f32, b: f32| a + b }
    }
}

impl Reader<f16, f32> for F16c {
    #[inline(always)]
    fn add4(&self, x: [&[f16]; 4], acc: &mut [f32]) {
        let done = f16c::add_rows_f16(x, acc);
        F16c::rest().add4(x.map(|r| &r[done..]), &mut acc[done..]);
    }
    #[inline(always)]
    fn add1(&self, x: &[f16], acc: &mut [f32]) {
        F16c::rest().add1(x, acc);
    }
}

/// Column sums: values read and added by `reader` in `C`, the partial sums of every
/// [`BLOCK_ROWS`] rows moved into `A` by `spill`, `finish` of each column's total into `dst`.
#[inline(always)]
pub(super) fn sum<T: Copy, C: Copy, A: Copy, O>(
    s: &Segments<'_, T>,
    dst: &mut [MaybeUninit<O>],
    (zero, total_zero): (C, A),
    reader: impl Reader<T, C>,
    spill: impl Fn(A, C) -> A,
    finish: impl Fn(A) -> O,
) {
    let w = s.width;
    let (mut totals, mut accs) = (uninit(), uninit());
    let (totals, acc) = (filled(&mut totals, w, total_zero), filled(&mut accs, w, zero));
    let mut r = 0;
    while r < s.len {
        let end = (r + BLOCK_ROWS).min(s.len);
        while r + 4 <= end {
            reader.add4([s.row(r), s.row(r + 1), s.row(r + 2), s.row(r + 3)], acc);
            r += 4;
        }
        while r < end {
            reader.add1(s.row(r), acc);
            r += 1;
        }
        for (t, &a) in totals.iter_mut().zip(acc.iter()) {
            *t = spill(*t, a);
        }
        if r < s.len {
            acc.fill(zero);
        }
    }
    for (o, &t) in dst.iter_mut().zip(totals.iter()) {
        o.write(finish(t));
    }
}

/// Column maxima or minima: `fold` (NaN-propagating for floats) of the `map`ped values from
/// `start`, `back` into `dst`.
#[inline(always)]
pub(super) fn extreme<T: Copy, C: Copy>(
    s: &Segments<'_, T>,
    dst: &mut [MaybeUninit<T>],
    start: C,
    map: impl Fn(T) -> C,
    fold: impl Fn(C, C) -> C,
    back: impl Fn(C) -> T,
) {
    let w = s.width;
    let mut accs = uninit();
    let acc = filled(&mut accs, w, start);
    let mut r = 0;
    while r + 4 <= s.len {
        let (x0, x1, x2, x3) = (s.row(r), s.row(r + 1), s.row(r + 2), s.row(r + 3));
        for j in 0..w {
            let four = fold(fold(map(x0[j]), map(x1[j])), fold(map(x2[j]), map(x3[j])));
            acc[j] = fold(acc[j], four);
        }
        r += 4;
    }
    while r < s.len {
        for (a, &v) in acc.iter_mut().zip(s.row(r)) {
            *a = fold(*a, map(v));
        }
        r += 1;
    }
    for (o, &a) in dst.iter_mut().zip(acc.iter()) {
        o.write(back(a));
    }
}

/// Column argmax: the row of each column's first largest `map`ped value (its first NaN, if
/// any), as PyTorch's ([`better`]). Branch-free, so the loop vectorises.
#[inline(always)]
pub(super) fn argmax<T: Copy, C: Num>(s: &Segments<'_, T>, dst: &mut [MaybeUninit<i64>], map: impl Fn(T) -> C) {
    let w = s.width;
    let (mut bests, mut rows) = (uninit(), uninit());
    let (best, idx) = (filled(&mut bests, w, C::ZERO), filled(&mut rows, w, 0u32));
    for (b, &v) in best.iter_mut().zip(s.row(0)) {
        *b = map(v);
    }
    // Each step stores both accumulators whole. `best[j] = if better { v } else { b }` and
    // `idx[j] = if better { r } else { idx[j] }` compiled to masked stores (`vmaskmovps`,
    // microcoded on AMD, and slow there). So the best value gets a zero
    // added (which changes no comparison: at most -0 becomes +0) and the row, as rows only
    // grow, is the maximum of the old one and `better`'s row or 0: with zeros the compiler
    // cannot see, these are an addition, a maximum and plain stores.
    let (zero, zero_c) = core::hint::black_box((0u32, C::ZERO));
    for r in 1..s.len {
        let x = s.row(r);
        // `r` fits a `u32`: `Columns::of` checked the row count.
        let ri = r as u32;
        for j in 0..w {
            let (v, b) = (map(x[j]), best[j]);
            let up = better(v, b);
            best[j] = Num::add(if up { v } else { b }, zero_c);
            idx[j] = idx[j].max(if up { ri } else { zero });
        }
    }
    for (o, &i) in dst.iter_mut().zip(idx.iter()) {
        o.write(i64::from(i));
    }
}
