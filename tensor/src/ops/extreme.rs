//! The largest or smallest value of a row, and the index of its first maximum (`max`, `min`
//! and `argmax` of rows, over everything or the innermost dimension).
//!
//! A row is read in blocks of [`BLOCK`] elements, each block's extreme taken in [`LANES`]
//! independent lanes with a NaN flag beside them ([`block_extreme`]): a compare-and-select
//! (`maxps`) a vector and one unordered compare for two, where NaN carried through the lanes
//! cost three more operations a vector and one running value and index were a chain of
//! dependent compares. The first block whose maximum is larger than every earlier one's holds
//! the row's first maximum, which is then searched for in that block alone; a block holding a
//! NaN ends the search at its first NaN (NaN is the maximum in PyTorch, and the first one
//! wins).
//!
//! The maxima and minima of f16 and bf16 rows compare their bit patterns as integers
//! ([`HalfKeys`]), never widened. The f16 argmax widens each block into `f32` scratch by F16C
//! first ([`F16Row`]): its conversion in the loop was a dozen integer operations a value. Every
//! other type converts in the loop (bf16's is a shift) or not at all.

use half::f16;

use super::f16c;
use crate::halfconv::HalfFloat;
use crate::iter::prefetch_slice;
use crate::num::Num;

/// Elements of a block: its extreme is taken in [`LANES`] lanes, then compared with the best
/// block's so far. The last block of a row takes the remainder (up to `2 * BLOCK - 1`).
pub(super) const BLOCK: usize = 1024;

/// Independent accumulators of [`block_extreme`]: two AVX-512 vectors (four AVX2 ones) of f32,
/// so that each step's comparisons are independent chains.
const LANES: usize = 32;

/// Whether `v` replaces `best` as the first maximum: NaN counts as the maximum and the first
/// NaN wins, as in PyTorch.
#[inline(always)]
pub(super) fn better<V: Num>(v: V, best: V) -> bool {
    let (vn, bn) = (v.is_nan(), best.is_nan());
    (vn & !bn) | (!bn & (v > best))
}

/// The largest (`MAX`) or smallest `map`ped value of `block` (not empty) leaving NaN out, and
/// whether it holds a NaN.
#[inline(always)]
fn block_extreme<const MAX: bool, T: Copy, C: Num>(block: &[T], map: &impl Fn(T) -> C) -> (C, bool) {
    let pick = |v: C, cur: C| if (MAX && v > cur) || (!MAX && v < cur) { v } else { cur };
    let first = map(block[0]);
    if block.len() < 2 * LANES {
        let mut any_nan = false;
        let mut best = first;
        for &x in &block[1..] {
            let v = map(x);
            any_nan |= v.is_nan();
            best = pick(v, best);
        }
        return (best, any_nan | first.is_nan());
    }
    let mut acc = [first; LANES];
    // All ones where a NaN was seen: an `i32` lane (a compare's own mask, ORed), where a
    // `bool` lane was packed into bytes each step.
    let mut nan = [0i32; LANES];
    // Two values a lane each step: one unordered compare checks both for NaN.
    let chunks = block.chunks_exact(2 * LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            let (a, b) = (map(c[k]), map(c[k + LANES]));
            nan[k] |= -i32::from(a.is_nan() | b.is_nan());
            acc[k] = pick(pick(b, a), acc[k]);
        }
    }
    // Folded into 8 lanes in vector steps, into fresh arrays (32 one by one were a compare and
    // a select each, a block; halving in place compiled to a masked store), then one by one.
    let mut top = [first; 8];
    let mut flags = [0i32; 8];
    for k in 0..8 {
        top[k] = pick(pick(acc[k + 8], acc[k]), pick(acc[k + 24], acc[k + 16]));
        flags[k] = nan[k] | nan[k + 8] | nan[k + 16] | nan[k + 24];
    }
    let mut any_nan = flags.iter().fold(0, |a, &n| a | n) != 0;
    let mut best = first;
    for v in top.into_iter().chain(rest.iter().map(|&x| map(x))) {
        any_nan |= v.is_nan();
        best = pick(v, best);
    }
    (best, any_nan)
}

/// The offset of the first `map`ped value of `v` equal to `m` (not NaN): the first
/// [`LANES`] holding one (a vector compare each), then the value.
#[inline(always)]
fn position_of<T: Copy, C: Num>(v: &[T], map: &impl Fn(T) -> C, m: C) -> Option<usize> {
    let from = v.chunks(LANES).position(|c| c.iter().fold(false, |any, &x| any | (map(x) == m)))? * LANES;
    v[from..].iter().position(|&x| map(x) == m).map(|i| from + i)
}

