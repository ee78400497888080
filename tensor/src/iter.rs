//! The iteration engine behind every element-wise kernel, in the spirit of PyTorch's
//! `TensorIterator`.
//!
//! Given the output shape and each operand's strides broadcast to it (0 on broadcast
//! dimensions), [`Plan::new`]:
//! 1. drops dimensions of size 1;
//! 2. reorders the dimensions so the one that moves fastest in memory (smallest stride of the
//!    output, then of the inputs) is innermost;
//! 3. coalesces neighbouring dimensions that every operand walks as one (so a contiguous
//!    tensor of any shape is a single 1-D run).
//!
//! [`Plan::run`] then calls an inner loop on 1-D runs: `(pointers, byte strides, n)`. The
//! kernels' inner loops have a contiguous fast path the compiler vectorises. When an input's
//! innermost stride is not unit but its next dimension's is (a transposed input), the run is
//! cache-tiled: 64x64 tiles of that input are gathered into a small contiguous buffer, so
//! both the input and the output are read and written along cache lines. Above [`GRAIN`]
//! elements the work is split across the kernel threads (see [`parallel`](super::parallel)).

use smallvec::SmallVec;

/// Elements below which a kernel runs on the calling thread only (PyTorch's `GRAIN_SIZE`).
pub(crate) const GRAIN: usize = 32_768;

/// Bytes of one tile of a transposed input (fits L1 with room for the output's lines).
const TILE_BYTES: usize = 32 * 1024;
/// A cache line: a tile is one line of the transposed input tall.
const LINE: usize = 64;

/// A plan's dimensions: inline up to 6, as a tensor's (see [`Dims`](super::shape::Dims)).
type PerDim<T> = SmallVec<[T; 6]>;

/// A kernel's inner loop over one 1-D run: the operands' addresses, their byte strides, the
/// run's length. The plan calls it through this type-erased reference, so that its loops over
/// runs, tiles and threads are compiled once per operand count instead of once per kernel (each
/// kernel's inner loop is still compiled, and vectorised, on its own; only the call per run is
/// indirect, the way `TensorIterator::for_each` takes a `function_ref`).
type InnerLoop<'f, const N: usize> = dyn Fn([*mut u8; N], [usize; N], usize) + Sync + 'f;

/// A plan of iteration over `N` operands (operand 0 is the output).
pub(crate) struct Plan<const N: usize> {
    /// Sizes, innermost first.
    shape: PerDim<usize>,
    /// Byte strides per dimension (innermost first) per operand.
    strides: PerDim<[usize; N]>,
    /// Element size of each operand.
    elem: [usize; N],
    /// Address of element 0 of each operand.
    base: [usize; N],
}

/// One operand of a plan: the address of its first element, its strides in elements broadcast
/// to the plan's shape, and its element size.
pub(crate) struct Operand<'a> {
    pub ptr: *mut u8,
    pub strides: &'a [usize],
    pub elem: usize,
}

