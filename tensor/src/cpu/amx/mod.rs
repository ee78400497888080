//! bf16 and f16 matrix products on AMX tiles (Intel's server cores from Sapphire Rapids on); bf16 products, and f16 products of few rows, on AVX-512 registers where there is no
//! AMX.
//!
//! The f32 route converts both operands to f32, runs gemm's AVX-512 kernels and rounds the
//! result, several times PyTorch's time where PyTorch uses AMX (`docs/amx-routes.md`). AMX multiplies 16x32 by 32x16 bf16 tiles into 16x16 f32 tiles in one
//! instruction (`tdpbf16ps`). This module packs the operands into tiles, multiplies with four
//! accumulator tiles (a 32x32 block of the result) and rounds each block to bf16 once, at
//! PyTorch's speed.
//!
//! The arithmetic is AMX's, as in PyTorch on the same CPU: products of bf16 pairs are exact, the
//! sums are f32 (rounded to nearest, ties to even, in the order the hardware takes them), and
//! subnormal inputs and results are read and written as zero. So results may differ from the
//! f32 route in the last bit of a bf16, and values below 2^-126 become 0.
//! [`set_amx`](crate::set_amx) turns the route off for reproducibility across machines.
//!
//! f16 products use the same bf16 tiles (AMX-FP16 is a later generation's): each f16 value,
//! 11 significant bits, is split into two bf16 parts with `x == hi + lo` exactly (the top 8
//! bits and the other 3), and the kernel adds all four products of parts, each exact in f32. So
//! an f16 product gets the f32 route's arithmetic (exact products, f32 sums, one rounding to
//! f16) at four times the tile work, still faster than the f32 route. f16 subnormals are normal
//! bf16 parts and every sum is a multiple of 2^-48, so AMX's flushing never applies. Operands
//! holding an infinity or a NaN (found while packing) take the f32 route: split into parts,
//! `inf * 1` would become `inf * 1 + inf * 0`, a NaN.
//!
//! Stable Rust has no AMX intrinsics; the tile instructions are written in `asm!`. Linux grants
//! the tile registers to a process on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); without the
//! grant (another OS, an old kernel, a CPU without AMX) the tiles are not used.
//!
//! AMD CPUs with AVX512-BF16 (Zen 4 and later) run bf16 products from the same packed operands
//! on AVX-512 registers instead ([`dots`]: `vdpbf16ps`, as oneDNN there), with the same
//! arithmetic, at PyTorch's speed there. Products of fewer than 32
//! rows by a transposed weight skip the packing there: dot products of rows and columns in
//! groups of 4 rows ([`few_rows`]). Intel CPUs have the instruction too, but run it at half
//! the rate of their f32 multiply-adds, so there that route is off unless asked for
//! ([`set_avx512_bf16`](crate::set_avx512_bf16),
//! [`AVX512_BF16_ENV`](crate::AVX512_BF16_ENV), which also turn it off on AMD).
//! Everything else takes the f32 route.
//!
//! f16 products of fewer than 32 rows by a transposed weight (with AMX, of fewer than 20) run as
//! the same dot products on any AVX-512 CPU ([`few_rows::widened`]): the rows widened to f32 once, the weight's f16
//! widened as it is read, fused multiply-adds. That is the f32 route's arithmetic (products of
//! f16 are exact in f32) without converting the whole weight on every call. bf16 products of that shape
//! do the same ([`few_rows::widened`]) where AVX512-BF16's route is off. Other f16 products
//! take the f32 route there.

#![cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use core::sync::atomic::Ordering;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use super::matmul::Mat;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use super::{Shared, piece_range};

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod dots;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) mod few_rows;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) mod few_rows_avx2;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) mod few_rows_by_rows;
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles;
use super::switch::{amx_enabled, avx512_bf16_enabled};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use pack::{pack_a_panel, pack_b_tile};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use tiles::Tiles;

/// The hardware that multiplies the packed operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// AMX tiles (`tdpbf16ps`): bf16, and f16 split into bf16 parts.
    Tiles,
    /// AVX512-BF16 registers (`vdpbf16ps`, [`dots`]): bf16 only.
    Dots,
    /// Fewer rows than a panel, the right operand with contiguous columns: dot products of rows
    /// and columns, unpacked ([`few_rows_product`]): bf16 on AVX512-BF16 (`dots`) where that
    /// route is on, else (and f16) on AVX-512's fused multiply-adds, or AVX2's
    /// ([`few_rows_avx2`]) on CPUs without AVX-512.
    FewRows { dots: bool },
    /// Fewer rows than a panel, the right operand with contiguous rows (a weight stored
    /// `[in, out]`, as GPT-2's `Conv1D`): its rows widened to f32 as they are read and added
    /// into each result row's f32 sums by AVX2's fused multiply-adds ([`few_rows_by_rows`]).
    FewRowsByRows,
}

