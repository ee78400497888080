//! A register_allocator! factory whose allocator reports another name: the global registry
//! refuses it, so that the name `get()` shows is always one `TENSORMEM_ALLOCATOR` accepts.

use std::sync::Arc;

use tensormem::{AllocatorRegistry, RegistryError, SystemAllocator, register_allocator};

register_allocator!("zero", 150, || Arc::new(SystemAllocator::builder().name("not-zero").build().unwrap()));

#[test]
fn a_factory_whose_allocator_reports_another_name_is_refused_at_startup() {
    let g = AllocatorRegistry::global();
    let err = g.try_get().unwrap_err();
    assert_eq!(err, RegistryError::NameMismatch { registered: "zero".into(), reported: "not-zero".into() });
    let msg = err.to_string();
    assert!(msg.contains("register_allocator!(\"zero\", ..) made an allocator named 'not-zero'"), "{msg}");
    assert!(g.get_by_name("zero").is_none() && g.get_by_name("not-zero").is_none());
}
