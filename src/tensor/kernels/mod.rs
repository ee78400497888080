//! Kernels on top of the iteration engine.

mod amx;
mod cast;
mod elementwise;
mod f16c;
mod index;
mod isa;
mod join;
mod mask;
mod norm;

pub use amx::{AMX_ENV, amx_enabled, set_amx};
pub(crate) use elementwise::BinaryOp;
pub use elementwise::Scalar;
pub(crate) use mask::FILL_HINT;
mod loops;
mod matmul;
mod reduce;
mod softmax;
