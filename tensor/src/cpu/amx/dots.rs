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