/// The route an `n x k` by `k x m` product of `f16` (else bf16) operands takes, if any; `b_columns`:
/// the right operand is of that dtype with contiguous columns (a transposed weight, as `Linear`
/// stores it); `b_rows`: with contiguous rows (a weight stored `[in, out]`, as GPT-2's `Conv1D`).
///
/// Panels go on AMX when on, else on AVX512-BF16 for bf16 when on, where the matrices fill tiles
/// well enough: padding to 32 rows, 32 columns and 32 inner elements at most doubles each size
/// there (except f16 products of fewer than [`F16_FEW_ROWS_BESIDE_TILES`] rows, which go to
/// dot products as below). Without AMX, fewer than 32 rows (a decode step's few tokens) go to
/// dot products where `b`'s columns are contiguous, in groups of 4 rows instead of panels of 32
/// (padding fewer rows to a panel wastes most of it), on any AVX-512 CPU: bf16 on AVX512-BF16 when on, else (and f16) on fused
/// multiply-adds, the f32 route's arithmetic without converting the weight; on AVX2 CPUs, on
/// AVX2's multiply-adds ([`few_rows_avx2`]). Fewer than 32 rows by a weight with contiguous rows
/// that takes none of those routes go to [`few_rows_by_rows`] on any AVX2 CPU. Anything else
/// (matrix-vector products of other layouts, tiny batched heads) takes the f32 route.
pub(super) fn route(n: usize, k: usize, m: usize, f16: bool, b_columns: bool, b_rows: bool) -> Option<Route> {
    let panels = n >= 16 && m >= 16 && k >= 32;
    let dots = !f16 && avx512_bf16_enabled();
    // (AVX512-BF16's switch is on only on AVX-512 CPUs.)
    let avx2 = super::isa::detected() >= super::isa::Isa::Avx2;
    let few = b_columns && n < PANEL && avx2;
    if panels && amx_enabled() && !(f16 && few && n < F16_FEW_ROWS_BESIDE_TILES) {
        Some(Route::Tiles)
    } else if few {
        Some(Route::FewRows { dots })
    } else if dots && panels {
        Some(Route::Dots)
    } else if b_rows && n < PANEL && avx2 {
        Some(Route::FewRowsByRows)
    } else {
        None
    }
}

/// Rows of the result per panel (two tiles).
const PANEL: usize = 32;
/// f16 products of fewer rows than this by a transposed weight take the few-row kernel also
/// where AMX is on. On tiles such a product pads its rows to one panel and splits every weight
/// element into two bf16 parts as it packs, a cost that does not shrink with the rows, while
/// the few-row kernel's time grows with them: it is ahead below about 20-26 rows, and 20 keeps
/// it where both estimates agree (`docs/amx-routes.md`). bf16 keeps the tiles: its packing has no split and its tiles a
/// quarter of f16's work.
const F16_FEW_ROWS_BESIDE_TILES: usize = 20;
/// Inner elements per tile (32 bf16 in a 64-byte tile row).
const CHUNK: usize = 32;
/// Columns of the result per B tile.
const TILE_COLS: usize = 16;
/// u16 elements in one packed A chunk (32 rows x 32) and one packed B tile (16 x 32).
const A_CHUNK: usize = PANEL * CHUNK;
const B_TILE: usize = TILE_COLS * CHUNK;
/// Chunks per pass over a column group: the panel's 16 KiB slice (32 KiB with f16's two
/// parts; faster than 4 chunks) stays in L1 while the group's B tiles stream past
/// it from L2.
const PASS: usize = 8;
/// Packed B bytes one column group keeps in L2 while every panel runs across it. Half of
/// an AMX core's 2 MiB L2 leaves room for the panels of a long inner dimension (768 KiB of
/// packed A for 128 x 3072, GPT-2's MLP down product), which run across every group: that
/// product is faster than with 1 MiB groups, and the others the same (`docs/amx-routes.md`).
const GROUP_BYTES: usize = 1 << 19;
/// Up to this many panels (256 rows: a Linear layer over a few hundred tokens), each packed B
/// tile serves too few panels to pay for writing all of B out and reading it back.
const FEW_PANELS: usize = 8;
/// The most pairs of B tiles (32 columns each) in a column group: its f32 results for one
/// panel (32 x 256 x 4 bytes) sit in a 32 KiB block on the stack.
const GROUP_PAIRS: usize = 8;
const GROUP_COLS: usize = GROUP_PAIRS * 2 * TILE_COLS;

