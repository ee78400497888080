//! The same products on AVX-512 registers, for CPUs with AVX512-BF16 but no AMX (Intel Cooper
//! Lake, AMD Zen 4 and later): `vdpbf16ps` adds, in each of 16 f32 lanes, the two products of a
//! pair of bf16 (inner elements `2q` and `2q + 1`), which is what a row of a packed B tile holds
//! per column. So the packed layouts of the tile route feed it unchanged: a B tile row is one
//! register, and an A row's pair is one 32-bit broadcast. oneDNN uses the same instruction there.
//!
//! The arithmetic is AMX's: exact products, f32 sums rounded to nearest even (the two products of
//! a pair added one after the other), subnormal inputs and results read and written as zero.
//! Sums start at +0 and the padding adds zero pairs, so a sum of only -0 products is +0.

use super::{A_CHUNK, B_TILE, CHUNK, GROUP_COLS, PANEL, TILE_COLS};
use core::arch::x86_64::*;

/// Rows of the block one register pass holds: 8 rows x 32 columns are 16 accumulators, which
/// leaves registers for the two B rows and the broadcast (each step: 2 B loads and 8 broadcasts
/// for 16 `vdpbf16ps`; 16 x 16 would take 17 loads for 16).
const ROWS: usize = 8;

/// `acc[0..32][0..32] (+)= A chunks x (B tiles b0 | B tiles b1)` over `count` chunks, `acc` rows
/// `GROUP_COLS` f32 apart (loaded first when `add`, else zero), bf16 operands only: the split
/// parts of f16 (four products each) would cost twice the f32 route's work here.
///
/// # Safety
/// `a` holds `count` packed A chunks, `b0` / `b1` `count` packed B tiles each; `acc` is valid for
/// reads and writes of 32 rows of 32 f32, `GROUP_COLS` f32 apart; the CPU has AVX-512 F and
/// AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn multiply(a: *const u16, b0: *const u16, b1: *const u16, count: usize, acc: *mut f32, add: bool) {
    for g in 0..PANEL / ROWS {
        // SAFETY: rows `8 g .. 8 g + 8` of the 32-row block at `acc` (our contract).
        let out = unsafe { acc.add(g * ROWS * GROUP_COLS) };
        let mut c = [[_mm512_setzero_ps(); 2]; ROWS];
        if add {
            for (r, row) in c.iter_mut().enumerate() {
                for (h, v) in row.iter_mut().enumerate() {
                    // SAFETY: 16 f32 at row `r`, column `16 h` of this part of the block.
                    *v = unsafe { _mm512_loadu_ps(out.add(r * GROUP_COLS + h * TILE_COLS)) };
                }
            }
        }
        for chunk in 0..count {
            // SAFETY: chunk `chunk` of A (rows `8 g ..` of its 32 rows of 32 elements) and tile
            // `chunk` of each B column exist (our contract).
            let (rows, t0, t1) =
                unsafe { (a.add(chunk * A_CHUNK + g * ROWS * CHUNK), b0.add(chunk * B_TILE), b1.add(chunk * B_TILE)) };
            for q in 0..CHUNK / 2 {
                // SAFETY: row `q` of each B tile is 16 pairs (64 bytes) from `32 q`; the A pair
                // `2q, 2q + 1` of row `r` is 4 bytes from `r * 32 + 2q`, inside the chunk.
                unsafe {
                    let x0: __m512bh = core::mem::transmute(_mm512_loadu_si512(t0.add(q * 2 * TILE_COLS).cast()));
                    let x1: __m512bh = core::mem::transmute(_mm512_loadu_si512(t1.add(q * 2 * TILE_COLS).cast()));
                    for (r, row) in c.iter_mut().enumerate() {
                        let pair = rows.add(r * CHUNK + 2 * q).cast::<i32>().read_unaligned();
                        let av: __m512bh = core::mem::transmute(_mm512_set1_epi32(pair));
                        row[0] = _mm512_dpbf16_ps(row[0], av, x0);
                        row[1] = _mm512_dpbf16_ps(row[1], av, x1);
                    }
                }
            }
        }
        for (r, row) in c.iter().enumerate() {
            for (h, v) in row.iter().enumerate() {
                // SAFETY: as for the loads above.
                unsafe { _mm512_storeu_ps(out.add(r * GROUP_COLS + h * TILE_COLS), *v) };
            }
        }
    }
}

/// Columns per block of [`few_rows`] and rows per group: 4 x 4 accumulators, each step 8 loads
/// (4 columns of `b`, 4 rows of `a`) for 16 `vdpbf16ps`.
const BLOCK: usize = 4;

