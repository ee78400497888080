//! Packing the operands into AMX's tile layouts: A in panels of 32 rows x 32 inner elements,
//! B in pairs of inner elements (16 columns x 32 inner elements per tile).

use super::super::matmul::Mat;
use super::{A_CHUNK, B_TILE, CHUNK, PANEL, Plan, TILE_COLS};

/// Packs the rows `32 * panel ..` of `a` (n x k) as `chunks` blocks of 32 rows x 32 inner
/// elements, row-major, zero past `n` and `k`. With f16 elements (`p.parts == 2`) each block is
/// two, the high and the low bf16 parts ([`split16`]). Returns false if an f16 element is
/// infinite or NaN (bf16: always true).
///
/// # Safety
/// `a` addresses an initialised `n x k` matrix; `out` is valid for [`Plan::panel_len`] writes;
/// the CPU has AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn pack_a_panel(p: &Plan, a: Mat<u16>, panel: usize, out: *mut u16) -> bool {
    let split = p.parts == 2;
    let mut finite = true;
    for c in 0..p.chunks {
        let (k0, r0) = (c * CHUNK, panel * PANEL);
        let (kk, rows) = (CHUNK.min(p.k - k0), PANEL.min(p.n - r0));
        // SAFETY: chunk `c` of this panel (its parts) is `parts * A_CHUNK` elements from
        // `c * parts * A_CHUNK` of `out`.
        let blk = unsafe { core::slice::from_raw_parts_mut(out.add(c * p.parts * A_CHUNK), p.parts * A_CHUNK) };
        if kk < CHUNK || rows < PANEL {
            blk.fill(0);
        }
        // SAFETY: every (r0 + r, k0 + j) read below has r < rows, j < kk: inside `a`.
        let at = |r: usize, j: usize| unsafe { a.ptr.add((r0 + r) * a.rs + (k0 + j) * a.cs).read() };
        if a.cs == 1 && kk == CHUNK {
            for r in 0..rows {
                // SAFETY: row `r0 + r` holds 32 contiguous elements from column `k0`.
                let row = unsafe { a.ptr.add((r0 + r) * a.rs + k0) };
                if split {
                    let (hi, lo) = blk.split_at_mut(A_CHUNK);
                    for h in [0, TILE_COLS] {
                        // SAFETY: 16 elements from `row + h` (above); `hi` / `lo` hold row `r`.
                        finite &= unsafe { split16(row.add(h), &mut hi[r * CHUNK + h..], &mut lo[r * CHUNK + h..]) };
                    }
                } else {
                    // SAFETY: as above (a copy of a fixed size, which compiles to two vector
                    // moves instead of a `memcpy` call).
                    let src = unsafe { row.cast::<[u16; CHUNK]>().read_unaligned() };
                    blk[r * CHUNK..][..CHUNK].copy_from_slice(&src);
                }
            }
        } else if a.cs == 1 && !split {
            for r in 0..rows {
                // SAFETY: row `r0 + r` holds `kk` contiguous elements from column `k0`.
                let src = unsafe { core::slice::from_raw_parts(a.ptr.add((r0 + r) * a.rs + k0), kk) };
                blk[r * CHUNK..][..kk].copy_from_slice(src);
            }
        } else {
            // Inner index outside: a transposed `a` (rs == 1) reads down its contiguous columns.
            for j in 0..kk {
                for r in 0..rows {
                    finite &= put(blk, A_CHUNK, r * CHUNK + j, at(r, j), split);
                }
            }
        }
    }
    finite
}