/// The sizes of one batched product, padded to tiles.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    n: usize,
    k: usize,
    m: usize,
    /// Inner chunks (`k` padded to 32, over 32).
    chunks: usize,
    /// Panels of 32 rows.
    panels: usize,
    /// B tiles of 16 columns (even: the kernel takes them in pairs).
    col_tiles: usize,
    batches: usize,
    /// Pieces the work is split into at most.
    threads: usize,
    /// Few panels ([`FEW_PANELS`] or fewer): B is packed one column group at a time inside the
    /// multiplying phase, into each piece's own L2-sized buffer, instead of all at once.
    fused: bool,
    /// Packed parts per element: 1 for bf16 operands; 2 for f16 ones, each split into a bf16
    /// high and low part (`x == hi + lo` exactly), packed one after the other per chunk or tile.
    parts: usize,
    route: Route,
}

impl Plan {
    /// The plan for `batches` products of `n x k` by `k x m` on `route`, of f16 operands if `f16`
    /// (which takes [`Route::Tiles`]), else bf16.
    pub(super) fn new(batches: usize, n: usize, k: usize, m: usize, threads: usize, f16: bool, route: Route) -> Plan {
        let (chunks, panels) = (k.div_ceil(CHUNK), n.div_ceil(PANEL));
        let col_tiles = m.div_ceil(2 * TILE_COLS) * 2;
        let (threads, fused, parts) = (threads.max(1), panels <= FEW_PANELS, 1 + f16 as usize);
        Plan { n, k, m, chunks, panels, col_tiles, batches, threads, fused, parts, route }
    }

    /// u16 elements of one packed A panel.
    fn panel_len(&self) -> usize {
        self.chunks * self.parts * A_CHUNK
    }

    /// u16 elements of one packed B tile column.
    fn column_len(&self) -> usize {
        self.chunks * self.parts * B_TILE
    }

    /// u16 elements of packed A (all batches); `None` if that overflows.
    pub(super) fn packed_a(&self) -> Option<usize> {
        self.batches.checked_mul(self.panels)?.checked_mul(self.chunks)?.checked_mul(self.parts * A_CHUNK)
    }

    /// u16 elements of packed B: all batches', or one column group per piece when `fused`;
    /// `None` if that overflows.
    pub(super) fn packed_b(&self) -> Option<usize> {
        let tiles = if self.fused {
            self.threads.checked_mul(2 * self.group_pairs())?
        } else {
            self.batches.checked_mul(self.col_tiles)?
        };
        tiles.checked_mul(self.chunks)?.checked_mul(self.parts * B_TILE)
    }

    /// Pairs of B tiles per column group: as many as fit [`GROUP_BYTES`], at most
    /// [`GROUP_PAIRS`]; when `fused`, also few enough that every piece gets a group.
    fn group_pairs(&self) -> usize {
        let fit = GROUP_BYTES / (self.column_len() * 2 * 2);
        let spread = if self.fused { (self.col_tiles / 2).div_ceil(self.threads) } else { usize::MAX };
        fit.min(spread).clamp(1, GROUP_PAIRS)
    }
}

