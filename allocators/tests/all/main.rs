//! The allocators crate's integration tests, in one binary (one link instead of one per file).

mod bad_inputs;
mod bfc;
mod bfc_expandable;
mod bfc_props;
mod conformance;
mod huge_pages;
mod pool;
mod types;
