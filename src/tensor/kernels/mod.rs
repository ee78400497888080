//! Kernels on top of the iteration engine.

mod cast;
mod elementwise;
mod loops;
mod matmul;
mod reduce;
