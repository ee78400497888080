//! Packing the operands into AMX's tile layouts: A in panels of 32 rows x 32 inner elements,
//! B in pairs of inner elements (16 columns x 32 inner elements per tile).

use super::super::matmul::Mat;
use super::{A_CHUNK, B_TILE, CHUNK, PANEL, Plan, TILE_COLS};

/// Packs the rows `32 * panel ..` of `a` (n x k) as `chunks` blocks of 32 rows x 32 inner
/// elements, row-major, zero past `n` and `k`.
///
/// # Safety
/// `a` addresses an initialised `n x k` matrix; `out` is valid for `chunks * A_CHUNK` writes;
/// the CPU has AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn pack_a_panel(p: &Plan, a: Mat<u16>, panel: usize, out: *mut u16) {
    for c in 0..p.chunks {
        let (k0, r0) = (c * CHUNK, panel * PANEL);
        let (kk, rows) = (CHUNK.min(p.k - k0), PANEL.min(p.n - r0));
        // SAFETY: chunk `c` of this panel is `A_CHUNK` elements from `c * A_CHUNK` of `out`.
        let blk = unsafe { core::slice::from_raw_parts_mut(out.add(c * A_CHUNK), A_CHUNK) };
        if kk < CHUNK || rows < PANEL {
            blk.fill(0);
        }
        // SAFETY: every (r0 + r, k0 + j) read below has r < rows, j < kk: inside `a`.
        let at = |r: usize, j: usize| unsafe { a.ptr.add((r0 + r) * a.rs + (k0 + j) * a.cs).read() };
        if a.cs == 1 && kk == CHUNK {
            for r in 0..rows {
                // SAFETY: row `r0 + r` holds 32 contiguous elements from column `k0` (a copy of
                // a fixed size, which compiles to two vector moves instead of a `memcpy` call).
                let src = unsafe { a.ptr.add((r0 + r) * a.rs + k0).cast::<[u16; CHUNK]>().read_unaligned() };
                blk[r * CHUNK..][..CHUNK].copy_from_slice(&src);
            }
        } else if a.cs == 1 {
            for r in 0..rows {
                // SAFETY: row `r0 + r` holds `kk` contiguous elements from column `k0`.
                let src = unsafe { core::slice::from_raw_parts(a.ptr.add((r0 + r) * a.rs + k0), kk) };
                blk[r * CHUNK..][..kk].copy_from_slice(src);
            }
        } else {
            // Inner index outside: a transposed `a` (rs == 1) reads down its contiguous columns.
            for j in 0..kk {
                for r in 0..rows {
                    blk[r * CHUNK + j] = at(r, j);
                }
            }
        }
    }
}