impl<const N: usize> Plan<N> {
    /// Plans iteration over `shape` (outermost first, as tensors store it).
    pub(crate) fn new(shape: &[usize], ops: [Operand<'_>; N]) -> Plan<N> {
        let elem = ops.each_ref().map(|o| o.elem);
        let base = ops.each_ref().map(|o| o.ptr as usize);
        // Innermost first, without size-1 dimensions.
        let mut dims: PerDim<(usize, [usize; N])> = (0..shape.len())
            .rev()
            .filter(|&d| shape[d] != 1)
            .map(|d| (shape[d], ops.each_ref().map(|o| o.strides[d] * o.elem)))
            .collect();
        reorder(&mut dims);
        let mut out: PerDim<(usize, [usize; N])> = SmallVec::with_capacity(dims.len());
        for (size, st) in dims {
            if let Some((psize, pst)) = out.last_mut()
                && (0..N).all(|k| st[k] == pst[k] * *psize)
            {
                *psize *= size;
                continue;
            }
            out.push((size, st));
        }
        if out.is_empty() {
            out.push((1, [0; N]));
        }
        Plan { shape: out.iter().map(|d| d.0).collect(), strides: out.iter().map(|d| d.1).collect(), elem, base }
    }

    /// The number of elements.
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Inputs whose innermost stride is not unit while their next dimension's is smaller: these
    /// are read through tiles.
    fn tiled_operands(&self) -> [bool; N] {
        let mut tiled = [false; N];
        if self.shape.len() < 2 || self.strides[0][0] != self.elem[0] || self.shape[0] < 8 || self.shape[1] < 8 {
            return tiled;
        }
        for (k, t) in tiled.iter_mut().enumerate().skip(1) {
            let (s0, s1) = (self.strides[0][k], self.strides[1][k]);
            *t = s0 != 0 && s0 != self.elem[k] && s1 < s0;
        }
        tiled
    }

    /// Runs `f` over every 1-D run. `f` receives the operands' addresses, their byte strides,
    /// and the run's length. With `parallel`, large problems are split across rayon's threads
    /// (the caller guarantees that distinct elements of operand 0 are distinct memory).
    pub(crate) fn run(&self, parallel: bool, f: &InnerLoop<'_, N>) {
        self.run_grain(parallel.then_some(GRAIN), f);
    }

    /// [`run`](Plan::run), split across threads by `grain` elements (see
    /// [`threads_for`](super::parallel::threads_for)) where one is given: a smaller grain than
    /// [`GRAIN`] for functions that cost more per element. Not inlined into its callers, or each
    /// kernel would get a copy of the walk again.
    #[inline(never)]
    pub(crate) fn run_grain(&self, grain: Option<usize>, f: &InnerLoop<'_, N>) {
        let numel = self.numel();
        if numel == 0 {
            return;
        }
        let threads = grain.map_or(1, |g| super::parallel::threads_for(numel, g));
        let grain = grain.unwrap_or(GRAIN).max(1);
        let tiled = self.tiled_operands();
        if tiled.iter().any(|&t| t) {
            let (w, h) = self.tile_shape(tiled);
            let tiles0 = self.shape[0].div_ceil(w);
            let tiles1 = self.shape[1].div_ceil(h);
            let outer: usize = self.shape[2..].iter().product();
            let tasks = tiles0 * tiles1 * outer;
            let chunks = threads.min(tasks);
            if chunks <= 1 {
                self.run_tiles(0, tasks, tiled, (w, h), f);
            } else {
                super::parallel::for_each_piece(chunks, |c| {
                    self.run_tiles(tasks * c / chunks, tasks * (c + 1) / chunks, tiled, (w, h), f);
                });
            }
            return;
        }
        let chunks = threads.min(numel.div_ceil(grain));
        if chunks <= 1 {
            self.run_range(0, numel, f);
        } else {
            super::parallel::for_each_piece(chunks, |c| {
                self.run_range(numel * c / chunks, numel * (c + 1) / chunks, f)
            });
        }
    }

    /// The addresses of the element at multi-index `idx` (innermost first).
    fn ptrs_at(&self, idx: &[usize]) -> [*mut u8; N] {
        let mut p = self.base;
        for (d, &i) in idx.iter().enumerate() {
            for (k, pk) in p.iter_mut().enumerate() {
                *pk += i * self.strides[d][k];
            }
        }
        p.map(|a| a as *mut u8)
    }

    /// Elements `begin..end` in iteration order (innermost fastest), in runs along dim 0.
    fn run_range(&self, begin: usize, end: usize, f: &InnerLoop<'_, N>) {
        let nd = self.shape.len();
        let mut idx: PerDim<usize> = smallvec::smallvec![0; nd];
        let mut rem = begin;
        for (i, &size) in idx.iter_mut().zip(&self.shape) {
            *i = rem % size;
            rem /= size;
        }
        let mut pos = begin;
        while pos < end {
            let n = (self.shape[0] - idx[0]).min(end - pos);
            f(self.ptrs_at(&idx), self.strides[0], n);
            pos += n;
            idx[0] += n;
            let mut d = 0;
            while d + 1 < nd && idx[d] == self.shape[d] {
                idx[d] = 0;
                idx[d + 1] += 1;
                d += 1;
            }
        }
    }

    /// The tile for the tiled operands: `h` rows along dimension 1 (one cache line of the
    /// widest tiled operand, whose contiguous dimension it is) by `w` elements along
    /// dimension 0 (as many as fit [`TILE_BYTES`]).
    fn tile_shape(&self, tiled: [bool; N]) -> (usize, usize) {
        let elem = (0..N).filter(|&k| tiled[k]).map(|k| self.elem[k]).max().unwrap_or(1);
        let h = (LINE / elem).clamp(1, self.shape[1]);
        let w = (TILE_BYTES / (h * elem)).clamp(1, self.shape[0]);
        (w, h)
    }

    /// Tiles `begin..end`. Tile `t` covers dimension 1 from `(t % tiles1) * h`, dimension 0
    /// from `(t / tiles1 % tiles0) * w`, and outer index `t / (tiles0 * tiles1)`: consecutive
    /// tiles walk down dimension 1, so they read the next cache line of the same pages of the
    /// transposed input, and write long runs of the output's rows.
    fn run_tiles(&self, begin: usize, end: usize, tiled: [bool; N], (tw, th): (usize, usize), f: &InnerLoop<'_, N>) {
        let (s0, s1) = (self.shape[0], self.shape[1]);
        let (tiles0, tiles1) = (s0.div_ceil(tw), s1.div_ceil(th));
        // Rows of the scratch tile are `pitch` elements apart: a little more than `tw`, so that
        // the `th` rows written together do not fall into the same cache sets.
        let pitch = tw + LINE;
        let max_elem = self.elem.iter().copied().max().unwrap_or(1);
        // One scratch tile per tiled operand, u64-backed so every element type is aligned.
        let words = (pitch * th * max_elem).div_ceil(8);
        let mut scratch: SmallVec<[Vec<u64>; N]> =
            (0..N).map(|k| if tiled[k] { vec![0u64; words] } else { Vec::new() }).collect();
        let nd = self.shape.len();
        let mut idx: PerDim<usize> = smallvec::smallvec![0; nd];
        for t in begin..end {
            let (c1, c0) = (t % tiles1 * th, t / tiles1 % tiles0 * tw);
            let mut o = t / (tiles0 * tiles1);
            for (i, &size) in idx.iter_mut().zip(&self.shape).skip(2) {
                *i = o % size;
                o /= size;
            }
            idx[0] = c0;
            idx[1] = c1;
            let (w, h) = (tw.min(s0 - c0), th.min(s1 - c1));
            let corner = self.ptrs_at(&idx);
            let mut strides = self.strides[0];
            for k in 0..N {
                if tiled[k] {
                    let dst = scratch[k].as_mut_ptr() as *mut u8;
                    let (e, ss0, ss1) = (self.elem[k], self.strides[0][k], self.strides[1][k]);
                    // SAFETY: the tile's elements (c0..c0+w along dim 0, c1..c1+h along dim 1)
                    // are elements of the operand, so every source address is inside it; the
                    // scratch holds `h` rows of `pitch >= w` elements of up to `max_elem` bytes.
                    unsafe { gather_tile(corner[k], ss0, ss1, dst, w, h, pitch, e) };
                    strides[k] = e;
                }
            }
            for r in 0..h {
                for k in 0..N {
                    if !tiled[k] {
                        let next = (corner[k] as usize + (r + th) * self.strides[1][k]) as *const u8;
                        let mut off = 0;
                        while off < w * self.strides[0][k] {
                            prefetch(next.wrapping_add(off));
                            off += LINE;
                        }
                    }
                }
                let mut p = corner;
                for k in 0..N {
                    p[k] = if tiled[k] {
                        // SAFETY: row `r` of the scratch tile starts at byte `r * pitch * e`,
                        // inside it.
                        unsafe { (scratch[k].as_mut_ptr() as *mut u8).add(r * pitch * self.elem[k]) }
                    } else {
                        (corner[k] as usize + r * self.strides[1][k]) as *mut u8
                    };
                }
                f(p, strides, w);
            }
        }
    }
}

/// Sorts `dims` (innermost first) so that the dimension with the smaller stride comes first,
/// judging by the output, then each input; broadcast (stride 0) entries do not vote.
fn reorder<const N: usize>(dims: &mut [(usize, [usize; N])]) {
    let should_swap = |a: &[usize; N], b: &[usize; N]| -> Option<bool> {
        for k in 0..N {
            let (sa, sb) = (a[k], b[k]);
            if sa == 0 || sb == 0 || sa == sb {
                continue;
            }
            return Some(sa > sb);
        }
        None
    };
    for i in 1..dims.len() {
        let mut j = i;
        while j > 0 {
            match should_swap(&dims[j - 1].1, &dims[j].1) {
                Some(true) => {
                    dims.swap(j - 1, j);
                    j -= 1;
                }
                _ => break,
            }
        }
    }
}

/// Copies a `w x h` tile (w along dimension 0 with byte stride `s0`, h along dimension 1 with
/// byte stride `s1`) into `dst` as `h` rows of `w` elements of `e` bytes, `pitch` elements
/// apart. Each source "column" (fixed c) is read in one go: for a transposed input that is
/// one cache line.
///
/// # Safety
/// Every `src + c * s0 + r * s1` (c < w, r < h) is valid for reads of `e` bytes, `dst` for
/// writes of `h * pitch * e` bytes, aligned for `e`-byte integers; `pitch >= w`; the ranges
/// do not overlap.
#[allow(clippy::too_many_arguments)]
unsafe fn gather_tile(src: *mut u8, s0: usize, s1: usize, dst: *mut u8, w: usize, h: usize, pitch: usize, e: usize) {
    macro_rules! typed {
        ($t:ty) => {{
            let dst = dst as *mut $t;
            for c in 0..w {
                let col = src.wrapping_add(c * s0);
                // The next tile reads the next `h` elements of this same source column: ask
                // for them now, so that the miss overlaps this tile's work.
                prefetch(col.wrapping_add(h * s1));
                for r in 0..h {
                    // SAFETY: the caller's contract covers source element (c, r) and
                    // destination element r * pitch + c; tensor elements are aligned to their
                    // size.
                    unsafe { dst.add(r * pitch + c).write((col.add(r * s1) as *const $t).read()) };
                }
            }
        }};
    }
    match e {
        #[cfg(target_arch = "x86_64")]
        1 | 2 | 4 if s1 == e && h.min(w) >= 16 / e => {
            // SAFETY: forwarded from our caller's contract (same elements, same layout).
            unsafe {
                match e {
                    1 => gather_tile_blocks::<1>(src, s0, dst, w, h, pitch),
                    2 => gather_tile_blocks::<2>(src, s0, dst, w, h, pitch),
                    _ => gather_tile_blocks::<4>(src, s0, dst, w, h, pitch),
                }
            }
        }
        1 => typed!(u8),
        2 => typed!(u16),
        4 => typed!(u32),
        _ => typed!(u64),
    }
}

/// [`gather_tile`] for 1-, 2- and 4-byte elements (u8, i8, bool; f16, bf16, i16; f32, i32)
/// whose source is contiguous along dimension 1 (a transposed input), in square blocks of
/// `n = 16 / E` elements (16x16, 8x8, 4x4) through SSE2
/// registers: `n` loads of one source column each, a transpose, `n` stores of one destination
/// row each, instead of `n * n` scalar loads and stores. The transpose is `log2(n)` rounds of
/// element-wide unpacks, each pairing register `i` with register `i + n/2` into registers `2i`
/// (low halves interleaved) and `2i + 1` (high halves): after the rounds, register `j` holds
/// element `j` of every column. Rows and columns past the last full block are copied one
/// element at a time.
///
/// # Safety
/// As [`gather_tile`] with `e == E` and `s1 == E`; `E` is 1, 2 or 4.
#[cfg(target_arch = "x86_64")]
unsafe fn gather_tile_blocks<const E: usize>(src: *mut u8, s0: usize, dst: *mut u8, w: usize, h: usize, pitch: usize) {
    use core::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_setzero_si128, _mm_storeu_si128, _mm_unpackhi_epi8, _mm_unpackhi_epi16,
        _mm_unpackhi_epi32, _mm_unpacklo_epi8, _mm_unpacklo_epi16, _mm_unpacklo_epi32,
    };
    let n = 16 / E;
    let (full_w, full_h) = (w - w % n, h - h % n);
    for c in (0..full_w).step_by(n) {
        for i in 0..n {
            prefetch(src.wrapping_add((c + i) * s0 + h * E));
        }
        for r in (0..full_h).step_by(n) {
            // SAFETY: source elements (c..c+n, r..r+n) are in the tile (c + n <= w, r + n <= h)
            // and contiguous along r (s1 == E), so each load reads the 16 bytes of n elements
            // of one source column; destination rows r..r+n hold columns c..c+n, n * E = 16
            // bytes each (pitch >= w); SSE2 is part of the x86_64 baseline; the loads and
            // stores are unaligned ones.
            unsafe {
                let mut a = [_mm_setzero_si128(); 16];
                for (i, v) in a.iter_mut().enumerate().take(n) {
                    *v = _mm_loadu_si128(src.add((c + i) * s0 + r * E) as *const __m128i);
                }
                let mut span = 1;
                while span < n {
                    let mut b = [_mm_setzero_si128(); 16];
                    for i in 0..n / 2 {
                        let (x, y) = (a[i], a[i + n / 2]);
                        (b[2 * i], b[2 * i + 1]) = match E {
                            1 => (_mm_unpacklo_epi8(x, y), _mm_unpackhi_epi8(x, y)),
                            2 => (_mm_unpacklo_epi16(x, y), _mm_unpackhi_epi16(x, y)),
                            _ => (_mm_unpacklo_epi32(x, y), _mm_unpackhi_epi32(x, y)),
                        };
                    }
                    a = b;
                    span *= 2;
                }
                for (j, v) in a.iter().enumerate().take(n) {
                    _mm_storeu_si128(dst.add(((r + j) * pitch + c) * E) as *mut __m128i, *v);
                }
            }
        }
    }
    let scalar = |c: usize, r: usize| {
        // SAFETY: callers pass c < w and r < h: element (c, r) of the tile, E bytes at each
        // end, as above; tile and scratch do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(src.add(c * s0 + r * E), dst.add((r * pitch + c) * E), E) };
    };
    for c in 0..full_w {
        (full_h..h).for_each(|r| scalar(c, r));
    }
    for c in full_w..w {
        (0..h).for_each(|r| scalar(c, r));
    }
}

/// Hints the CPU to bring the cache lines of `s` into L1, its first 16 KiB at most (a third of
/// a recent core's L1): for a row kernel, the next row while it works on this one, where the
/// hardware prefetcher, which follows a stream of misses, stops at the end of the row that the
/// kernel then reads again from L1. Past 16 KiB the prefetcher has a stream to follow again.
#[inline(always)]
pub(crate) fn prefetch_slice<T>(s: &[T]) {
    let bytes = core::mem::size_of_val(s).min(16 << 10);
    let p = s.as_ptr() as *const u8;
    for off in (0..bytes).step_by(64) {
        prefetch(p.wrapping_add(off));
    }
}

/// Hints the CPU to bring the cache line at `p` into L1. Never faults, whatever `p` is.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE is part of the x86_64 baseline, so the instruction exists on every CPU
        // this code runs on; a prefetch is only a hint and does not fault on any address.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
