//! Products of fewer than 32 rows (a decode step's few tokens) by an f16 or bf16 right operand
//! with contiguous rows: a weight stored `[in, out]` and multiplied as `x @ w`, as GPT-2's
//! `Conv1D` layers store theirs (Hugging Face checkpoints of GPT-2 keep that layout). Without this
//! kernel such a product took the f32 route, which converts the whole weight to f32 on every
//! call, so a decode step of a GPT-2 block in bf16 took longer than in f32 (`docs/amx-routes.md`).
//!
//! Each row of `b` is read once, in order, and widened as it is read (F16C for f16, a shift for
//! bf16); the result's row is kept in f32 while rows of `b` are added into it, [`STEP`] at a time,
//! by fused multiply-adds, then rounded once. So each result is `fma(a[p], b[p][j], sum)` over
//! `p = 0 .. k` in order, from -0 (the identity of IEEE addition; +0 for an empty sum), whatever
//! the split of the columns among threads: the f32 route's arithmetic (products of f16 or bf16
//! are exact in f32) in another order of the sums. A sum of only -0 products is -0, the exact
//! sum, as in [`few_rows`](super::few_rows).
//!
//! AVX2, FMA and F16C: an AVX-512 CPU runs the same code (the product reads each weight element
//! once, so memory, not the vector width, bounds it).

use core::arch::x86_64::*;
use core::ops::Range;

use super::few_rows_avx2::widen;
use crate::halfconv::HalfFloat;

/// Rows of `b` added into the sums per pass over them.
const STEP: usize = 4;
/// Columns of the result summed at a time: each row's sums, 4 KiB, stay in L1 while the rows
/// of `b` stream past them; a pass's 4 rows of `b` (8 KiB) serve every row of `a` from L1.
const SPAN: usize = 1024;
/// f32 lanes of a `ymm` register.
const LANES: usize = 8;

/// `out[i][j] = sum_p a[i][p] * b[p][j]`, rounded to f16 (`F16`) or bf16 once, for the columns
/// `cols` of an `n x k` by `k x m` product whose rows were widened to f32.
///
/// # Safety
/// `a` addresses `n` rows of `k` initialised f32, contiguous, `a_rs` apart; `b` addresses `k`
/// rows, `b_rs` apart, whose elements at the columns `cols` are initialised f16 or bf16 bits,
/// contiguous; `out` is valid for writes of rows `0..n`, `out_rs` apart, at the columns `cols`,
/// and overlaps neither; `n * min(cols.len(), SPAN)` f32 fit in memory; the CPU has AVX2, FMA
/// and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn widened<const F16: bool>(
    a: *const f32,
    a_rs: usize,
    b: *const u16,
    b_rs: usize,
    n: usize,
    k: usize,
    cols: Range<usize>,
    out: *mut u16,
    out_rs: usize,
) {
    let start = if k > 0 { -0.0f32 } else { 0.0 };
    let mut sums = vec![start; n * SPAN.min(cols.len())];
    let mut c0 = cols.start;
    while c0 < cols.end {
        let w = SPAN.min(cols.end - c0);
        let sums = &mut sums[..n * w];
        sums.fill(start);
        let mut p = 0;
        while p < k {
            let rows = STEP.min(k - p);
            for (r, row) in sums.chunks_exact_mut(w).enumerate() {
                // SAFETY: elements `p .. p + rows` of row `r` of `a`, and the columns
                // `c0 .. c0 + w` (inside `cols`) of rows `p .. p + rows` of `b`, are inside the
                // operands (our contract); `row` holds `w` sums; the CPU has our features.
                unsafe {
                    let (x, y) = (a.add(r * a_rs + p), b.add(p * b_rs + c0));
                    match rows {
                        4 => add_rows::<4, F16>(x, y, b_rs, row),
                        3 => add_rows::<3, F16>(x, y, b_rs, row),
                        2 => add_rows::<2, F16>(x, y, b_rs, row),
                        _ => add_rows::<1, F16>(x, y, b_rs, row),
                    }
                }
            }
            p += rows;
        }
        for (r, row) in sums.chunks_exact(w).enumerate() {
            for (j, &s) in row.iter().enumerate() {
                let bits = if F16 { half::f16::narrow(s).to_bits() } else { half::bf16::narrow(s).to_bits() };
                // SAFETY: (r, c0 + j) is a result element of ours (our contract).
                unsafe { out.add(r * out_rs + c0 + j).write(bits) };
            }
        }
        c0 += w;
    }
}

/// `row[j] = fma(x[S - 1], b[S - 1][j], ... fma(x[0], b[0][j], row[j]))` for every `j`: `S` rows
/// of `b`, `b_rs` apart, from `x`'s `S` f32.
///
/// # Safety
/// `x` holds `S` f32; each of the `S` rows of `b` holds `row.len()` f16 or bf16 bits from `b`;
/// the CPU has AVX2, FMA and F16C (inlined into [`widened`]).
#[inline(always)]
unsafe fn add_rows<const S: usize, const F16: bool>(x: *const f32, b: *const u16, b_rs: usize, row: &mut [f32]) {
    // SAFETY: `x` holds `S` f32 (our contract).
    let xs: [f32; S] = core::array::from_fn(|q| unsafe { x.add(q).read() });
    // SAFETY: the CPU has AVX (our contract).
    let xv: [__m256; S] = core::array::from_fn(|q| unsafe { _mm256_set1_ps(xs[q]) });
    let full = row.len() / LANES * LANES;
    let y = row.as_mut_ptr();
    for j in (0..full).step_by(LANES) {
        // SAFETY: `j + 8 <= row.len()`: inside `row` and inside each of the `S` rows of `b` (our
        // contract); the CPU has our features.
        unsafe {
            let mut v = _mm256_loadu_ps(y.add(j));
            for (q, &xq) in xv.iter().enumerate() {
                v = _mm256_fmadd_ps(xq, widen::<F16>(b.add(q * b_rs + j)), v);
            }
            _mm256_storeu_ps(y.add(j), v);
        }
    }
    for (j, s) in row.iter_mut().enumerate().skip(full) {
        for (q, &xq) in xs.iter().enumerate() {
            // SAFETY: element `j` of row `q` of `b` is inside it (our contract).
            let bits = unsafe { b.add(q * b_rs + j).read() };
            let w = if F16 { half::f16::from_bits(bits).to_f32() } else { half::bf16::from_bits(bits).to_f32() };
            *s = xq.mul_add(w, *s);
        }
    }
}
