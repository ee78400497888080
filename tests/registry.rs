//! AllocatorRegistry: priorities, names, duplicates, selection.

use std::sync::Arc;

use tensormem::{Allocator, AllocatorRegistry, RegistryError, SelectionOrigin, SystemAllocator};

fn named(name: &str) -> Arc<dyn Allocator> {
    Arc::new(SystemAllocator::builder().name(name).build().unwrap())
}

#[test]
fn get_returns_the_highest_priority() {
    let r = AllocatorRegistry::new();
    r.register("low", -5, named("low")).unwrap();
    r.register("high", 20, named("high")).unwrap();
    r.register("mid", 3, named("mid")).unwrap();
    assert_eq!(r.get().name(), "high");
}

#[test]
fn on_a_priority_tie_the_first_registered_wins() {
    let r = AllocatorRegistry::new();
    r.register("first", 7, named("first")).unwrap();
    r.register("second", 7, named("second")).unwrap();
    assert_eq!(r.get().name(), "first");
}

#[test]
fn get_by_name_finds_and_misses_without_panicking() {
    let r = AllocatorRegistry::new();
    r.register("a", 1, named("a-low")).unwrap();
    r.register("a", 9, named("a-high")).unwrap();
    assert_eq!(r.get_by_name("a").unwrap().name(), "a-high");
    assert!(r.get_by_name("missing").is_none());
}

#[test]
fn duplicate_registration_is_an_error_naming_both() {
    let r = AllocatorRegistry::new();
    r.register("cpu", 0, named("original")).unwrap();
    r.register("other", 0, named("other")).unwrap();
    let err = r.register("cpu", 0, named("impostor")).unwrap_err();
    assert_eq!(
        err,
        RegistryError::Duplicate {
            name: "cpu".into(),
            priority: 0,
            first_index: 1,
            first_allocator: "original".into(),
            second_index: 3,
            second_allocator: "impostor".into(),
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("'original'") && msg.contains("'impostor'") && msg.contains("priority 0"), "{msg}");
    // The registry is unchanged: the original still answers.
    assert_eq!(r.get_by_name("cpu").unwrap().name(), "original");
    assert_eq!(r.entries().len(), 2);
    // The same name at another priority is a different registration.
    r.register("cpu", 1, named("cpu-1")).unwrap();
}

#[test]
fn empty_name_is_refused() {
    let r = AllocatorRegistry::new();
    assert_eq!(r.register("", 3, named("x")).unwrap_err(), RegistryError::EmptyName { priority: 3 });
    assert!(r.entries().is_empty());
}

#[test]
fn empty_registry_reports_instead_of_guessing() {
    let r = AllocatorRegistry::new();
    assert_eq!(r.try_get().unwrap_err(), RegistryError::Empty);
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.get())).unwrap_err();
    assert_eq!(panic.downcast_ref::<String>().unwrap(), "no allocator is registered");
}

#[test]
fn select_overrides_priorities_and_unknown_names_list_the_registered() {
    let r = AllocatorRegistry::new();
    r.register("cpu", 0, named("cpu")).unwrap();
    r.register("jemalloc", 50, named("jemalloc")).unwrap();
    r.select(Some("cpu")).unwrap();
    assert_eq!(r.get().name(), "cpu");
    assert_eq!(r.selected().as_deref(), Some("cpu"));

    let err = r.select(Some("tpu")).unwrap_err();
    assert_eq!(
        err,
        RegistryError::UnknownAllocator {
            requested: "tpu".into(),
            origin: SelectionOrigin::Code,
            registered: vec!["jemalloc".into(), "cpu".into()],
            configurable: vec![],
        }
    );
    assert_eq!(
        err.to_string(),
        "AllocatorRegistry::select selects allocator 'tpu', but no allocator of that name is registered \
         (registered: jemalloc, cpu; names are compared case-insensitively)"
    );
    // A refused choice leaves the previous one in place.
    assert_eq!(r.get().name(), "cpu");
    r.select(None).unwrap();
    assert_eq!(r.get().name(), "jemalloc");
}

#[test]
fn entries_list_every_registration_in_order() {
    let r = AllocatorRegistry::new();
    r.register("b", 2, named("b")).unwrap();
    r.register("a", 1, named("a")).unwrap();
    let entries: Vec<(String, i32)> = r.entries().into_iter().map(|e| (e.name, e.priority)).collect();
    assert_eq!(entries, vec![("b".to_owned(), 2), ("a".to_owned(), 1)]);
}

#[test]
fn global_registry_starts_with_the_builtin_backends() {
    let g = AllocatorRegistry::global();
    let entries: Vec<(String, i32)> = g.entries().into_iter().map(|e| (e.name, e.priority)).collect();
    assert!(entries.contains(&("cpu".to_owned(), 0)), "{entries:?}");
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    assert!(entries.contains(&("jemalloc".to_owned(), 50)), "{entries:?}");
    assert_eq!(g.get_by_name("cpu").unwrap().name(), "cpu");
    assert!(std::ptr::eq(g, AllocatorRegistry::global()));
}

#[test]
fn registry_is_usable_from_many_threads() {
    let r = AllocatorRegistry::new();
    std::thread::scope(|s| {
        for t in 0..4 {
            let r = &r;
            s.spawn(move || {
                for i in 0..50 {
                    r.register(&format!("t{t}-{i}"), i, named("x")).unwrap();
                    let _ = r.get();
                }
            });
        }
    });
    assert_eq!(r.entries().len(), 200);
    assert_eq!(r.get().name(), "x");
    assert_eq!(r.entries().iter().filter(|e| e.priority == 49).count(), 4);
}