/// The blocks of a row of `len`: [`BLOCK`] elements each, the last one taking the remainder.
fn blocks(len: usize) -> impl Iterator<Item = core::ops::Range<usize>> {
    let mut start = 0;
    core::iter::from_fn(move || {
        (start < len).then(|| {
            let end = if len - start < 2 * BLOCK { len } else { start + BLOCK };
            let r = start..end;
            start = end;
            r
        })
    })
}

/// A row read block by block in its compute type `C` (at most `2 * BLOCK - 1` elements a
/// block).
pub(super) trait Row<C: Num> {
    fn len(&self) -> usize;
    /// The extreme of `range` leaving NaN out, and whether it holds a NaN ([`block_extreme`]).
    fn extreme<const MAX: bool>(&mut self, range: core::ops::Range<usize>) -> (C, bool);
    /// The offset in `range` of its first NaN.
    fn first_nan(&mut self, range: core::ops::Range<usize>) -> Option<usize>;
    /// Hints the CPU to fetch `range`'s values into L1 ([`row_extreme`]'s next block, while
    /// this one is read); nothing by default.
    fn prefetch(&self, range: core::ops::Range<usize>) {
        let _ = range;
    }
}

/// A [`Row`] that also finds a value: what [`first_argmax`] needs beyond [`row_extreme`].
pub(super) trait Positions<C: Num>: Row<C> {
    /// The offset in `range` of its first value equal to `m` (not NaN).
    fn position(&mut self, range: core::ops::Range<usize>, m: C) -> Option<usize>;
}

/// A row of `T` converted by `map` as it is read.
pub(super) struct Mapped<'a, T, F> {
    pub(super) row: &'a [T],
    pub(super) map: F,
}

impl<T: Copy, C: Num, F: Fn(T) -> C> Row<C> for Mapped<'_, T, F> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.row.len()
    }
    #[inline(always)]
    fn extreme<const MAX: bool>(&mut self, range: core::ops::Range<usize>) -> (C, bool) {
        block_extreme::<MAX, T, C>(&self.row[range], &self.map)
    }
    #[inline(always)]
    fn first_nan(&mut self, range: core::ops::Range<usize>) -> Option<usize> {
        self.row[range].iter().position(|&x| (self.map)(x).is_nan())
    }
    #[inline(always)]
    fn prefetch(&self, range: core::ops::Range<usize>) {
        prefetch_slice(&self.row[range]);
    }
}

impl<T: Copy, C: Num, F: Fn(T) -> C> Positions<C> for Mapped<'_, T, F> {
    #[inline(always)]
    fn position(&mut self, range: core::ops::Range<usize>, m: C) -> Option<usize> {
        position_of(&self.row[range], &self.map, m)
    }
}

/// A row of f16 widened block by block into `f32` scratch by F16C (where the CPU has it:
/// [`f16c::has_f16c`]; for rows of at least [`BLOCK`], as the scratch is zeroed first).
pub(super) struct F16Row<'a> {
    row: &'a [f16],
    wide: [f32; 2 * BLOCK],
}

impl<'a> F16Row<'a> {
    pub(super) fn new(row: &'a [f16]) -> Self {
        F16Row { row, wide: [0.0; 2 * BLOCK] }
    }

    /// `range`'s values as `f32`.
    #[inline(always)]
    fn widen(&mut self, range: core::ops::Range<usize>) -> &[f32] {
        let n = range.len();
        f16c::widen_f16(&self.row[range], &mut self.wide[..n]);
        &self.wide[..n]
    }
}

impl Row<f32> for F16Row<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.row.len()
    }
    #[inline(always)]
    fn extreme<const MAX: bool>(&mut self, range: core::ops::Range<usize>) -> (f32, bool) {
        block_extreme::<MAX, f32, f32>(self.widen(range), &|v| v)
    }
    #[inline(always)]
    fn first_nan(&mut self, range: core::ops::Range<usize>) -> Option<usize> {
        self.widen(range).iter().position(|v| v.is_nan())
    }
}

impl Positions<f32> for F16Row<'_> {
    #[inline(always)]
    fn position(&mut self, range: core::ops::Range<usize>, m: f32) -> Option<usize> {
        position_of(self.widen(range), &|v| v, m)
    }
}

