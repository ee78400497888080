//! tensormem
