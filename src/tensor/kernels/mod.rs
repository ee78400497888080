//! Kernels on top of the iteration engine.

mod amx;
mod cast;
mod elementwise;
mod f16c;
mod index;
pub(crate) mod isa;
mod join;
mod mask;
mod norm;

pub(crate) use elementwise::BinaryOp;
pub use elementwise::Scalar;
pub(crate) use mask::FILL_HINT;
pub use switch::{
    AMX_ENV, AVX512_BF16_ENV, AVX512_BLOCKS_ENV, amx_enabled, avx512_bf16_enabled, avx512_blocks_enabled, set_amx,
    set_avx512_bf16, set_avx512_blocks,
};
mod loops;
mod matmul;
mod reduce;
mod softmax;
mod switch;

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
