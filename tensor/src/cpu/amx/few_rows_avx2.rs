//! [`few_rows`](super::few_rows)' widened kernels for CPUs with AVX2 but not AVX-512 (AMD Zen 2
//! and 3, Intel client cores): f16 or bf16 columns widened as they are read, f32 rows, fused
//! multiply-adds over 8 inner elements per step, the f32 route's arithmetic (exact products,
//! f32 sums, one rounding) in another order of the sums. Without them such a product took the
//! f32 route, which converts the whole weight to f32 on every call: several times the time of
//! reading the weight once (`docs/amx-routes.md`).
//!
//! Blocks of 4 rows x 4 columns, as on AVX-512: each step makes 16 multiply-adds of 8 lanes
//! from 8 loads. The 16 accumulators, 4 widened columns and a row need more than AVX2's 16
//! `ymm` registers, so a few live on the stack; blocks of 3 rows fit, but are slower (16 rows
//! make 6 blocks of rows instead of 4).

use core::arch::x86_64::*;
use core::ops::Range;

use super::few_rows::{Block, for_each_block};
use crate::halfconv::HalfFloat;

/// Columns per block ([`for_each_block`]'s).
const COLS: usize = 4;
/// Rows per block.
const ROWS: usize = 4;
/// Inner elements per step (f32 lanes of a `ymm` register).
const LANES: usize = 8;

/// As [`few_rows::widened`](super::few_rows::widened), on AVX2: `a` holds
/// `n` rows of `k` f32, `b` f16 or bf16 columns, and `out` is rounded to that type once.
///
/// # Safety
/// As [`few_rows::bf16`](super::few_rows::bf16), with `a` holding f32; the CPU has AVX2, FMA
/// and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn widened<const F16: bool>(
    a: *const f32,
    a_rs: usize,
    b: *const u16,
    b_cs: usize,
    n: usize,
    k: usize,
    cols: Range<usize>,
    out: *mut u16,
    out_rs: usize,
) {
    let blk = Block { a: a.cast(), a_rs, b, b_cs, k, out, out_rs };
    // SAFETY: our contract, for `for_each_block`'s blocks and `group`'s, with the CPU features
    // `group` needs.
    unsafe {
        for_each_block(blk, 4, n, ROWS, cols, |rows, wide, blk| match (rows, wide) {
            (4, true) => group::<4, COLS, F16>(blk),
            (3, true) => group::<3, COLS, F16>(blk),
            (2, true) => group::<2, COLS, F16>(blk),
            (_, true) => group::<1, COLS, F16>(blk),
            (4, false) => group::<4, 1, F16>(blk),
            (3, false) => group::<3, 1, F16>(blk),
            (2, false) => group::<2, 1, F16>(blk),
            (_, false) => group::<1, 1, F16>(blk),
        })
    }
}