/// `dst[i] (n x m, row-major) = a[i] (n x k) * b[i] (k x m)` for each batch `i`, on AMX tiles,
/// of bf16 or (with `plan.parts == 2`) f16 elements, rounded to the same type.
/// `a_offsets[i]` / `b_offsets[i]` are the elements from `a.ptr` / `b.ptr` to matrix `i`;
/// `pack_a` and `pack_b` are scratch of [`Plan::packed_a`] / [`Plan::packed_b`] elements.
///
/// Returns false, with `dst` partly written, when an f16 operand holds an infinity or a NaN:
/// split into parts, `inf * 1` would become `inf * 1 + inf * 0`, a NaN, so the caller takes
/// the f32 route for such operands.
///
/// # Safety
/// [`route`] returned the plan's route, [`Route::Tiles`] or [`Route::Dots`], for these sizes and
/// dtype (so its hardware is usable, and the CPU has AVX-512 F, BW and VL: `amx_supported` and
/// `avx512_bf16_supported` require them). Every matrix addresses initialised bf16 (f16 with
/// `plan.parts == 2`) bits with the given strides; `dst` is valid for writes of
/// `batches * n * m` elements and overlaps nothing else; the scratch buffers are valid for
/// writes, separate from everything.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product(
    plan: Plan,
    a: Mat<u16>,
    a_offsets: &[usize],
    b: Mat<u16>,
    b_offsets: &[usize],
    dst: *mut u16,
    pack_a: *mut u16,
    pack_b: *mut u16,
    threads: usize,
) -> bool {
    use crate::parallel::for_each_piece;
    use core::sync::atomic::AtomicBool;
    let p = plan;
    // Set by a packing job that met an f16 infinity or NaN; later jobs then skip their work.
    let non_finite = AtomicBool::new(false);
    let flag = |finite: bool| {
        if !finite {
            non_finite.store(true, Ordering::Relaxed);
        }
    };
    let (pa, pb, out) = (Shared(pack_a), Shared(pack_b), Shared(dst));
    let (a, b) = (Shared(a), Shared(b));
    // `jobs` split into consecutive ranges, one per piece.
    let pieces = |jobs: usize| threads.clamp(1, jobs.max(1));

    // Phase 1: pack every A panel, and B by inner chunk (a row-major `b` is read row after row)
    // or, for a transposed one (a Linear layer's weight), by tile column (column after column),
    // so the reads stream either way.
    let a_jobs = p.batches * p.panels;
    let by_column = b.get().rs == 1 && b.get().cs != 1;
    let b_jobs = if by_column { p.col_tiles } else { p.chunks };
    let jobs = a_jobs + if p.fused { 0 } else { p.batches * b_jobs };
    let n_pieces = pieces(jobs);
    for_each_piece(n_pieces, |piece| {
        for job in piece_range(jobs, 1, n_pieces, piece) {
            if job < a_jobs {
                let (bi, panel) = (job / p.panels, job % p.panels);
                let a = a.get();
                // SAFETY: matrix `bi` of `a` is valid (our contract); this panel's part of the
                // scratch is `panel_len()` elements at its index, written by this job only;
                // the route implies AVX-512 (our contract).
                flag(unsafe {
                    let src = Mat { ptr: a.ptr.add(a_offsets[bi]), ..a };
                    pack_a_panel(&p, src, panel, pa.get().add(job * p.panel_len()))
                });
            } else {
                let job = job - a_jobs;
                let (bi, part) = (job / b_jobs, job % b_jobs);
                let b = b.get();
                let (chunks, tiles) =
                    if by_column { (0..p.chunks, part..part + 1) } else { (part..part + 1, 0..p.col_tiles) };
                for (c, t) in chunks.flat_map(|c| tiles.clone().map(move |t| (c, t))) {
                    // SAFETY: as above, for tile `c` (its parts) of tile column `t` of matrix `bi`,
                    // inside its batch's `col_tiles` columns; each job packs its own tiles.
                    flag(unsafe {
                        let src = Mat { ptr: b.ptr.add(b_offsets[bi]), ..b };
                        let tile = (bi * p.col_tiles + t) * p.column_len() + c * p.parts * B_TILE;
                        pack_b_tile(&p, src, c, t, pb.get().add(tile))
                    });
                }
            }
        }
    });

    if non_finite.load(Ordering::Relaxed) {
        return false;
    }

    // Phase 2: a job is one panel across one column group, so each piece runs its panels
    // across the same packed B while it is in L2. With few panels (`fused`), a job is every
    // panel across one column group, whose B tiles the job packs first into its piece's buffer.
    let pairs = p.col_tiles / 2;
    let per_group = p.group_pairs();
    let groups = pairs.div_ceil(per_group);
    let panel_jobs = if p.fused { 1 } else { p.panels };
    let jobs = p.batches * groups * panel_jobs;
    let n_pieces = pieces(jobs);
    for_each_piece(n_pieces, |piece| {
        let mut acc = Block([0.0; PANEL * GROUP_COLS]);
        // SAFETY: the plan's route is usable (our contract).
        let engine = unsafe { Engine::start(p.route) };
        let own_b = per_group * 2 * p.column_len();
        for job in piece_range(jobs, 1, n_pieces, piece) {
            if non_finite.load(Ordering::Relaxed) {
                return;
            }
            let (bi, rest) = (job / (groups * panel_jobs), job % (groups * panel_jobs));
            let (group, panel) = (rest / panel_jobs, rest % panel_jobs);
            let pairs = group * per_group..((group + 1) * per_group).min(pairs);
            let b_cols = if p.fused {
                let b = b.get();
                let t0 = 2 * pairs.start;
                let (inner, outer) = if by_column { (p.chunks, 2 * pairs.len()) } else { (2 * pairs.len(), p.chunks) };
                for i in 0..inner * outer {
                    let (x, y) = (i / inner, i % inner);
                    let (c, t) = if by_column { (y, t0 + x) } else { (x, t0 + y) };
                    // SAFETY: matrix `bi` of `b` is valid (our contract); piece `piece` owns
                    // `own_b` elements of the scratch (`packed_b` holds one group per piece),
                    // and tile (t - t0, c) of this group is inside them; AVX-512 (our contract).
                    flag(unsafe {
                        let src = Mat { ptr: b.ptr.add(b_offsets[bi]), ..b };
                        let tile = piece * own_b + (t - t0) * p.column_len() + c * p.parts * B_TILE;
                        pack_b_tile(&p, src, c, t, pb.get().add(tile))
                    });
                }
                if non_finite.load(Ordering::Relaxed) {
                    return;
                }
                // SAFETY: as above.
                unsafe { pb.get().add(piece * own_b) }
            } else {
                // SAFETY: phase 1 packed every tile column of batch `bi`.
                unsafe { pb.get().add((bi * p.col_tiles + 2 * pairs.start) * p.column_len()) }
            };
            let panels = if p.fused { 0..p.panels } else { panel..panel + 1 };
            for panel in panels {
                // SAFETY: phase 1 packed this panel of batch `bi`, and `b_cols` holds this
                // group's tile columns (packed above or in phase 1); the block of results (rows of
                // the panel, columns of the group, clipped to n x m) lies in result `bi` and only
                // this job writes it; the route implies AVX-512 (our contract).
                unsafe {
                    let a_panel = pa.get().add((bi * p.panels + panel) * p.panel_len());
                    group_block(&engine, &p, a_panel, b_cols, pairs.len(), &mut acc);
                    let (r0, c0) = (panel * PANEL, pairs.start * 2 * TILE_COLS);
                    let rows = PANEL.min(p.n - r0);
                    let cols = (pairs.len() * 2 * TILE_COLS).min(p.m - c0);
                    for r in 0..rows {
                        let to = out.get().add(bi * p.n * p.m + (r0 + r) * p.m + c0);
                        let from = &acc.0[r * GROUP_COLS..][..cols];
                        if p.parts == 2 { round_row::<true>(from, to) } else { round_row::<false>(from, to) }
                    }
                }
            }
        }
    });
    !non_finite.load(Ordering::Relaxed)
}

