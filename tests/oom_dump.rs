//! OOM reports written to a directory (`TENSORMEM_OOM_DUMP`), history in reports, the
//! `tracing` events, and allocation sites of a history recorded with backtraces in its pprof
//! profile: each case that reads the environment runs this binary again as a child
//! process, since the dump settings are read once per process; the in-process cases run one
//! after another, since the dump directory and history are process-wide.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};

use tensormem::allocators::observe;
use tensormem::history::{self, History, HistoryOptions};
use tensormem::oom::{self, OomReport};
use tensormem::{AllocatorExt, BfcAllocator, SystemAllocator};

const CHILD: &str = "TENSORMEM_TEST_CHILD";

/// `(level, target, message)` of every `tracing` event.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(tracing::Level, String, String)>>>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        let meta = event.metadata();
        self.0.lock().unwrap().push((*meta.level(), meta.target().to_owned(), m.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Capture {
    fn errors(&self, target: &str) -> Vec<String> {
        let events = self.0.lock().unwrap();
        events.iter().filter(|e| e.0 == tracing::Level::ERROR && e.1 == target).map(|e| e.2.clone()).collect()
    }
}

fn bfc(name: &str, limit: u64) -> BfcAllocator {
    BfcAllocator::builder().name(name).memory_limit(limit).build().unwrap()
}

/// Runs `f` with `tracing` events captured on this thread.
fn captured(f: impl FnOnce()) -> Capture {
    let capture = Capture::default();
    tracing::dispatcher::with_default(&tracing::Dispatch::new(capture.clone()), f);
    capture
}

/// The child: three refusals with history recording, then the `tensormem::oom` errors logged,
/// one per line, on stdout.
fn child() -> ExitCode {
    history::start(HistoryOptions::default()).unwrap();
    let capture = captured(|| {
        let a = bfc("dumped", 1 << 20);
        let p = a.allocate::<u8>(512 << 10).unwrap();
        observe::describe(p.as_ptr() as usize, || "tensor f32 [128, 1024]".to_owned());
        for _ in 0..3 {
            assert!(a.allocate::<u8>(1 << 20).is_err());
        }
        // SAFETY: `p` came from `allocate::<u8>(512 << 10)` on `a`.
        unsafe { a.deallocate(p, 512 << 10) };
    });
    for e in capture.errors("tensormem::oom") {
        println!("{}", e.replace('\n', " "));
    }
    ExitCode::SUCCESS
}

/// Runs the child with `env` set; returns its stdout lines.
fn run_child(env: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD, "1").env_remove(oom::OOM_DUMP_ENV).env_remove(oom::OOM_DUMP_MAX_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn the_environment_sets_the_directory_and_the_most_dumps(tmp: &Path) {
    let dir = tmp.join("dumps");
    let dir_s = dir.to_str().unwrap();
    let logged = run_child(&[(oom::OOM_DUMP_ENV, dir_s), (oom::OOM_DUMP_MAX_ENV, "2")]);
    assert!(logged.is_empty(), "{logged:?}");
    assert_eq!(
        files(&dir),
        ["oom-1.history.json", "oom-1.html", "oom-1.json", "oom-2.history.json", "oom-2.html", "oom-2.json"]
    );
    let report: OomReport = serde_json::from_str(&std::fs::read_to_string(dir.join("oom-1.json")).unwrap()).unwrap();
    assert_eq!((report.allocator.as_str(), report.requested_bytes, report.sequence), ("dumped", 1 << 20, 1));
    assert_eq!(report.largest_allocations[0].description.as_deref(), Some("tensor f32 [128, 1024]"));
    let recorded = History::load(dir.join("oom-2.history.json")).unwrap();
    let ooms = recorded.events.iter().filter(|e| e.action == observe::Action::Oom).count();
    assert_eq!(ooms, 2, "the history beside the second dump holds both refusals");
    let page = std::fs::read_to_string(dir.join("oom-1.html")).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("dumped"), "a timeline page");
    // A second process takes the next free numbers; the default is at most 8 dumps.
    run_child(&[(oom::OOM_DUMP_ENV, dir_s)]);
    let names = files(&dir);
    assert!(names.contains(&"oom-5.json".to_owned()) && !names.contains(&"oom-6.json".to_owned()), "{names:?}");
}

fn an_unwritable_directory_is_reported_once(tmp: &Path) {
    let file = tmp.join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let dir = file.join("dumps");
    let logged = run_child(&[(oom::OOM_DUMP_ENV, dir.to_str().unwrap())]);
    assert_eq!(logged.len(), 1, "three OOMs, one message: {logged:?}");
    assert!(logged[0].contains("cannot write OOM dumps to") && logged[0].contains("not-a-dir"), "{logged:?}");
    let logged = run_child(&[(oom::OOM_DUMP_ENV, tmp.join("d2").to_str().unwrap()), (oom::OOM_DUMP_MAX_ENV, "lots")]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].contains("TENSORMEM_OOM_DUMP_MAX=\"lots\" is not a whole number"), "{logged:?}");
    assert_eq!(files(&tmp.join("d2")).len(), 9, "three dumps of three files (the default of 8 not reached)");
}

fn set_dump_dir_overrides_and_none_turns_dumps_off(tmp: &Path) {
    let dir = tmp.join("set");
    oom::set_dump_dir(Some(&dir), 1);
    let a = bfc("set-dir", 1 << 20);
    assert!(a.allocate::<u8>(2 << 20).is_err());
    assert!(a.allocate::<u8>(2 << 20).is_err());
    assert_eq!(files(&dir), ["oom-1.json"], "history is off here, and one dump at most");
    oom::set_dump_dir(None::<PathBuf>, 8);
    assert!(a.allocate::<u8>(2 << 20).is_err());
    assert_eq!(files(&dir).len(), 1);
}

fn history_names_what_an_allocator_without_tables_holds() {
    let reports: Arc<Mutex<Vec<OomReport>>> = Arc::default();
    let sink = Arc::clone(&reports);
    let id = tensormem::on_oom(move |r| sink.lock().unwrap().push(r.clone()));
    let a = SystemAllocator::builder().name("oom-history").bytes_limit(1 << 20).build().unwrap();
    history::start(HistoryOptions::default()).unwrap();
    let p = a.allocate::<u8>(600 << 10).unwrap();
    observe::describe(p.as_ptr() as usize, || "kv cache".to_owned());
    let q = a.allocate::<u8>(100 << 10).unwrap();
    // SAFETY: `q` came from `allocate::<u8>(100 << 10)` on `a`.
    unsafe { a.deallocate(q, 100 << 10) };
    let capture = captured(|| assert!(a.allocate::<u8>(500 << 10).is_err()));
    history::stop();
    let r = reports.lock().unwrap().pop().unwrap();
    let listed: Vec<(u64, Option<&str>)> =
        r.largest_allocations.iter().map(|a| (a.requested_bytes >> 10, a.description.as_deref())).collect();
    assert_eq!(listed, [(600, Some("kv cache"))], "the freed block is not live: {r:?}");
    assert_eq!(r.sources, ["history"]);
    // The same report as a `tracing` warning.
    let events = capture.0.lock().unwrap();
    let warned: Vec<_> = events.iter().filter(|e| e.0 == tracing::Level::WARN && e.1 == "tensormem::oom").collect();
    assert_eq!(warned.len(), 1, "{events:?}");
    assert_eq!(warned[0].2, r.to_string());
    tensormem::remove_oom_observer(id);
    // SAFETY: `p` came from `allocate::<u8>(600 << 10)` on `a`.
    unsafe { a.deallocate(p, 600 << 10) };
}

fn an_unbounded_entry_count_lists_everything_and_zero_lists_nothing() {
    let reports: Arc<Mutex<Vec<OomReport>>> = Arc::default();
    let sink = Arc::clone(&reports);
    let id = tensormem::on_oom(move |r| sink.lock().unwrap().push(r.clone()));
    let a = bfc("oom-entries-edge", 1 << 20);
    let held: Vec<_> = (0..3).map(|_| a.allocate::<u8>(1000).unwrap()).collect();
    oom::set_report_entries(usize::MAX);
    assert!(a.allocate::<u8>(2 << 20).is_err());
    oom::set_report_entries(0);
    assert!(a.allocate::<u8>(2 << 20).is_err());
    oom::set_report_entries(observe::DEFAULT_REPORT_ENTRIES);
    let got = std::mem::take(&mut *reports.lock().unwrap());
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].largest_allocations.len(), 3);
    assert!(got[1].largest_allocations.is_empty() && got[1].top_scopes.is_empty());
    tensormem::remove_oom_observer(id);
    for p in held {
        // SAFETY: each came from `allocate::<u8>(1000)` on `a`, freed once.
        unsafe { a.deallocate(p, 1000) };
    }
}

