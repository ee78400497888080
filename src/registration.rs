//! [`register_allocator!`](crate::register_allocator): registering allocators from any crate at
//! program start (TensorFlow's `REGISTER_MEM_ALLOCATOR`).

use std::fmt;
use std::sync::Arc;

use crate::allocators::Allocator;

/// An allocator to add to the global registry when it is first used, submitted by
/// [`register_allocator!`](crate::register_allocator).
pub struct AllocatorFactory {
    /// The name to register under.
    pub name: &'static str,
    /// The priority to register with.
    pub priority: i32,
    /// Makes the allocator.
    pub make: fn() -> Arc<dyn Allocator>,
}

impl AllocatorFactory {
    /// A factory; used by `register_allocator!`.
    pub const fn new(name: &'static str, priority: i32, make: fn() -> Arc<dyn Allocator>) -> Self {
        Self { name, priority, make }
    }
}

impl fmt::Debug for AllocatorFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocatorFactory")
            .field("name", &self.name)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

inventory::collect!(AllocatorFactory);

/// Registers an allocator in the [global registry](crate::AllocatorRegistry::global) from any
/// crate linked into the program, before `main` needs it.
///
/// `register_allocator!(name, priority, factory)`: `factory` is a function or non-capturing
/// closure returning `Arc<dyn Allocator>`, called once when the global registry is first used.
/// Registrations are applied in name order after the built-in ones. The allocator must report
/// the name it is registered under (so that `TENSORMEM_ALLOCATOR` accepts the name `get()`
/// shows); a mismatch, or a duplicate (name, priority), is reported by
/// [`try_get`](crate::AllocatorRegistry::try_get). To become the default, register above
/// [`DEFAULT_PRIORITY`](crate::DEFAULT_PRIORITY) (100, the built-in `pool`): a tie keeps `pool`.
///
/// ```standalone_crate
/// use std::sync::Arc;
/// use tensormem::{AllocatorRegistry, SystemAllocator, register_allocator};
///
/// register_allocator!("capped", 150, || {
///     Arc::new(SystemAllocator::builder().name("capped").bytes_limit(64 << 20).build().unwrap())
/// });
///
/// assert_eq!(AllocatorRegistry::global().get().name(), "capped");
/// ```
#[macro_export]
macro_rules! register_allocator {
    ($name:expr, $priority:expr, $factory:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::AllocatorFactory::new($name, $priority, $factory)
        }
    };
}