/// A kernel of [`few_rows`]: [`few_rows::bf16`] (`A` = bf16 bits), or [`few_rows::widened`],
/// [`few_rows_avx2::widened`] and [`few_rows_by_rows::widened`] (`A` = f32, the rows widened).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) type FewRowsKernel<A> =
    unsafe fn(*const A, usize, *const u16, usize, usize, usize, core::ops::Range<usize>, *mut u16, usize);

/// `dst[i] (n x m, row-major) = a[i] (n x k) * b[i] (k x m)` for each batch `i`, in bf16 or f16,
/// by `kernel` (from [`few_rows`] or [`few_rows_by_rows`]), the columns split across `threads`
/// pieces; `a_offsets[i]` / `b_offsets[i]` are the elements from `a.ptr` / `b.ptr` to matrix
/// `i`; `b_step` is the stride the kernel steps `b` by: `b.cs` for the dot products of rows and
/// columns, `b.rs` for [`few_rows_by_rows`].
///
/// # Safety
/// [`route`] returned [`Route::FewRows`] or [`Route::FewRowsByRows`] for this dtype, so the CPU
/// has `kernel`'s features; every matrix addresses initialised elements of the kernel's types
/// with the given strides, `a`'s rows contiguous (`a.cs == 1`) or `k <= 1`, and `b`'s columns
/// (`b.rs == 1`) or `k <= 1` for the dot products, `b`'s rows (`b.cs == 1`) or `m <= 1` for
/// [`few_rows_by_rows`]; `dst` is valid for writes of `batches * n * m` elements and overlaps
/// nothing else.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) unsafe fn few_rows_product<A: Copy>(
    kernel: FewRowsKernel<A>,
    (a, a_offsets): (Mat<A>, &[usize]),
    (b, b_offsets, b_step): (Mat<u16>, &[usize], usize),
    (n, k, m): (usize, usize, usize),
    dst: *mut u16,
    threads: usize,
) {
    // Pieces take whole blocks of 4 columns (the kernel's), the last one clipped to `m`.
    let blocks = m.div_ceil(4);
    let pieces = threads.clamp(1, blocks.max(1));
    let (a, b, out) = (Shared(a), Shared(b), Shared(dst));
    crate::parallel::for_each_piece(pieces, |piece| {
        let cols = piece_range(m, 4, pieces, piece);
        let (a, b) = (a.get(), b.get());
        for (i, (&x, &y)) in a_offsets.iter().zip(b_offsets).enumerate() {
            // SAFETY: matrix `i` of each operand is valid with these strides, in the layouts
            // `kernel` reads (our contract); result `i` is the `n * m` elements from `i * n * m`
            // of `dst`, of which this piece writes its own columns; the CPU has the kernel's
            // features (our contract).
            unsafe {
                kernel(a.ptr.add(x), a.rs, b.ptr.add(y), b_step, n, k, cols.clone(), out.get().add(i * n * m), m)
            };
        }
    });
}

