//! `GlobalAllocator` as the process's `#[global_allocator]`: the heap's figures, leak checks,
//! scopes, history and budgets over `Vec`, `Box` and `String`, re-entrancy under load, and the
//! backend picked by `TENSORMEM_GLOBAL_ALLOCATOR` (each value in a child process, since the
//! choice is made once per process). The cases run one after another: the heap's figures are
//! process-wide.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use tensormem::history::{self, HistoryOptions};
use tensormem::testing::{LeakCheck, assert_peak_below};
use tensormem::{AllocatorExt, BfcAllocator, GlobalAllocator, GlobalBackend};

#[global_allocator]
static GLOBAL: GlobalAllocator = GlobalAllocator::new();

const CHILD: &str = "TENSORMEM_TEST_CHILD";

fn the_process_heap_is_counted() {
    let before = GLOBAL.stats().expect("installed: the process has allocated already");
    assert_eq!(tensormem::telemetry::process_heap_stats().map(|s| s.num_allocs > 0), Some(true));
    let big = vec![7u8; 8 << 20];
    let during = GLOBAL.stats().unwrap();
    assert!(during.bytes_in_use >= before.bytes_in_use + (8 << 20) - (1 << 20), "{before:?} -> {during:?}");
    assert!(during.peak_bytes_in_use >= during.bytes_in_use);
    assert!(during.num_allocs > before.num_allocs);
    drop(big);
    let after = GLOBAL.stats().unwrap();
    assert!(after.bytes_in_use + (7 << 20) < during.bytes_in_use, "{during:?} -> {after:?}");
    assert!(after.num_frees > during.num_frees);
    assert!(after.peak_bytes_in_use >= during.bytes_in_use, "{during:?} -> {after:?}");

    // Growing a Vec reallocates: in use follows the final size.
    let mut v: Vec<u64> = Vec::new();
    for i in 0..(1 << 20) {
        v.push(i);
    }
    let grown = GLOBAL.stats().unwrap();
    assert!(grown.bytes_in_use >= after.bytes_in_use + (8 << 20) - (1 << 20));
    drop(v);

    // Many threads (more than its 64 private slots) allocating and freeing keep the totals
    // consistent: everything they allocated is freed again.
    let base = GLOBAL.stats().unwrap();
    for _ in 0..3 {
        let handles: Vec<_> = (0..40)
            .map(|t| {
                std::thread::spawn(move || {
                    let boxes: Vec<Box<[u8; 256]>> = (0..1000).map(|_| Box::new([t as u8; 256])).collect();
                    boxes.iter().map(|b| b[0] as u64).sum::<u64>()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    let end = GLOBAL.stats().unwrap();
    assert!(end.num_allocs >= base.num_allocs + 120 * 1000);
    assert!(end.num_frees >= base.num_frees + 120 * 1000);
    // Thread bookkeeping of the runtime may linger, but not 120 x 1000 boxes of 256 bytes.
    assert!(end.bytes_in_use < base.bytes_in_use + (4 << 20), "{base:?} -> {end:?}");

    #[cfg(feature = "prometheus")]
    {
        use tensormem::telemetry::AllocatorCollector;
        let text = AllocatorCollector::global().render();
        assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"global\"}"), "{text}");
        assert!(text.contains("tensormem_allocator_allocations_total{allocator=\"global\"}"));
        // An isolated registry's collector does not add the process heap unless asked...
        let isolated = Arc::new(tensormem::AllocatorRegistry::new());
        isolated.register("cpu", 0, Arc::new(tensormem::SystemAllocator::new())).unwrap();
        let text = AllocatorCollector::for_registry(Arc::clone(&isolated)).render();
        assert!(!text.contains("allocator=\"global\""), "{text}");
        // ...and an allocator registered as `global` keeps its name: the heap becomes `global_heap`,
        // so no two series share a label set.
        isolated.register("global", 0, Arc::new(tensormem::SystemAllocator::new())).unwrap();
        let text = AllocatorCollector::for_registry(isolated).with_process_heap(true).render();
        assert_eq!(text.matches("tensormem_allocator_in_use_bytes{allocator=\"global\"}").count(), 1, "{text}");
        assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"global_heap\"}"), "{text}");
    }
}

fn a_leak_check_sees_vec_box_and_string() {
    let check = LeakCheck::start();
    let freed = vec![1u32; 1000];
    drop(freed);
    let boxed = Box::new([3u8; 777]);
    let text = String::from("x").repeat(1234);
    let report = check.finish();
    let mut sizes: Vec<usize> = report.leaks.iter().map(|l| l.requested_size).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [777, 1234], "the freed Vec is no leak; the check's own bookkeeping is not seen: {report}");
    assert!(report.leaks.iter().all(|l| l.allocator == "global"), "{report}");
    assert_eq!(report.peak_bytes, 4000, "the Vec alone was the most held at once: {report}");
    drop((boxed, text));
    // Nothing leaks: a check of a function that cleans up is empty.
    tensormem::testing::assert_no_leaks(|| {
        let mut m = std::collections::HashMap::new();
        for i in 0..100 {
            m.insert(i, format!("value {i}"));
        }
        m.len()
    });
}