/// A half-precision value's order key (f16 or bf16: sign and magnitude in 16 bits): its bits as
/// `i16`, the magnitude bits flipped where the sign is set, so that the keys' signed order is
/// the values' (with -0 just below +0), NaN aside. The map is its own inverse.
#[inline(always)]
fn half_key(bits: i16) -> i16 {
    bits ^ ((bits >> 15) & 0x7FFF)
}

/// Independent `i16` lanes of [`half_block_extreme`]: four AVX2 vectors (two AVX-512 ones).
const KEY_LANES: usize = 64;

/// [`block_extreme`] of half-precision values compared as integers ([`half_key`]), never
/// widened: the extreme (as `f32`) leaving NaN out, and whether the block holds a NaN (a
/// magnitude above `inf`, infinity's bits). A step is a shift, two logic operations and a
/// maximum for the key, and a logic operation and a maximum for the magnitude, 16 values a
/// vector.
#[inline(always)]
fn half_block_extreme<const MAX: bool, H: HalfFloat>(block: &[H], inf: i16) -> (f32, bool) {
    let pick = |k: i16, cur: i16| if MAX { k.max(cur) } else { k.min(cur) };
    let bits = |h: H| h.to_bits16() as i16;
    let first = half_key(bits(block[0]));
    let mut best = first;
    let mut top = 0i16;
    let chunks = block.chunks_exact(KEY_LANES);
    let rest = chunks.remainder();
    if block.len() >= KEY_LANES {
        let mut acc = [first; KEY_LANES];
        let mut mag = [0i16; KEY_LANES];
        for c in chunks {
            for k in 0..KEY_LANES {
                let b = bits(c[k]);
                acc[k] = pick(half_key(b), acc[k]);
                mag[k] = mag[k].max(b & 0x7FFF);
            }
        }
        // Folded into 16 lanes in vector steps, into fresh arrays, then one by one.
        let mut keys = [first; 16];
        let mut mags = [0i16; 16];
        for k in 0..16 {
            keys[k] = pick(pick(acc[k], acc[k + 16]), pick(acc[k + 32], acc[k + 48]));
            mags[k] = mag[k].max(mag[k + 16]).max(mag[k + 32].max(mag[k + 48]));
        }
        best = keys.iter().fold(best, |a, &k| pick(k, a));
        top = mags.iter().fold(top, |a, &m| a.max(m));
    }
    for &h in rest {
        let b = bits(h);
        best = pick(half_key(b), best);
        top = top.max(b & 0x7FFF);
    }
    (H::from_bits16(half_key(best) as u16).widen(), top > inf)
}

/// The keys of [`columns::extreme`](super::columns::extreme) over half-precision columns:
/// `(start, map, fold, back)`. A value maps to its [`half_key`], NaN (of either sign) to the key
/// that wins every comparison (`i16::MAX` for the maximum, `i16::MIN` for the minimum), and the
/// winning key maps back to its value (NaN: the canonical one). Compared as keys, the f16 and
/// bf16 column maxima are integer operations, where each value was widened to f32 and compared
/// there with NaN carried along.
#[inline(always)]
#[allow(clippy::type_complexity)] // the four closures `columns::extreme` takes
pub(super) fn half_column_keys<const MAX: bool, H: HalfFloat>()
-> (i16, impl Fn(H) -> i16 + Copy, impl Fn(i16, i16) -> i16 + Copy, impl Fn(i16) -> H + Copy) {
    let inf = H::narrow(f32::INFINITY).to_bits16() as i16;
    let nan = if MAX { i16::MAX } else { i16::MIN };
    // Every value's key lies strictly between `i16::MIN` and `i16::MAX` (infinity's key is
    // below `0x7FFF`, minus infinity's above `-0x8000`), so the identity never hides a value.
    let start = if MAX { i16::MIN } else { i16::MAX };
    let map = move |h: H| {
        let b = h.to_bits16() as i16;
        if (b & 0x7FFF) > inf { nan } else { half_key(b) }
    };
    let fold = |a: i16, b: i16| if MAX { a.max(b) } else { a.min(b) };
    let back = move |k: i16| if k == nan { H::narrow(f32::NAN) } else { H::from_bits16(half_key(k) as u16) };
    (start, map, fold, back)
}

/// A row of f16 or bf16 whose extremes are taken on integer keys ([`half_block_extreme`]):
/// faster than widening each block by F16C first ([`F16Row`]) or, for bf16, converting as it
/// reads (a shift; `docs/reductions.md`). Zeros:
/// the maximum is +0 and the minimum -0 where both appear (IEEE 754's `maximum` and `minimum`).
/// Not for the argmax, where -0 and +0 compare equal.
pub(super) struct HalfKeys<'a, H> {
    row: &'a [H],
    /// The bits of infinity: a larger magnitude is NaN.
    inf: i16,
}