/// One panel's f32 results across one column group, 64-byte aligned rows for the tile stores.
#[repr(C, align(64))]
struct Block([f32; PANEL * GROUP_COLS]);

/// The hardware of a [`Route`], ready on this thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
enum Engine {
    Tiles(Tiles),
    Dots,
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
impl Engine {
    /// # Safety
    /// `route` is usable: [`route`] returned it.
    unsafe fn start(route: Route) -> Engine {
        match route {
            // SAFETY: AMX is usable (our contract).
            Route::Tiles => Engine::Tiles(unsafe { Tiles::configure() }),
            // (Few-row products are not packed; their route would run on registers too.)
            Route::Dots | Route::FewRows { .. } | Route::FewRowsByRows => Engine::Dots,
        }
    }

    /// [`Tiles::multiply`] on this engine's hardware (`split` on tiles only).
    ///
    /// # Safety
    /// As [`Tiles::multiply`]; `split` only on [`Engine::Tiles`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn multiply(
        &self,
        a: *const u16,
        b0: *const u16,
        b1: *const u16,
        count: usize,
        acc: *mut f32,
        add: bool,
        split: bool,
    ) {
        match self {
            // SAFETY: our contract.
            Engine::Tiles(tiles) => unsafe { tiles.multiply(a, b0, b1, count, acc, add, split) },
            Engine::Dots => {
                debug_assert!(!split, "f16 products take the tile route only");
                // SAFETY: our contract (without `split`); the route is usable, so the CPU has
                // AVX-512 F and AVX512-BF16 (`avx512_bf16_supported`).
                unsafe { dots::multiply(a, b0, b1, count, acc, add) }
            }
        }
    }
}

/// `acc[.., ..32 * pairs] = A panel x the B tile columns from `b_cols``, in passes of
/// [`PASS`] chunks (each pass adds to the results the last one stored).
///
/// # Safety
/// `a_panel` holds `p.chunks` packed A chunks (of `p.parts` parts each); `b_cols` holds
/// `2 * pairs` packed tile columns of [`Plan::column_len`] elements each, one after the other;
/// `pairs <= GROUP_PAIRS`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn group_block(
    engine: &Engine,
    p: &Plan,
    a_panel: *const u16,
    b_cols: *const u16,
    pairs: usize,
    acc: &mut Block,
) {
    let column = p.column_len();
    let mut first = 0;
    while first < p.chunks {
        let count = PASS.min(p.chunks - first);
        for pair in 0..pairs {
            // SAFETY: the chunks `first .. first + count` of the panel and of the two tile
            // columns of this pair exist (our contract); the pair's 32 columns of `acc` are
            // inside its 32 x GROUP_COLS f32 (pair < GROUP_PAIRS).
            unsafe {
                let out = acc.0.as_mut_ptr().add(pair * 2 * TILE_COLS);
                let b0 = b_cols.add(2 * pair * column + first * p.parts * B_TILE);
                let a = a_panel.add(first * p.parts * A_CHUNK);
                engine.multiply(a, b0, b0.add(column), count, out, first > 0, p.parts == 2);
            }
        }
        first += count;
    }
}

