//! Kernels on top of the iteration engine.

mod cast;
mod elementwise;
mod f16c;
mod index;
mod isa;
mod join;
mod mask;
mod norm;

pub(crate) use elementwise::BinaryOp;
pub use elementwise::Scalar;
pub(crate) use mask::FILL_HINT;
mod loops;
mod matmul;
mod reduce;
