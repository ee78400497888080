//! Products of fewer than 32 rows (a decode step's few tokens) by a right operand with
//! contiguous columns (a transposed weight, as `Linear` stores it), as dot products of a row and
//! a column, unpacked: a panel of 32 rows would pad them, and packing the weight costs as much as
//! multiplying it once. Blocks of 4 rows x 4 columns, 16 accumulators of 16 f32 lanes, summed
//! across their lanes at the end and rounded once.
//!
//! - bf16 ([`bf16`](fn@bf16)): `vdpbf16ps` over 32 inner elements per step, the panel route's
//!   arithmetic (exact products, f32 sums, subnormals read and written as zero; a sum of only
//!   -0 products is +0).
//! - f16 ([`widened`]): the rows widened to f32 first, each column's f16 widened as it is read
//!   (F16C), and fused multiply-adds over 16 inner elements per step: products of f16 are exact
//!   in f32 (11 x 11 significant bits), so this is the f32 route's arithmetic in another order of
//!   the sums, subnormals kept. A sum of only -0 products is -0, the exact sum (the f32
//!   route's gemm gives -0 or +0 by shape, PyTorch +0).
//! - bf16 without AVX512-BF16's route ([`widened`] too): as f16, each column's bf16 widened by a
//!   shift (products of bf16 are exact in f32 too). On Intel's cores `vdpbf16ps` retires
//!   once every 2 cycles against 2 fused multiply-adds a cycle, so its 32
//!   products per instruction come at half the rate of the f32 ones (see [`set_avx512_bf16`]).
//!
//! [`set_avx512_bf16`]: crate::set_avx512_bf16

use core::arch::x86_64::*;
use core::ops::Range;

use crate::halfconv::HalfFloat;

/// Columns per block and rows per group: 4 x 4 accumulators, each step 8 loads (4 columns of
/// `b`, 4 rows of `a`) for 16 multiply-adds of vectors.
const BLOCK: usize = 4;

/// `out[i][j] = sum_p a[i][p] * b[p][j]` rounded to bf16 once, for the columns `cols` of an
/// `n x k` by `k x m` bf16 product.
///
/// # Safety
/// `a` addresses `n` rows of `k` initialised bf16, contiguous, `a_rs` apart; `b` addresses the
/// columns in `cols`, `k` initialised bf16 each, contiguous, `b_cs` apart; `out` is valid for
/// writes of rows `0..n`, `out_rs` apart, at the columns `cols`, and overlaps neither; the CPU has
/// AVX-512 F and BW and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn bf16(
    a: *const u16,
    a_rs: usize,
    b: *const u16,
    b_cs: usize,
    n: usize,
    k: usize,
    cols: Range<usize>,
    out: *mut u16,
    out_rs: usize,
) {
    // SAFETY: our contract, with the features `blocks::<DOTS>` needs.
    unsafe { blocks::<DOTS>(a.cast(), a_rs, b, b_cs, n, k, cols, out, out_rs) }
}

/// As [`bf16`](fn@bf16), for a product whose rows were widened to f32 (`a`: `n` rows of `k` f32),
/// by f16 columns (`F16`) or bf16 ones: `out` rounded to that type once, the f32 route's
/// arithmetic.
///
/// # Safety
/// As [`bf16`](fn@bf16), with `a` holding f32 and `b` f16 (`F16`) or bf16; the CPU has AVX-512
/// F, BW and VL, F16C and FMA (as every AVX-512 CPU).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
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
    let a = a.cast();
    // SAFETY: our contract, with the features `blocks::<WIDE_F16>` and `blocks::<WIDE_BF16>` need.
    unsafe {
        if F16 {
            blocks::<WIDE_F16>(a, a_rs, b, b_cs, n, k, cols, out, out_rs)
        } else {
            blocks::<WIDE_BF16>(a, a_rs, b, b_cs, n, k, cols, out, out_rs)
        }
    }
}

/// The kinds of block: bf16 rows and columns on `vdpbf16ps` ([`bf16`](fn@bf16)); f32 rows by f16 columns
/// or by bf16 columns ([`widened`]) on fused multiply-adds.
const DOTS: u8 = 0;
const WIDE_F16: u8 = 1;
const WIDE_BF16: u8 = 2;

