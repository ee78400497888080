//! Kernels on top of the iteration engine.

#[path = "../cpu/amx/mod.rs"]
mod amx;
mod cast;
mod columns;
mod elementwise;
mod extreme;
#[path = "../cpu/f16c.rs"]
mod f16c;
mod gemm;
mod index;
#[path = "../cpu/isa.rs"]
pub(crate) mod isa;
mod join;
mod mask;
mod norm;

pub(crate) use elementwise::BinaryOp;
pub use elementwise::Scalar;
pub use isa::{CPU_CAPABILITY_ENV, cpu_capability};
pub(crate) use mask::FILL_HINT;
pub use switch::{
    AMX_ENV, AVX2_BLOCKS_ENV, AVX512_BF16_ENV, AVX512_BLOCKS_ENV, HALF_TABLES_ENV, amx_enabled, avx2_blocks_enabled,
    avx512_bf16_enabled, avx512_blocks_enabled, half_tables_enabled, set_amx, set_avx2_blocks, set_avx512_bf16,
    set_avx512_blocks, set_half_tables,
};
mod loops;
mod matmul;
mod reduce;
mod softmax;
#[path = "../cpu/switch.rs"]
mod switch;
#[path = "../cpu/table.rs"]
mod table;

/// A pointer (or a matrix holding one) shared by the pieces of one parallel kernel
/// ([`for_each_piece`](crate::parallel::for_each_piece)). Whoever wraps a pointer
/// promises what makes sharing it sound: each piece writes only its own part through it (the
/// AMX product: packs by panel or tile, results by block; the gemm product: its own columns of
/// the result), and reads only what no piece writes, or what every piece finished writing
/// before a phase that reads it.
#[derive(Clone, Copy)]
pub(super) struct Shared<T: Copy>(pub(super) T);

impl<T: Copy> Shared<T> {
    /// The value (a method, so closures capture the `Sync` wrapper, not the raw field).
    pub(super) fn get(&self) -> T {
        self.0
    }
}
// SAFETY: only pointers into a kernel's own buffers are wrapped, by kernels that keep the
// promise above (each piece its own part), so sending one to another piece's thread races on
// nothing.
unsafe impl<T: Copy> Send for Shared<T> {}
// SAFETY: as above: the pieces sharing it touch disjoint parts.
unsafe impl<T: Copy> Sync for Shared<T> {}

/// The part of `0..len` that piece `piece` of `pieces` takes (pieces of a
/// [`for_each_piece`](crate::parallel::for_each_piece) kernel): consecutive, as even as
/// whole units of `align` allow, each starting at a multiple of `align`, the last one ending at
/// `len`.
pub(super) fn piece_range(len: usize, align: usize, pieces: usize, piece: usize) -> core::ops::Range<usize> {
    let units = len.div_ceil(align);
    (units * piece / pieces * align).min(len)..(units * (piece + 1) / pieces * align).min(len)
}

/// Independent accumulators of [`lanes`] (one AVX-512 vector of f32).
const LANES: usize = 16;

/// `fold` of `map(x)` over `v` in [`LANES`] independent accumulators (which the compiler
/// vectorises, where a single running fold is one chain of dependent operations), then across
/// them and the remainder. For softmax's maximum and sum and the norms' statistics.
#[inline(always)]
pub(super) fn lanes<X: Copy, C: Copy>(v: &[X], init: C, map: impl Fn(X) -> C, fold: impl Fn(C, C) -> C) -> C {
    let mut acc = [init; LANES];
    let chunks = v.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            acc[k] = fold(acc[k], map(c[k]));
        }
    }
    acc.into_iter().chain(rem.iter().map(|&x| map(x))).fold(init, fold)
}