impl<'a, H: HalfFloat> HalfKeys<'a, H> {
    pub(super) fn new(row: &'a [H]) -> Self {
        HalfKeys { row, inf: H::narrow(f32::INFINITY).to_bits16() as i16 }
    }
}

impl<H: HalfFloat> Row<f32> for HalfKeys<'_, H> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.row.len()
    }
    #[inline(always)]
    fn extreme<const MAX: bool>(&mut self, range: core::ops::Range<usize>) -> (f32, bool) {
        half_block_extreme::<MAX, H>(&self.row[range], self.inf)
    }
    #[inline(always)]
    fn first_nan(&mut self, range: core::ops::Range<usize>) -> Option<usize> {
        self.row[range].iter().position(|h| h.widen().is_nan())
    }
    #[inline(always)]
    fn prefetch(&self, range: core::ops::Range<usize>) {
        prefetch_slice(&self.row[range]);
    }
}

/// The largest (`MAX`) or smallest value of `row` (not empty), NaN if it holds one, as in
/// PyTorch.
#[inline(always)]
pub(super) fn row_extreme<const MAX: bool, C: Num>(mut row: impl Row<C>) -> C {
    let mut best: Option<C> = None;
    // The next block is fetched while this one is read, which helps rows far larger than the
    // caches; the argmax of logits rows and f16 rows are slower with it, so those do not
    // (`docs/reductions.md`).
    let mut next = blocks(row.len()).skip(1);
    for b in blocks(row.len()) {
        if let Some(n) = next.next() {
            row.prefetch(n);
        }
        let (m, nan) = row.extreme::<MAX>(b.clone());
        if nan {
            let at = b.start + row.first_nan(b).unwrap_or(0);
            let v = row.extreme::<MAX>(at..at + 1).0;
            // The canonical NaN, as `Num::maximum` gives it on the other paths.
            return Num::maximum(v, v);
        }
        // Of equal zeros in two blocks, +0 is the larger (as within a block of halves,
        // compared as keys).
        let zeros = |cur: C| m == cur && m.to_f64().is_sign_positive() != cur.to_f64().is_sign_positive();
        let pick = |cur: C| {
            if MAX {
                m > cur || (zeros(cur) && m.to_f64().is_sign_positive())
            } else {
                m < cur || (zeros(cur) && m.to_f64().is_sign_negative())
            }
        };
        if best.is_none_or(pick) {
            best = Some(m);
        }
    }
    best.unwrap_or(C::ZERO)
}

/// The index of the first largest value of `row` (not empty; its first NaN, if any).
#[inline(always)]
pub(super) fn first_argmax<C: Num>(mut row: impl Positions<C>) -> usize {
    let mut best: Option<(C, core::ops::Range<usize>)> = None;
    for b in blocks(row.len()) {
        let (m, nan) = row.extreme::<true>(b.clone());
        if nan {
            return b.start + row.first_nan(b).unwrap_or(0);
        }
        if best.as_ref().is_none_or(|(cur, _)| m > *cur) {
            best = Some((m, b));
        }
    }
    let Some((m, b)) = best else { return 0 };
    // `m` is a value of block `b` (not NaN), and no earlier value is as large.
    b.start + row.position(b, m).unwrap_or(0)
}

/// Whether an f16 row (or piece of one) of `len` is read through [`F16Row`]: where it has a
/// block and the CPU has F16C.
#[inline(always)]
fn through_f16c(len: usize) -> bool {
    len >= BLOCK && f16c::has_f16c()
}

/// [`row_extreme`] of an f16 or bf16 row, in `f32`: compared as integer keys ([`HalfKeys`]).
#[inline(always)]
pub(super) fn half_row_extreme<const MAX: bool, H: HalfFloat>(row: &[H]) -> f32 {
    row_extreme::<MAX, f32>(HalfKeys::new(row))
}

/// [`first_argmax`] of an f16 row: widened a block at a time ([`F16Row`]), or converted as it
/// is read ([`through_f16c`]).
#[inline(always)]
pub(super) fn f16_first_argmax(row: &[f16]) -> usize {
    if through_f16c(row.len()) {
        first_argmax(F16Row::new(row))
    } else {
        first_argmax(Mapped { row, map: HalfFloat::widen })
    }
}