/// Packs tile `c` (inner elements `32 * c ..`) of tile column `t` (columns `16 * t ..`) of `b`
/// (k x m) in AMX's pair layout: row `q` of the tile holds, for each of its 16 columns, inner
/// elements `2q` and `2q + 1`; zero past `k` and `m`, into the `B_TILE` elements at `out`. With
/// f16 elements (`p.parts == 2`), the tile of high parts and then the tile of low parts
/// ([`split16`]). Returns false if an f16 element is infinite or NaN (bf16: always true).
///
/// # Safety
/// `b` addresses an initialised `k x m` matrix; `out` is valid for `p.parts * B_TILE` writes;
/// the CPU has AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn pack_b_tile(p: &Plan, b: Mat<u16>, c: usize, t: usize, out: *mut u16) -> bool {
    let split = p.parts == 2;
    let k0 = c * CHUNK;
    let kk = CHUNK.min(p.k - k0);
    // SAFETY: every (k0 + i, j) read below has i < kk, j < m: inside `b`.
    let at = |i: usize, j: usize| unsafe { b.ptr.add((k0 + i) * b.rs + j * b.cs).read() };
    let c0 = t * TILE_COLS;
    let cols = TILE_COLS.min(p.m.saturating_sub(c0));
    // SAFETY: `out` holds the tile (its parts; our contract), written by this call only.
    let blk = unsafe { core::slice::from_raw_parts_mut(out, p.parts * B_TILE) };
    let mut finite = true;
    if cols == TILE_COLS && kk == CHUNK && (b.cs == 1 || b.rs == 1) {
        if b.cs == 1 {
            // A full tile, built as 16 rows of 16 u32 pairs (low half: the even element).
            let mut tiles = [[[0u32; TILE_COLS]; CHUNK / 2]; 2];
            for q in 0..CHUNK / 2 {
                // SAFETY: rows `k0 + 2q` and `k0 + 2q + 1` hold 16 contiguous elements from `c0`.
                let row = |i: usize| unsafe { b.ptr.add((k0 + i) * b.rs + c0) };
                // Each row's elements, or its parts: [even row, odd row] x [high, low].
                let mut parts = [[[0u16; TILE_COLS]; 2]; 2];
                for (e, part) in parts.iter_mut().enumerate() {
                    if split {
                        let [hi, lo] = part;
                        // SAFETY: 16 elements at `row(2q + e)` (above).
                        finite &= unsafe { split16(row(2 * q + e), hi, lo) };
                    } else {
                        // SAFETY: as above (a copy of a fixed size: vector moves, not `memcpy`).
                        part[0] = unsafe { row(2 * q + e).cast::<[u16; TILE_COLS]>().read_unaligned() };
                    }
                }
                for (s, tile) in tiles.iter_mut().enumerate().take(p.parts) {
                    for j in 0..TILE_COLS {
                        tile[q][j] = parts[0][s][j] as u32 | (parts[1][s][j] as u32) << 16;
                    }
                }
            }
            for (s, tile) in tiles.iter().enumerate().take(p.parts) {
                // SAFETY: part `s` is `B_TILE` u16 from `s * B_TILE` of `blk`; u16 pairs written
                // as u32, unaligned.
                unsafe {
                    blk.as_mut_ptr().add(s * B_TILE).cast::<[[u32; TILE_COLS]; CHUNK / 2]>().write_unaligned(*tile)
                };
            }
        } else if split {
            // The columns' parts side by side (column `j` at `32 j`), then each transposed.
            let (mut hi, mut lo) = ([0u16; B_TILE], [0u16; B_TILE]);
            for j in 0..TILE_COLS {
                for h in [0, TILE_COLS] {
                    // SAFETY: column `c0 + j` holds 32 contiguous elements from row `k0` (rs == 1,
                    // full tile); `hi` / `lo` hold 16 from `j * 32 + h`.
                    finite &= unsafe {
                        let col = b.ptr.add(k0 + h + (c0 + j) * b.cs);
                        split16(col, &mut hi[j * CHUNK + h..], &mut lo[j * CHUNK + h..])
                    };
                }
            }
            // SAFETY: `hi` / `lo` hold 16 columns of 32 elements, `CHUNK` apart; the parts are
            // `B_TILE` u16 each at `blk`; AVX-512 (our contract).
            unsafe {
                transpose_pairs(hi.as_ptr(), CHUNK, blk.as_mut_ptr());
                transpose_pairs(lo.as_ptr(), CHUNK, blk.as_mut_ptr().add(B_TILE));
            }
        } else {
            // SAFETY: columns `c0 .. c0 + 16` hold 32 contiguous elements each from row `k0`
            // (rs == 1, full tile); the tile is `B_TILE` u16 at `blk`; AVX-512 (our contract).
            unsafe { transpose_pairs(b.ptr.add(k0 + c0 * b.cs), b.cs, blk.as_mut_ptr()) };
        }
    } else {
        blk.fill(0);
        for j in 0..cols {
            for i in 0..kk {
                finite &= put(blk, B_TILE, (i / 2) * CHUNK + 2 * j + (i & 1), at(i, c0 + j), split);
            }
        }
    }
    finite
}

/// Writes element `x` at `blk[at]`, or (`split`, an f16 `x`) its high part there and its low
/// part at `blk[part + at]`. Returns false for an f16 infinity or NaN.
#[inline(always)]
fn put(blk: &mut [u16], part: usize, at: usize, x: u16, split: bool) -> bool {
    if !split {
        blk[at] = x;
        return true;
    }
    use crate::halfconv::HalfFloat;
    let v = half::f16::from_bits(x).widen();
    let hi = v.to_bits() & 0xffff_0000;
    blk[at] = (hi >> 16) as u16;
    blk[part + at] = ((v - f32::from_bits(hi)).to_bits() >> 16) as u16;
    x & 0x7c00 != 0x7c00
}

/// Splits 16 f16 values (bits, from `src`) into bf16 parts, the first 16 of `hi` and of `lo`,
/// with `x == hi + lo` exactly: `hi` keeps the top 8 of an f16's 11 significant bits (the top
/// half of its f32), `lo` the other 3 (their difference, exact in f32 and in bf16). f16
/// subnormals are normal numbers in bf16, so AMX's flushing of subnormals never meets a part.
/// Returns false if a value is infinite or NaN (whose parts are not its sum).
///
/// # Safety
/// `src` is valid for 16 reads; the CPU has AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn split16(src: *const u16, hi: &mut [u16], lo: &mut [u16]) -> bool {
    use core::arch::x86_64::*;
    let (hi, lo) = (&mut hi[..TILE_COLS], &mut lo[..TILE_COLS]);
    // SAFETY: 32 bytes from `src` (our contract); 32 bytes to each of `hi` and `lo` (16 u16,
    // checked by the slicing above); the instructions need AVX-512 F, BW and VL (our contract).
    #[allow(unused_unsafe)]
    unsafe {
        let h = _mm256_loadu_si256(src.cast());
        let v = _mm512_cvtph_ps(h);
        let top = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0xffff_0000_u32 as i32));
        let rest = _mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(top)));
        _mm256_storeu_si256(hi.as_mut_ptr().cast(), _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(top)));
        _mm256_storeu_si256(lo.as_mut_ptr().cast(), _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(rest)));
        let exp = _mm256_and_si256(h, _mm256_set1_epi16(0x7c00));
        _mm256_cmpeq_epi16_mask(exp, _mm256_set1_epi16(0x7c00)) == 0
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