/// Allocates where a backtrace will name it.
#[inline(never)]
fn pprof_site_marker(a: &SystemAllocator) -> std::ptr::NonNull<u8> {
    std::hint::black_box(a.allocate::<u8>(77_777).unwrap())
}

fn recorded_backtraces_are_allocation_sites_in_pprof() {
    use std::io::Read;
    let a = SystemAllocator::new();
    history::start(HistoryOptions { capacity: 1000, backtraces: true }).unwrap();
    let p = pprof_site_marker(&a);
    history::stop();
    // SAFETY: `p` came from `allocate::<u8>(77_777)` on `a`.
    unsafe { a.deallocate(p, 77_777) };
    let gz = history::recorded().to_pprof();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
    let has = |s: &str| raw.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(has("pprof_site_marker"), "the allocating function is a frame");
    assert!(has("live_bytes_at_peak") && has("bytes_allocated"));
    assert!(!has("tensormem_allocators::"), "tensormem's own frames are trimmed");
}

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let tmp = std::env::temp_dir().join(format!("tensormem-oom-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    the_environment_sets_the_directory_and_the_most_dumps(&tmp);
    an_unwritable_directory_is_reported_once(&tmp);
    set_dump_dir_overrides_and_none_turns_dumps_off(&tmp);
    history_names_what_an_allocator_without_tables_holds();
    recorded_backtraces_are_allocation_sites_in_pprof();
    an_unbounded_entry_count_lists_everything_and_zero_lists_nothing();
    std::fs::remove_dir_all(&tmp).unwrap();
    println!("oom_dump: 6 cases passed");
    ExitCode::SUCCESS
}
