//! register_allocator! adds allocators to the global registry from any crate.

use std::sync::Arc;

use tensormem::{Allocator, AllocatorRegistry, SystemAllocator, register_allocator};

fn make_top() -> Arc<dyn Allocator> {
    Arc::new(SystemAllocator::builder().name("macro-top").build().unwrap())
}

register_allocator!("macro-top", 1000, make_top);
register_allocator!("macro-low", -1, || Arc::new(SystemAllocator::builder().name("macro-low").build().unwrap()));

#[test]
fn macro_registrations_are_in_the_global_registry() {
    let g = AllocatorRegistry::global();
    let entries: Vec<(String, i32)> = g.entries().into_iter().map(|e| (e.name, e.priority)).collect();
    assert!(entries.contains(&("macro-top".to_owned(), 1000)), "{entries:?}");
    assert!(entries.contains(&("macro-low".to_owned(), -1)), "{entries:?}");
    assert_eq!(g.get_by_name("macro-low").unwrap().name(), "macro-low");
    // Highest priority wins over the built-in cpu (0) and jemalloc (50).
    assert_eq!(g.get().name(), "macro-top");
}
