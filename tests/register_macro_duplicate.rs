//! Two register_allocator! calls with the same (name, priority): the global registry reports it.

use std::sync::Arc;

use tensormem::{AllocatorRegistry, RegistryError, SystemAllocator, register_allocator};

register_allocator!("twin", 5, || Arc::new(
    SystemAllocator::builder().name("twin").bytes_limit(1 << 20).build().unwrap()
));
register_allocator!("twin", 5, || Arc::new(SystemAllocator::builder().name("TWIN").build().unwrap()));

#[test]
fn duplicate_macro_registration_is_reported_by_try_get() {
    let g = AllocatorRegistry::global();
    let err = g.try_get().unwrap_err();
    let RegistryError::Duplicate { name, priority, first_allocator, second_allocator, .. } = &err else {
        panic!("expected a duplicate error, got {err:?}");
    };
    assert_eq!((name.as_str(), *priority), ("twin", 5));
    let mut both = [first_allocator.as_str(), second_allocator.as_str()];
    both.sort();
    assert_eq!(both, ["TWIN", "twin"]);
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.get())).unwrap_err();
    assert_eq!(panic.downcast_ref::<String>().unwrap(), &err.to_string());
    // The first registration stands and is still reachable by name.
    assert_eq!(g.get_by_name("twin").map(|a| a.name().eq_ignore_ascii_case("twin")), Some(true));
}