fn budgets_and_parallel_checks_stay_per_thread() {
    // 1 MiB held at once breaks a 512 KiB budget, whatever other threads do meanwhile.
    let noise = std::thread::spawn(|| {
        for _ in 0..200 {
            std::hint::black_box(vec![0u8; 4 << 20]);
        }
    });
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the panic below is expected: no message for it
    let broke = catch_unwind(AssertUnwindSafe(|| {
        assert_peak_below(512 << 10, || std::hint::black_box(vec![1u8; 1 << 20]).len())
    }));
    std::panic::set_hook(hook);
    let message = broke.expect_err("the budget is broken").downcast::<String>().unwrap();
    assert!(message.contains("memory budget exceeded"), "{message}");
    assert_eq!(assert_peak_below(2 << 20, || std::hint::black_box(vec![1u8; 1 << 20]).len()), 1 << 20);
    noise.join().unwrap();
    // Two threads, two checks, each leaking its own size: each sees only its own.
    let leaks: Vec<(Vec<usize>, Box<[u8]>)> = [3000usize, 5000]
        .map(|n| {
            std::thread::spawn(move || {
                let check = LeakCheck::start();
                let kept = vec![0u8; n].into_boxed_slice();
                let report = check.finish();
                (report.leaks.iter().map(|l| l.requested_size).collect(), kept)
            })
        })
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(leaks[0].0, [3000]);
    assert_eq!(leaks[1].0, [5000]);
}

fn scopes_and_history_see_the_heap() {
    let scope = "global-test/strings";
    {
        let _s = tensormem::scope(scope);
        let kept: Vec<String> = (0..10).map(|i| format!("{i:0>100}")).collect();
        let stats = tensormem::tag_stats().into_iter().find(|t| t.tag == scope).unwrap();
        assert!(stats.bytes_in_use >= 10 * 100, "{stats:?}");
        drop(kept);
    }
    history::start(HistoryOptions::default()).unwrap();
    let marker = vec![9u8; 54_321];
    drop(marker);
    history::stop();
    let recorded = history::recorded();
    let hits: Vec<_> = recorded.events.iter().filter(|e| e.size == 54_321 && &*e.allocator == "global").collect();
    assert_eq!(hits.len(), 2, "its allocation and its free");
    assert_eq!(
        (hits[0].action, hits[1].action),
        (tensormem::allocators::observe::Action::Alloc, tensormem::allocators::observe::Action::Free)
    );
}

/// Leak checks, scopes, history and OOM reports on several threads at once, all allocating
/// through the global allocator while the observer allocates too: it must neither deadlock nor
/// report its own bookkeeping.
fn everything_at_once_does_not_reenter() {
    history::start(HistoryOptions { capacity: 10_000, backtraces: false }).unwrap();
    let id = tensormem::on_oom(|r| {
        std::hint::black_box(r.to_string());
    });
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let bfc = BfcAllocator::builder().name(format!("reenter-{t}")).memory_limit(1 << 20).build().unwrap();
                for i in 0..200 {
                    let check = LeakCheck::start();
                    let _s = tensormem::scope(&format!("t{t}/step{}", i % 3));
                    let v: Vec<String> = (0..20).map(|j| format!("{t}-{i}-{j}")).collect();
                    assert!(bfc.allocate::<u8>(2 << 20).is_err());
                    drop(v);
                    let report = check.finish();
                    assert!(report.is_empty(), "{report}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    history::stop();
    tensormem::remove_oom_observer(id);
    assert!(tensormem::oom::reports_made() >= 800);
}

fn the_backend_comes_from_the_environment() {
    let run = |value: Option<&str>| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env(CHILD, "1").env_remove(tensormem::GLOBAL_ALLOCATOR_ENV);
        if let Some(v) = value {
            cmd.env(tensormem::GLOBAL_ALLOCATOR_ENV, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).trim().to_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(run(None).0, "System");
    assert_eq!(run(Some("system")).0, "System");
    let (backend, stderr) = run(Some("tcmalloc"));
    assert_eq!(backend, "System");
    assert!(
        stderr.contains("tensormem: TENSORMEM_GLOBAL_ALLOCATOR=tcmalloc: unknown backend (known: system"),
        "{stderr}"
    );
    let (_, stderr) = run(Some(&"x".repeat(100)));
    assert!(stderr.contains("(a value longer than 32 bytes)"), "{stderr}");
    if cfg!(all(feature = "jemalloc", not(target_env = "msvc"))) {
        let (backend, stderr) = run(Some(" JeMalloc "));
        assert_eq!(backend, "Jemalloc", "{stderr}");
        assert!(stderr.is_empty(), "{stderr}");
    }
}

/// The child: exercises the heap and a leak check on its backend, then prints the backend.
fn child() -> ExitCode {
    let check = LeakCheck::start();
    let kept = vec![5u8; 4321];
    let report = check.finish();
    assert_eq!(report.leaks.iter().map(|l| l.requested_size).collect::<Vec<_>>(), [4321]);
    drop(kept);
    let backend = GLOBAL.backend();
    assert!(matches!(backend, GlobalBackend::System | GlobalBackend::Jemalloc));
    println!("{backend:?}");
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    the_process_heap_is_counted();
    a_leak_check_sees_vec_box_and_string();
    budgets_and_parallel_checks_stay_per_thread();
    scopes_and_history_see_the_heap();
    everything_at_once_does_not_reenter();
    the_backend_comes_from_the_environment();
    println!("global_alloc: 6 cases passed");
    ExitCode::SUCCESS
}