/// Packs tile `c` (inner elements `32 * c ..`) of tile column `t` (columns `16 * t ..`) of `b`
/// (k x m) in AMX's pair layout: row `q` of the tile holds, for each of its 16 columns, inner
/// elements `2q` and `2q + 1`; zero past `k` and `m`, into the `B_TILE` elements at `out`.
///
/// # Safety
/// `b` addresses an initialised `k x m` matrix; `out` is valid for `B_TILE` writes; the CPU has
/// AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn pack_b_tile(p: &Plan, b: Mat<u16>, c: usize, t: usize, out: *mut u16) {
    let k0 = c * CHUNK;
    let kk = CHUNK.min(p.k - k0);
    // SAFETY: every (k0 + i, j) read below has i < kk, j < m: inside `b`.
    let at = |i: usize, j: usize| unsafe { b.ptr.add((k0 + i) * b.rs + j * b.cs).read() };
    let c0 = t * TILE_COLS;
    let cols = TILE_COLS.min(p.m.saturating_sub(c0));
    // SAFETY: `out` holds the tile (our contract), written by this call only.
    let blk = unsafe { core::slice::from_raw_parts_mut(out, B_TILE) };
    if cols == TILE_COLS && kk == CHUNK && (b.cs == 1 || b.rs == 1) {
        if b.cs == 1 {
            // A full tile, built as 16 rows of 16 u32 pairs (low half: the even element).
            let mut tile = [[0u32; TILE_COLS]; CHUNK / 2];
            for (q, pairs) in tile.iter_mut().enumerate() {
                // SAFETY: rows `k0 + 2q` and `k0 + 2q + 1` hold 16 contiguous elements from
                // `c0` (copies of a fixed size: vector moves, not `memcpy` calls).
                let (lo, hi) = unsafe {
                    let at = |i: usize| b.ptr.add((k0 + i) * b.rs + c0).cast::<[u16; TILE_COLS]>().read_unaligned();
                    (at(2 * q), at(2 * q + 1))
                };
                for j in 0..TILE_COLS {
                    pairs[j] = lo[j] as u32 | (hi[j] as u32) << 16;
                }
            }
            // SAFETY: the tile is `B_TILE` u16 at `blk`; u16 pairs written as u32, unaligned.
            unsafe { blk.as_mut_ptr().cast::<[[u32; TILE_COLS]; CHUNK / 2]>().write_unaligned(tile) };
        } else {
            // SAFETY: columns `c0 .. c0 + 16` hold 32 contiguous elements each from row `k0`
            // (rs == 1, full tile); the tile is `B_TILE` u16 at `blk`; AVX-512 (our contract).
            unsafe { transpose_pairs(b.ptr.add(k0 + c0 * b.cs), b.cs, blk.as_mut_ptr()) };
        }
    } else {
        blk.fill(0);
        for j in 0..cols {
            for i in 0..kk {
                blk[(i / 2) * CHUNK + 2 * j + (i & 1)] = at(i, c0 + j);
            }
        }
    }
}

/// Writes the B tile of 16 columns x 32 inner elements of a transposed `b` (column `j` is 32
/// contiguous bf16 from `col + j * stride`) in the pair layout: read as 16 x 16 u32 pairs, one
/// row per column, it is their transpose (four rounds of AVX-512 shuffles).
///
/// # Safety
/// Each `col + j * stride` (j < 16) is valid for 32 reads; `out` for `B_TILE` writes; the CPU has
/// AVX-512 F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn transpose_pairs(col: *const u16, stride: usize, out: *mut u16) {
    use core::arch::x86_64::*;
    // SAFETY: the loads read 64 bytes at each column (our contract), the stores write 16 x 64
    // bytes to `out` (our contract); the shuffles only need AVX-512 F (our contract).
    #[allow(unused_unsafe)]
    unsafe {
        let mut r: [__m512i; 16] = core::array::from_fn(|j| _mm512_loadu_si512(col.add(j * stride).cast()));
        let mut t = [_mm512_setzero_si512(); 16];
        // Pairs of rows interleaved by u32, then by u64: lane L of r[4g + e] holds element
        // 4L + e of rows 4g .. 4g + 3.
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for g in 0..4 {
            let q = 4 * g;
            r[q] = _mm512_unpacklo_epi64(t[q], t[q + 2]);
            r[q + 1] = _mm512_unpackhi_epi64(t[q], t[q + 2]);
            r[q + 2] = _mm512_unpacklo_epi64(t[q + 1], t[q + 3]);
            r[q + 3] = _mm512_unpackhi_epi64(t[q + 1], t[q + 3]);
        }
        // Then 128-bit lanes: even lanes (0x88) and odd lanes (0xdd) of two registers.
        for e in 0..4 {
            t[e] = _mm512_shuffle_i32x4::<0x88>(r[e], r[e + 4]);
            t[e + 4] = _mm512_shuffle_i32x4::<0xdd>(r[e], r[e + 4]);
            t[e + 8] = _mm512_shuffle_i32x4::<0x88>(r[e + 8], r[e + 12]);
            t[e + 12] = _mm512_shuffle_i32x4::<0xdd>(r[e + 8], r[e + 12]);
        }
        for e in 0..8 {
            r[e] = _mm512_shuffle_i32x4::<0x88>(t[e], t[e + 8]);
            r[e + 8] = _mm512_shuffle_i32x4::<0xdd>(t[e], t[e + 8]);
        }
        for (q, row) in r.iter().enumerate() {
            _mm512_storeu_si512(out.add(q * TILE_COLS * 2).cast(), *row);
        }
    }
}