/// The blocks of [`bf16`](fn@bf16) (`KIND` [`DOTS`]: `a` is bf16) or [`widened`] (`a` is
/// f32, `a_rs` in f32).
///
/// # Safety
/// That function's contract and CPU features (this is inlined into it).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn blocks<const KIND: u8>(
    a: *const u8,
    a_rs: usize,
    b: *const u16,
    b_cs: usize,
    n: usize,
    k: usize,
    cols: Range<usize>,
    out: *mut u16,
    out_rs: usize,
) {
    let blk = Block { a, a_rs, b, b_cs, k, out, out_rs };
    // SAFETY: our contract, for `for_each_block`'s blocks and `run`'s.
    unsafe {
        for_each_block(blk, if KIND == DOTS { 2 } else { 4 }, n, BLOCK, cols, |rows, wide, blk| match (rows, wide) {
            (4, true) => run::<4, BLOCK, KIND>(blk),
            (3, true) => run::<3, BLOCK, KIND>(blk),
            (2, true) => run::<2, BLOCK, KIND>(blk),
            (_, true) => run::<1, BLOCK, KIND>(blk),
            (4, false) => run::<4, 1, KIND>(blk),
            (3, false) => run::<3, 1, KIND>(blk),
            (2, false) => run::<2, 1, KIND>(blk),
            (_, false) => run::<1, 1, KIND>(blk),
        })
    }
}

/// Calls `block(rows, wide, blk)` for each block of the rows `0..n` and the columns `cols` of
/// the product whose row 0 and column 0 are `whole`: blocks of `max_rows` rows (fewer for the
/// last) by 4 columns (`wide`), or by 1 column for the last few; `a_bytes` is the size of an
/// element of `a`. Each kernel's `block` calls its function for that size.
///
/// # Safety
/// `block` may be called for every such block: the caller's contract for its kernel.
#[inline(always)]
pub(super) unsafe fn for_each_block(
    whole: Block,
    a_bytes: usize,
    n: usize,
    max_rows: usize,
    cols: Range<usize>,
    mut block: impl FnMut(usize, bool, Block),
) {
    let Block { a, a_rs, b, b_cs, out, out_rs, .. } = whole;
    let mut j = cols.start;
    while j < cols.end {
        let wide = cols.end - j >= BLOCK;
        let mut i = 0;
        while i < n {
            let rows = (n - i).min(max_rows);
            // SAFETY: rows `i .. i + rows` and columns `j .. j + 4` (or `j`) are inside the
            // product and the caller's columns (our contract), so these pointers stay inside
            // the operands.
            let blk = unsafe {
                Block { a: a.add(i * a_rs * a_bytes), b: b.add(j * b_cs), out: out.add(i * out_rs + j), ..whole }
            };
            block(rows, wide, blk);
            i += rows;
        }
        j += if wide { BLOCK } else { 1 };
    }
}

/// One block's operands, from its row 0 and column 0: rows of `a` (bf16, or f32 for f16)
/// `a_rs` elements apart, columns of `b` `b_cs` apart, `k` inner elements, results at `out` in
/// rows `out_rs` apart.
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub(super) a: *const u8,
    pub(super) a_rs: usize,
    pub(super) b: *const u16,
    pub(super) b_cs: usize,
    pub(super) k: usize,
    pub(super) out: *mut u16,
    pub(super) out_rs: usize,
}

/// [`group`] compiled for its dtype's CPU features, each size a function of its own: all eight
/// sizes inlined into one function are slower (`docs/amx-routes.md`).
///
/// # Safety
/// As [`group`].
#[inline(always)]
unsafe fn run<const R: usize, const C: usize, const KIND: u8>(blk: Block) {
    // SAFETY: our contract, with the CPU features of the caller, which each callee needs.
    unsafe {
        match KIND {
            DOTS => group_bf16::<R, C>(blk),
            _ => group_widened::<R, C, KIND>(blk),
        }
    }
}

/// [`group`] for bf16.
///
/// # Safety
/// As [`group`]; the CPU has AVX-512 F and BW and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn group_bf16<const R: usize, const C: usize>(blk: Block) {
    // SAFETY: our contract.
    unsafe { group::<R, C, DOTS>(blk) }
}

