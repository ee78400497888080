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
    // The same name in other case is the same name.
    assert!(matches!(r.register("CPU", 0, named("upper")), Err(RegistryError::Duplicate { .. })));
}

#[test]
fn a_name_registered_again_at_another_priority_replaces_the_first_with_a_warning() {
    let r = AllocatorRegistry::new();
    r.register("pool", 100, named("pool-a")).unwrap();
    r.register("cpu", 0, named("cpu")).unwrap();
    let warnings = capture_warnings(|| r.register("Pool", 7, named("pool-b")).unwrap());
    let entries: Vec<(String, i32)> = r.entries().into_iter().map(|e| (e.name, e.priority)).collect();
    assert_eq!(entries, vec![("cpu".to_owned(), 0), ("Pool".to_owned(), 7)], "one entry per name");
    assert_eq!(r.get_by_name("pool").unwrap().name(), "pool-b");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("'Pool' is registered again at priority 7: it replaces the one at priority 100"));
}

#[test]
fn a_tie_at_the_top_priority_is_a_warning_that_names_the_winner() {
    let r = AllocatorRegistry::new();
    r.register("pool", 100, named("pool")).unwrap();
    let tie = capture_warnings(|| r.register("capped-8g", 100, named("capped-8g")).unwrap());
    assert_eq!(r.get().name(), "pool");
    assert_eq!(tie.len(), 1, "{tie:?}");
    assert!(tie[0].contains("'capped-8g' ties with 'pool' at the top priority 100"), "{tie:?}");
    // Below the top, or above it, is no tie; an alias of the chosen allocator is none either.
    let quiet = capture_warnings(|| {
        r.register("low", 5, named("low")).unwrap();
        r.register("low2", 5, named("low2")).unwrap();
        r.register("top", 150, named("top")).unwrap();
        r.register("top-alias", 150, r.get_by_name("top").unwrap()).unwrap();
    });
    assert!(quiet.is_empty(), "{quiet:?}");
    assert_eq!(r.get().name(), "top");
}

/// The messages of `tracing` warnings emitted while `f` runs on this thread.
fn capture_warnings(f: impl FnOnce()) -> Vec<String> {
    use std::sync::Mutex;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    #[derive(Default)]
    struct Warnings(Mutex<Vec<String>>);
    struct Message(String);
    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }
    impl Subscriber for Warnings {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            if *event.metadata().level() == Level::WARN {
                let mut m = Message(String::new());
                event.record(&mut m);
                self.0.lock().unwrap().push(m.0);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    let warnings = Arc::new(Warnings::default());
    tracing::subscriber::with_default(Arc::clone(&warnings), f);
    warnings.0.lock().unwrap().clone()
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
        "no allocator named 'tpu' is registered (registered: jemalloc, cpu; names are compared case-insensitively)"
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