/// `out[i][j] = sum_p a[i][p] * b[p][j]` rounded to bf16 once, for the columns `cols` of an
/// `n x k` by `k x m` bf16 product whose left operand has contiguous rows (`a_rs` apart) and
/// whose right operand has contiguous columns (`b_cs` apart: a transposed weight, as `Linear`
/// stores it). Each result is a dot product of a row and a column, 32 inner elements per step,
/// the pairs' products summed in 16 f32 lanes and then across them: the panel route's arithmetic
/// (exact products, f32 sums, subnormals read and written as zero) without packing, for products
/// of too few rows to fill a panel (a model's decode step).
///
/// # Safety
/// `a` addresses `n` rows of `k` initialised bf16, `a_rs` apart; `b` addresses the columns in
/// `cols`, `k` initialised bf16 each, `b_cs` apart; `out` is valid for writes of rows `0..n`,
/// `out_rs` apart, at the columns `cols`, and overlaps neither; the CPU has AVX-512 F and BW and
/// AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn few_rows(
    a: *const u16,
    a_rs: usize,
    b: *const u16,
    b_cs: usize,
    n: usize,
    k: usize,
    cols: core::ops::Range<usize>,
    out: *mut u16,
    out_rs: usize,
) {
    let mut j = cols.start;
    while j < cols.end {
        let wide = cols.end - j >= BLOCK;
        let mut i = 0;
        while i < n {
            let rows = (n - i).min(BLOCK);
            // SAFETY: rows `i .. i + rows` and columns `j .. j + 4` (or `j`) are inside the
            // product and the caller's columns (our contract).
            unsafe {
                let (a, out) = (a.add(i * a_rs), out.add(i * out_rs + j));
                let b = b.add(j * b_cs);
                match (rows, wide) {
                    (4, true) => group::<4, BLOCK>(a, a_rs, b, b_cs, k, out, out_rs),
                    (3, true) => group::<3, BLOCK>(a, a_rs, b, b_cs, k, out, out_rs),
                    (2, true) => group::<2, BLOCK>(a, a_rs, b, b_cs, k, out, out_rs),
                    (_, true) => group::<1, BLOCK>(a, a_rs, b, b_cs, k, out, out_rs),
                    (4, false) => group::<4, 1>(a, a_rs, b, b_cs, k, out, out_rs),
                    (3, false) => group::<3, 1>(a, a_rs, b, b_cs, k, out, out_rs),
                    (2, false) => group::<2, 1>(a, a_rs, b, b_cs, k, out, out_rs),
                    (_, false) => group::<1, 1>(a, a_rs, b, b_cs, k, out, out_rs),
                }
            }
            i += rows;
        }
        j += if wide { BLOCK } else { 1 };
    }
}

/// `R` rows by `C` columns of [`few_rows`] from row 0 and column 0 of its pointers.
///
/// # Safety
/// As [`few_rows`], for `R` rows and `C` columns.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn group<const R: usize, const C: usize>(
    a: *const u16,
    a_rs: usize,
    b: *const u16,
    b_cs: usize,
    k: usize,
    out: *mut u16,
    out_rs: usize,
) {
    use crate::tensor::halfconv::HalfFloat;
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // One step over inner elements `p .. p + 32`, those of `mask` only (the others read as zero,
    // and masked-off elements are not read at all: AVX-512 masked loads do not fault on them).
    let mut step = |p: usize, mask: __mmask32| {
        // SAFETY: the elements of `mask` from `p` are inside the rows and columns (`p + 32 <= k`,
        // or the mask stops at `k`).
        unsafe {
            let w: [__m512bh; C] = core::array::from_fn(|c| {
                core::mem::transmute(_mm512_maskz_loadu_epi16(mask, b.add(c * b_cs + p).cast()))
            });
            for (r, row) in acc.iter_mut().enumerate() {
                let x: __m512bh = core::mem::transmute(_mm512_maskz_loadu_epi16(mask, a.add(r * a_rs + p).cast()));
                for (v, &w) in row.iter_mut().zip(&w) {
                    *v = _mm512_dpbf16_ps(*v, x, w);
                }
            }
        }
    };
    let full = k / CHUNK * CHUNK;
    for p in (0..full).step_by(CHUNK) {
        step(p, !0);
    }
    if full < k {
        step(full, (1u32 << (k - full)) - 1);
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            let sum = _mm512_reduce_add_ps(*v);
            // SAFETY: (r, c) is inside the block (our contract).
            unsafe { out.add(r * out_rs + c).write(half::bf16::narrow(sum).to_bits()) };
        }
    }
}