/// Rounds `from` to f16 (`F16`) or bf16 bits into `to` (compiled for AVX-512, which every AMX
/// CPU has).
///
/// # Safety
/// `to` is valid for `from.len()` writes; the CPU has AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn round_row<const F16: bool>(from: &[f32], to: *mut u16) {
    use crate::halfconv::HalfFloat;
    for (i, &v) in from.iter().enumerate() {
        let bits = if F16 { half::f16::narrow(v).to_bits() } else { half::bf16::narrow(v).to_bits() };
        // SAFETY: the caller gives `from.len()` writable elements at `to`.
        unsafe { to.add(i).write(bits) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::isa::{Isa, detected};

    /// A decode step's rows by GPT-2's transposed 3072x768 weight: f16 below 20 rows takes the
    /// few-row kernel whether or not AMX is on; at 20 rows and more, and bf16 from 16 rows,
    /// the tiles where AMX is on. Fewer than 32 rows by a weight with contiguous rows take the
    /// by-rows kernel where the tiles do not take them; other layouts the f32 route.
    #[test]
    fn f16_products_of_few_rows_skip_the_tiles() {
        if detected() != Isa::Avx512 {
            eprintln!("skipped: few-row products run on AVX-512 only");
            return;
        }
        let f32_dots = Some(Route::FewRows { dots: false });
        for n in [1, 15, 16, 19] {
            assert_eq!(route(n, 768, 3072, true, true, false), f32_dots, "f16, {n} rows");
        }
        let bf16_few = Some(Route::FewRows { dots: avx512_bf16_enabled() });
        let by_rows = Some(Route::FewRowsByRows);
        for n in [1, 15] {
            assert_eq!(route(n, 768, 3072, true, false, true), by_rows, "f16, {n} rows, row-major weight");
        }
        assert_eq!(route(1, 768, 3072, true, false, false), None, "f16, 1 row, strided weight");
        assert_eq!(route(15, 768, 3072, false, true, false), bf16_few);
        if amx_enabled() {
            for n in [20, 31, 32] {
                assert_eq!(route(n, 768, 3072, true, true, false), Some(Route::Tiles), "f16, {n} rows");
            }
            assert_eq!(route(16, 768, 3072, false, true, false), Some(Route::Tiles), "bf16, 16 rows");
            assert_eq!(route(16, 768, 3072, true, false, true), Some(Route::Tiles), "f16, row-major weight");
        } else {
            for n in [20, 31] {
                assert_eq!(route(n, 768, 3072, true, true, false), f32_dots, "f16, {n} rows");
            }
            assert_eq!(route(16, 768, 3072, false, true, false), bf16_few, "bf16, 16 rows");
            assert_eq!(route(32, 768, 3072, true, true, false), None, "f16, 32 rows");
            assert_eq!(route(16, 768, 3072, true, false, true), by_rows, "f16, row-major weight");
            assert_eq!(route(32, 768, 3072, true, false, true), None, "f16, 32 rows, row-major weight");
        }
    }

    /// On any AVX2 CPU, a decode step's row by GPT-2's `Conv1D` weight (`[768, 2304]`, rows
    /// contiguous) takes the by-rows kernel, bf16 and f16; a strided weight does not.
    #[test]
    fn a_few_rows_by_a_weight_with_contiguous_rows_take_the_by_rows_kernel() {
        if detected() < Isa::Avx2 {
            eprintln!("skipped: the by-rows kernel runs on AVX2 and later");
            return;
        }
        for f16 in [false, true] {
            assert_eq!(route(1, 768, 2304, f16, false, true), Some(Route::FewRowsByRows), "f16: {f16}");
            assert_eq!(route(1, 768, 2304, f16, false, false), None, "f16: {f16}");
        }
        if !amx_enabled() && !avx512_bf16_enabled() {
            assert_eq!(route(31, 768, 2304, false, false, true), Some(Route::FewRowsByRows));
        }
    }
}