/// [`group`] for f32 rows by f16 or bf16 columns ([`WIDE_F16`], [`WIDE_BF16`]).
///
/// # Safety
/// As [`group`]; the CPU has AVX-512 F, BW and VL, F16C and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
unsafe fn group_widened<const R: usize, const C: usize, const KIND: u8>(blk: Block) {
    // SAFETY: our contract.
    unsafe { group::<R, C, KIND>(blk) }
}

/// `R` rows by `C` columns of [`blocks`]: the block `blk`.
///
/// # Safety
/// As [`blocks`], for `R` rows and `C` columns.
#[inline(always)]
unsafe fn group<const R: usize, const C: usize, const KIND: u8>(blk: Block) {
    let Block { a, a_rs, b, b_cs, k, out, out_rs } = blk;
    let wide = KIND != DOTS;
    // Sums of f32 products start at -0, the identity of IEEE addition, and masked-off lanes
    // keep it, so a sum of only -0 products is -0, the exact sum; an empty sum is +0.
    let start = if wide && k > 0 { -0.0 } else { 0.0 };
    // SAFETY: (all blocks below) the CPU has the features of the caller (our contract): AVX-512
    // F and BW, and AVX512-BF16 (dots) or VL, F16C and FMA (widened).
    let mut acc = [[unsafe { _mm512_set1_ps(start) }; C]; R];
    let len = if wide { 16 } else { 32 };
    let full = k / len * len;
    for p in (0..full).step_by(len) {
        // SAFETY: a full step ends at or before `k`; our contract.
        unsafe { step::<R, C, KIND>(&mut acc, (a, a_rs), (b, b_cs), p, if wide { 0xffff } else { !0 }) };
    }
    if full < k {
        // SAFETY: the mask stops at `k`; our contract.
        unsafe { step::<R, C, KIND>(&mut acc, (a, a_rs), (b, b_cs), full, (1u32 << (k - full)) - 1) };
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            // SAFETY: our CPU features; (r, c) is inside the block (our contract).
            unsafe {
                let sum = _mm512_reduce_add_ps(*v);
                let bits =
                    if KIND == WIDE_F16 { half::f16::narrow(sum).to_bits() } else { half::bf16::narrow(sum).to_bits() };
                out.add(r * out_rs + c).write(bits);
            }
        }
    }
}

/// One step of [`group`] over inner elements `p ..`, those of `mask` only (32 for dots, 16 for
/// the widened kinds; the others read as zero, and masked-off elements are not read at all:
/// AVX-512 masked loads do not fault on them). A function, not a closure: a closure would be
/// compiled without the caller's CPU features, and the intrinsics would not be inlined into it.
///
/// # Safety
/// As [`group`]; the elements of `mask` from `p` are inside the rows and columns.
#[inline(always)]
unsafe fn step<const R: usize, const C: usize, const KIND: u8>(
    acc: &mut [[__m512; C]; R],
    (a, a_rs): (*const u8, usize),
    (b, b_cs): (*const u16, usize),
    p: usize,
    mask: u32,
) {
    // SAFETY: our contract: the elements read are inside the operands; our CPU features.
    unsafe {
        if KIND == DOTS {
            let w: [__m512bh; C] = core::array::from_fn(|c| {
                core::mem::transmute(_mm512_maskz_loadu_epi16(mask, b.add(c * b_cs + p).cast()))
            });
            for (r, row) in acc.iter_mut().enumerate() {
                let x: __m512bh =
                    core::mem::transmute(_mm512_maskz_loadu_epi16(mask, a.cast::<u16>().add(r * a_rs + p).cast()));
                for (v, &w) in row.iter_mut().zip(&w) {
                    *v = _mm512_dpbf16_ps(*v, x, w);
                }
            }
        } else {
            let m = mask as __mmask16;
            let w: [__m512; C] = core::array::from_fn(|c| {
                let half = _mm256_maskz_loadu_epi16(m, b.add(c * b_cs + p).cast());
                if KIND == WIDE_F16 {
                    _mm512_cvtph_ps(half)
                } else {
                    // A bf16 is the high half of the f32 of the same value.
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(half)))
                }
            });
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_maskz_loadu_ps(m, a.cast::<f32>().add(r * a_rs + p));
                for (v, &w) in row.iter_mut().zip(&w) {
                    *v = _mm512_mask3_fmadd_ps(x, w, *v, m);
                }
            }
        }
    }
}