/// `R` rows by `C` columns of [`widened`]: the block `blk`, each result rounded once.
///
/// # Safety
/// As [`widened`], for `R` rows and `C` columns.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const R: usize, const C: usize, const F16: bool>(blk: Block) {
    let Block { a, a_rs, b, b_cs, k, out, out_rs } = blk;
    let a = a.cast::<f32>();
    // Sums start at -0, the identity of IEEE addition, and the tail's unused lanes keep their
    // sums, so a sum of only -0 products is -0 (the exact sum), as on AVX-512; an empty sum is
    // +0.
    let start = if k > 0 { -0.0 } else { 0.0 };
    let mut acc = [[_mm256_set1_ps(start); C]; R];
    let full = k / LANES * LANES;
    for p in (0..full).step_by(LANES) {
        // SAFETY: inner elements `p .. p + 8` are inside every row and column (our contract).
        let (w, x) = unsafe { load::<R, C, F16>(a, a_rs, b, b_cs, p) };
        for (row, x) in acc.iter_mut().zip(&x) {
            for (v, &w) in row.iter_mut().zip(&w) {
                *v = _mm256_fmadd_ps(*x, w, *v);
            }
        }
    }
    if full < k {
        // The last `k - full` elements, copied into zeroed steps (AVX2 has no masked 16-bit
        // loads); the other lanes keep their sums.
        let t = k - full;
        let mut bs = [[0u16; LANES]; C];
        let mut xs = [[0f32; LANES]; R];
        for (c, bs) in bs.iter_mut().enumerate() {
            // SAFETY: column `c`'s elements `full .. k` are inside it (our contract).
            unsafe { core::ptr::copy_nonoverlapping(b.add(c * b_cs + full), bs.as_mut_ptr(), t) };
        }
        for (r, xs) in xs.iter_mut().enumerate() {
            // SAFETY: row `r`'s elements `full .. k` are inside it (our contract).
            unsafe { core::ptr::copy_nonoverlapping(a.add(r * a_rs + full), xs.as_mut_ptr(), t) };
        }
        // SAFETY: `bs` and `xs` hold one step of each column and row, contiguous.
        let (w, x) = unsafe { load::<R, C, F16>(xs.as_ptr().cast(), LANES, bs.as_ptr().cast(), LANES, 0) };
        let used: [i32; LANES] = core::array::from_fn(|l| if l < t { -1 } else { 0 });
        // SAFETY: `used` holds 8 i32.
        let used = _mm256_castsi256_ps(unsafe { _mm256_loadu_si256(used.as_ptr().cast()) });
        for (row, x) in acc.iter_mut().zip(&x) {
            for (v, &w) in row.iter_mut().zip(&w) {
                *v = _mm256_blendv_ps(*v, _mm256_fmadd_ps(*x, w, *v), used);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            // SAFETY: the CPU has AVX2.
            let sum = unsafe { sum_lanes(*v) };
            let bits = if F16 { half::f16::narrow(sum).to_bits() } else { half::bf16::narrow(sum).to_bits() };
            // SAFETY: (r, c) is inside the block (our contract).
            unsafe { out.add(r * out_rs + c).write(bits) };
        }
    }
}

/// The `C` columns' 8 inner elements from `p`, widened to f32, and the `R` rows'.
///
/// # Safety
/// Elements `p .. p + 8` of `C` columns from `b`, `b_cs` apart, and of `R` rows from `a`,
/// `a_rs` apart, are readable; the CPU has AVX2 and F16C (inlined into [`group`]).
#[inline(always)]
unsafe fn load<const R: usize, const C: usize, const F16: bool>(
    a: *const f32,
    a_rs: usize,
    b: *const u16,
    b_cs: usize,
    p: usize,
) -> ([__m256; C], [__m256; R]) {
    // SAFETY: our contract: the elements read are inside the operands; our CPU features.
    unsafe {
        let w = core::array::from_fn(|c| widen::<F16>(b.add(c * b_cs + p)));
        let x = core::array::from_fn(|r| _mm256_loadu_ps(a.add(r * a_rs + p)));
        (w, x)
    }
}

/// The 8 f16 (`F16`) or bf16 at `p`, widened to f32 (also [`few_rows_by_rows`]'s).
///
/// [`few_rows_by_rows`]: super::few_rows_by_rows
///
/// # Safety
/// 8 elements from `p` are readable; the CPU has AVX2 and F16C (inlined into its callers).
#[inline(always)]
pub(super) unsafe fn widen<const F16: bool>(p: *const u16) -> __m256 {
    // SAFETY: our contract.
    unsafe {
        let half = _mm_loadu_si128(p.cast());
        if F16 {
            _mm256_cvtph_ps(half)
        } else {
            // A bf16 is the high half of the f32 of the same value.
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half)))
        }
    }
}

/// The sum of `v`'s 8 lanes: the halves added, then pairs.
///
/// # Safety
/// The CPU has AVX (inlined into [`group`]).
#[inline(always)]
unsafe fn sum_lanes(v: __m256) -> f32 {
    // SAFETY: our contract.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }
}
