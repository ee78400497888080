//! Kernels on top of the iteration engine.

mod cast;
mod elementwise;

pub use elementwise::Scalar;
mod loops;
mod matmul;
mod reduce;
