//! The tensor crate's integration tests, in one binary (one link instead of one per file). The
//! tests that need a process of their own stay apart: `heap_per_op` (a counting global
//! allocator), `cpu_capability` (its own harness) and `matmul_half` (it flips the process-wide
//! AMX and AVX512-BF16 switches, which would change other tests' routes).

mod gpt2;
mod tensor;
mod tensor_errors;
mod tensor_ops;
mod tensor_props;
mod tensor_reduce;
mod tensor_semantics;
