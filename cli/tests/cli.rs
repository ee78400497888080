//! The `tensormem` command run as users run it: outputs, files written, and one-line errors.

use std::path::Path;
use std::process::{Command, Output};

fn tensormem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensormem"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
        .env_remove("TENSORMEM_ALLOCATOR")
        .env_remove("TENSORMEM_ALLOC_CONF")
        .output()
        .unwrap()
}

/// A fresh directory, removed with everything in it when the returned guard drops.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("tm-cli-{name}-")).tempdir().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A failure: status 1, one line on stderr starting with `tensormem: error:`, no panic.
fn assert_one_line_error(out: &Output, contains: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("tensormem: error: "), "{err}");
    assert!(err.contains(contains), "{err} should mention {contains}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn demo_writes_history_timeline_and_summary() {
    let out_dir_guard = tmp("demo");
    let out_dir = out_dir_guard.path();
    let out = tensormem(&["demo", "--steps", "3", "--allocator", "bfc", "--out", out_dir.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{}", stdout, text(&out.stderr));
    assert!(stdout.contains("allocator 'bfc'"), "{stdout}");
    assert!(stdout.contains("tensormem memory summary") && stdout.contains("per scope:"), "{stdout}");
    assert!(stdout.contains("prefill/layer0/attn") && stdout.contains("decode/layer3/mlp"), "{stdout}");
    let h = tensormem::history::History::load(out_dir.join("history.json")).unwrap();
    let allocs = h.events.iter().filter(|e| e.action == tensormem::allocators::observe::Action::Alloc).count();
    let frees = h.events.iter().filter(|e| e.action == tensormem::allocators::observe::Action::Free).count();
    assert!(allocs > 100 && allocs == frees, "{allocs} allocations, {frees} frees");
    assert!(h.events.iter().any(|e| e.action == tensormem::allocators::observe::Action::SegmentAlloc));
    assert!(h.events.iter().all(|e| &*e.allocator == "bfc"), "everything went through the selected allocator");
    let page = std::fs::read_to_string(out_dir.join("timeline.html")).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<td>weights</td>"));

    // The snapshot it wrote reads back as a summary; the history as a timeline.
    let out = tensormem(&["summary", out_dir.join("snapshot.json").to_str().unwrap()]);
    assert!(out.status.success() && text(&out.stdout).contains("bfc"), "{}", text(&out.stderr));
    let page2 = out_dir.join("again.html");
    let out = tensormem(&["timeline", out_dir.join("history.json").to_str().unwrap(), "-o", page2.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(page2).unwrap(), page);
}

#[test]
fn demo_serves_metrics_while_it_runs() {
    use std::io::{BufRead, BufReader, Read, Write};
    let out_dir_guard = tmp("serve");
    let out_dir = out_dir_guard.path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensormem"))
        .args(["demo", "--steps", "400", "--serve", "127.0.0.1:0", "--out", out_dir.to_str().unwrap()])
        .env_remove("TENSORMEM_ALLOCATOR")
        .env_remove("TENSORMEM_ALLOC_CONF")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let addr = line
        .strip_prefix("serving /metrics on http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("first line: {line}"))
        .to_owned();
    // Scrape while the loop runs.
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("tensormem_allocator_in_use_bytes{allocator=\"pool\"}"), "{body}");
    let running = child.try_wait().unwrap().is_none();
    child.kill().ok();
    child.wait().unwrap();
    assert!(running, "the demo had already finished: raise --steps");
}

#[test]
fn replay_prints_a_row_per_allocator() {
    let out =
        tensormem(&["replay", "benches/traces/kv_cache_stress.json", "--allocator", "bfc", "--allocator", "pool"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("bfc ") || l.starts_with("pool ")).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(stdout.contains("resvd/req"));
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let dir_guard = tmp("bad");
    let dir = dir_guard.path();
    let missing = dir.join("missing.json");
    assert_one_line_error(&tensormem(&["timeline", missing.to_str().unwrap(), "-o", "/dev/null"]), "missing.json");
    let truncated = dir.join("truncated.json");
    std::fs::write(&truncated, r#"{"version":1,"start_unix_ms":0,"capacity":10,"dropped":0,"events":[{"time_ns":1,"#)
        .unwrap();
    let out = tensormem(&["timeline", truncated.to_str().unwrap(), "-o", dir.join("x.html").to_str().unwrap()]);
    assert_one_line_error(&out, "not a tensormem history file");
    assert!(!dir.join("x.html").exists());
    let malformed = dir.join("malformed.json");
    std::fs::write(&malformed, "[1, 2, 3]").unwrap();
    assert_one_line_error(&tensormem(&["timeline", malformed.to_str().unwrap(), "-o", "/dev/null"]), "malformed.json");
    assert_one_line_error(&tensormem(&["summary", malformed.to_str().unwrap()]), "not a tensormem memory snapshot");
    assert_one_line_error(&tensormem(&["summary", missing.to_str().unwrap()]), "cannot read");
    assert_one_line_error(&tensormem(&["replay", malformed.to_str().unwrap()]), "not a tensormem allocation trace");
    assert_one_line_error(
        &tensormem(&["replay", "benches/traces/kv_cache_stress.json", "--allocator", "nosuch"]),
        "unknown allocator 'nosuch' (known: system, jemalloc, pool, bfc, bfc-tensorflow, cuda:N)",
    );
    let out = tensormem(&["replay", "benches/traces/kv_cache_stress.json", "--allocator", "cuda:0"]);
    if has_cuda_device() {
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).lines().any(|l| l.starts_with("cuda:0 ")), "{}", text(&out.stdout));
    } else {
        assert_one_line_error(&out, "cuda:0");
    }
    assert_one_line_error(&tensormem(&["demo", "--allocator", "nosuch", "--out", dir.to_str().unwrap()]), "nosuch");
    // Usage mistakes are clap's (status 2), not panics; step counts the demo cannot finish too.
    for steps in ["many", "0", "1025", "18446744073709551615"] {
        let out = tensormem(&["demo", "--steps", steps]);
        assert_eq!(out.status.code(), Some(2), "--steps {steps}");
        let err = text(&out.stderr);
        assert!(!err.contains("panicked") && err.contains("--steps"), "{err}");
    }
}

#[test]
fn a_closed_pipe_ends_quietly_and_a_failed_write_is_one_line() {
    use std::process::Stdio;
    let dir_guard = tmp("pipe");
    let dir = dir_guard.path().join("out");
    let trace = "benches/traces/kv_cache_stress.json";
    // A reader that closes at once: the command stops without a word and with status 0.
    for args in
        [vec!["replay", trace, "--allocator", "system"], vec!["demo", "--steps", "2", "--out", dir.to_str().unwrap()]]
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tensormem"))
            .args(&args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("error"), "{args:?}: {err}");
    }
    // A full disk: one line, status 1. Help too must reach its reader.
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let run_full = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tensormem"))
            .args(args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
            .stdout(full())
            .output()
            .unwrap()
    };
    for args in [vec!["replay", trace, "--allocator", "system"], vec!["--help"], vec!["summary", "/nonexistent"]] {
        let out = run_full(&args);
        if args[0] == "summary" {
            assert_one_line_error(&out, "cannot read");
        } else {
            assert_one_line_error(&out, "cannot write to standard output");
        }
    }
}

#[test]
fn files_of_another_kind_are_named_for_what_they_are() {
    let dir_guard = tmp("kinds");
    let dir = dir_guard.path();
    let out = dir.join("demo");
    assert!(tensormem(&["demo", "--steps", "1", "--out", out.to_str().unwrap()]).status.success());
    let history = out.join("history.json");
    let snapshot = out.join("snapshot.json");
    let trace = "benches/traces/kv_cache_stress.json";
    assert_one_line_error(
        &tensormem(&["replay", history.to_str().unwrap()]),
        "this is a history file (draw it with `tensormem timeline`); `replay` takes an allocation trace",
    );
    assert_one_line_error(&tensormem(&["summary", trace]), "this is an allocation trace");
    assert_one_line_error(
        &tensormem(&["timeline", snapshot.to_str().unwrap(), "-o", dir.join("p.html").to_str().unwrap()]),
        "this is a memory snapshot",
    );
    // A bad trace event is named as written, with the rule and the values.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"version":1,"description":"d","events":[[0,1,64,3]]}"#).unwrap();
    assert_one_line_error(
        &tensormem(&["replay", bad.to_str().unwrap()]),
        "event 0 [0,1,64,3] is invalid: the alignment 3",
    );
    // Impossible figures are refused on load instead of printed.
    let forged = dir.join("forged.json");
    let text = std::fs::read_to_string(&snapshot).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["allocators"][0]["stats"]["bytes_in_use"] = serde_json::json!(u64::MAX);
    std::fs::write(&forged, v.to_string()).unwrap();
    assert_one_line_error(&tensormem(&["summary", forged.to_str().unwrap()]), "more than any process can hold");
}

#[test]
fn validation_comes_before_the_file_system_and_pages_never_overwrite_silently() {
    let dir_guard = tmp("order");
    let dir = dir_guard.path();
    // A bad --serve or --allocator leaves no folder behind; a missing parent is refused.
    let out = dir.join("never");
    assert_one_line_error(&tensormem(&["demo", "--serve", "no:such:addr", "--out", out.to_str().unwrap()]), "--serve");
    assert!(!out.exists(), "a failed demo created its folder");
    assert_one_line_error(&tensormem(&["demo", "--allocator", "nosuch", "--out", out.to_str().unwrap()]), "nosuch");
    assert!(!out.exists());
    let nested = dir.join("a/b/c");
    assert_one_line_error(&tensormem(&["demo", "--out", nested.to_str().unwrap()]), "does not exist");
    assert!(!dir.join("a").exists(), "missing parents were created");
    // timeline -o: never the input, an existing file only with --force.
    let run = dir.join("run");
    assert!(tensormem(&["demo", "--steps", "1", "--out", run.to_str().unwrap()]).status.success());
    let history = run.join("history.json");
    let before = std::fs::read(&history).unwrap();
    assert_one_line_error(
        &tensormem(&["timeline", history.to_str().unwrap(), "-o", history.to_str().unwrap(), "--force"]),
        "is the history being read",
    );
    assert_eq!(std::fs::read(&history).unwrap(), before, "the history was overwritten");
    let page = run.join("timeline.html");
    assert_one_line_error(
        &tensormem(&["timeline", history.to_str().unwrap(), "-o", page.to_str().unwrap()]),
        "--force",
    );
    let forced = tensormem(&["timeline", history.to_str().unwrap(), "-o", page.to_str().unwrap(), "--force"]);
    assert!(forced.status.success(), "{}", text(&forced.stderr));
}

#[test]
fn a_bfc_without_a_limit_takes_the_machines_memory_and_says_so() {
    let dir_guard = tmp("bfc");
    let out = tensormem(&["replay", "benches/traces/kv_cache_stress.json", "--allocator", "bfc"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("bfc: no bfc.memory_limit in TENSORMEM_ALLOC_CONF; limited to the machine's memory"),
        "{stdout}"
    );
    assert!(stdout.contains("peak in use: the most the allocator handed out"), "the columns are explained: {stdout}");
    let run = dir_guard.path().join("run");
    let out = tensormem(&["demo", "--steps", "1", "--allocator", "bfc", "--out", run.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("limited to the machine's memory"), "{stdout}");
    assert!(stdout.contains("cached: reserved but not in use"), "the summary explains its columns: {stdout}");
}

#[test]
fn a_lazy_peak_larger_than_the_machine_is_called_out() {
    let dir_guard = tmp("lazy");
    let trace = dir_guard.path().join("tib.json");
    std::fs::write(
        &trace,
        r#"{"version":1,"description":"three 1 TiB blocks","events":[[0,1,1099511627776,64],[1,2,1099511627776,64],[2,3,1099511627776,64],[3,1],[4,2],[5,3]]}"#,
    )
    .unwrap();
    let out = tensormem(&["replay", trace.to_str().unwrap(), "--allocator", "system"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    if stdout.lines().any(|l| l.starts_with("system ") && l.contains("3.0 TiB")) {
        assert!(stdout.contains("note: system (3.0 TiB) held more than this machine's"), "{stdout}");
        assert!(stdout.contains("pages were never touched"), "{stdout}");
    }
}

/// Whether this build drives CUDA and the machine has a device (never on CI).
fn has_cuda_device() -> bool {
    #[cfg(feature = "cuda")]
    return tensormem::allocators::cuda::device_count() > 0;
    #[cfg(not(feature = "cuda"))]
    false
}

/// The `resvd/req` column of `replay`'s row for `allocator`.
fn replayed_ratio(trace: &str, allocator: &str, conf: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tensormem"))
        .args(["replay", trace, "--allocator", allocator])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
        .env_remove("TENSORMEM_ALLOCATOR")
        .env("TENSORMEM_ALLOC_CONF", conf)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let row = stdout.lines().find(|l| l.starts_with(&format!("{allocator} "))).unwrap_or_else(|| panic!("{stdout}"));
    row.split_whitespace().nth(8).unwrap().to_owned()
}

#[test]
fn tune_ranks_configurations_and_its_lines_reproduce_their_figures() {
    let trace = "benches/traces/torch_gpt2_inference.json";
    let out = tensormem(&["tune", trace]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // rank allocator resvd/req use/req ns/op failed configuration
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 7 && w[0].parse::<usize>().is_ok())
        .collect();
    assert_eq!(rows.len(), 26, "{stdout}");
    let ratios: Vec<f64> = rows.iter().map(|w| w[2].parse().unwrap()).collect();
    assert!(ratios.windows(2).all(|p| p[0] <= p[1]), "ranked by reserved/requested: {ratios:?}");
    assert!(ratios.iter().all(|&r| r >= 1.0), "{ratios:?}");
    // The recommended line, set in the environment, reproduces the ratio printed for it.
    let last = stdout.lines().last().unwrap();
    let (allocator, conf) = last
        .strip_prefix("TENSORMEM_ALLOCATOR=")
        .and_then(|r| r.split_once(" TENSORMEM_ALLOC_CONF="))
        .unwrap_or_else(|| panic!("{stdout}"));
    let shown: Vec<&str> = conf.split(',').filter(|i| !i.starts_with("bfc.memory_limit=")).collect();
    let row = rows.iter().find(|w| w[1] == allocator && w[6] == shown.join(",")).expect("the best is in the table");
    assert_eq!(replayed_ratio(trace, allocator, conf), row[2]);
    // So does the best BFC row's configuration (the BFC's limit is the same default in both).
    let bfc = rows.iter().find(|w| w[1] == "bfc").unwrap();
    assert_eq!(replayed_ratio(trace, "bfc", bfc[6]), bfc[2]);
}

#[test]
fn tune_rejects_bad_bounds_and_files() {
    let out = tensormem(&["tune", "benches/traces/kv_cache_stress.json", "--max-slowdown", "0.5"]);
    assert_one_line_error(&out, "--max-slowdown must be a number of at least 1 (got 0.5)");
    let out = tensormem(&["tune", "benches/traces/kv_cache_stress.json", "--max-slowdown", "NaN"]);
    assert_one_line_error(&out, "--max-slowdown");
    let out = tensormem(&["tune", "benches/traces/kv_cache_stress.json", "--jobs", "0"]);
    assert_one_line_error(&out, "--jobs must be at least 1");
    let out = tensormem(&["tune", "no/such/trace.json"]);
    assert_one_line_error(&out, "no/such/trace.json");
    let out = tensormem(&["tune", "Cargo.toml"]);
    assert_one_line_error(&out, "Cargo.toml");
}

#[test]
fn import_torch_gives_back_the_stream_a_snapshot_was_built_from() {
    let dir_guard = tmp("import");
    let out = dir_guard.path().join("trace.json");
    let snapshot = "cli/tests/fixtures/gpt2_inference_2000.pickle";
    let run = tensormem(&["import-torch", snapshot, "-o", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(text(&run.stdout).contains("(1098 allocations, 902 frees;"), "{}", text(&run.stdout));
    // The fixture was pickled by Python from the first 2000 events of the shipped stream
    // (`cli/tests/fixtures/make_torch_snapshot.py`): the import gives them back exactly.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let original = tensormem::AllocationTrace::from_json(
        &std::fs::read_to_string(root.join("benches/traces/torch_gpt2_inference.json")).unwrap(),
    )
    .unwrap();
    let imported = tensormem::AllocationTrace::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(imported.events, original.events[..2000]);
    assert!(imported.description.contains("gpt2_inference_2000.pickle, device 0"), "{}", imported.description);
    // It replays and tunes like any trace.
    let replayed = tensormem(&["replay", out.to_str().unwrap(), "--allocator", "bfc"]);
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    // Device 1's trace, and a device the snapshot does not have.
    let one = dir_guard.path().join("one.json");
    let run = tensormem(&["import-torch", snapshot, "-o", one.to_str().unwrap(), "--device", "1"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let t = tensormem::AllocationTrace::from_json(&std::fs::read_to_string(&one).unwrap()).unwrap();
    assert_eq!(t.events, [tensormem::TraceEvent::Alloc(0, 1, 4096, 256)]);
    let run = tensormem(&["import-torch", snapshot, "-o", one.to_str().unwrap(), "--device", "2", "--force"]);
    assert_one_line_error(&run, "no device 2: the snapshot has traces for 2 device(s)");
    // The output is not overwritten without --force, and never the snapshot itself.
    let run = tensormem(&["import-torch", snapshot, "-o", one.to_str().unwrap()]);
    assert_one_line_error(&run, "exists: pass --force");
    let run = tensormem(&["import-torch", snapshot, "-o", snapshot, "--force"]);
    assert_one_line_error(&run, "is the snapshot being read");
}

#[test]
fn import_torch_refuses_corrupt_and_hostile_pickles() {
    let dir_guard = tmp("import-bad");
    let dir = dir_guard.path();
    let out = dir.join("t.json");
    let case = |name: &str, bytes: &[u8], says: &str| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let run = tensormem(&["import-torch", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert_one_line_error(&run, name);
        assert_one_line_error(&run, says);
        assert!(!out.exists(), "nothing written for {name}");
    };
    case("empty.pickle", b"", "not a readable pickle");
    case("text.pickle", b"{\"device_traces\": []}", "not a readable pickle");
    let good =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2_inference_2000.pickle")).unwrap();
    case("truncated.pickle", &good[..good.len() / 2], "not a readable pickle");
    // The classic pickle that runs a shell command when Python loads it: a reference to
    // os.system. Refused as not plain data; nothing runs (the marker file is never made).
    let marker = dir.join("ran");
    let hostile = format!("cos\nsystem\n(S'touch {}'\ntR.", marker.display());
    case("hostile.pickle", hostile.as_bytes(), "not a readable pickle of plain data");
    assert!(!marker.exists());
    // A pickle of plain data that is not a snapshot: an int, and a dict without device_traces.
    case("int.pickle", b"\x80\x04K\x05.", "the pickle holds no dict");
    case("dict.pickle", b"\x80\x04}\x94.", "no 'device_traces' list");
    let run = tensormem(&["import-torch", dir.join("missing.pickle").to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_one_line_error(&run, "missing.pickle");
}

/// `go`, or `None` (printing why) when it is not installed and `TENSORMEM_REQUIRE_GO` is not 1.
fn go() -> Option<&'static str> {
    if Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
        return Some("go");
    }
    assert!(
        std::env::var("TENSORMEM_REQUIRE_GO").map_or(true, |v| v != "1"),
        "TENSORMEM_REQUIRE_GO=1 but no go on PATH"
    );
    println!(
        "SKIPPED pprof read by go tool pprof: no go on PATH (install Debian's golang-go, or set TENSORMEM_REQUIRE_GO=1 to fail)"
    );
    None
}

/// A history of four allocations at two sites with backtraces and one without (scope
/// `decoder/layer0`); the peak (3.5 MiB) holds the weights, the layer's block and the 2 MiB
/// attention block.
fn sites_history() -> String {
    use tensormem::allocators::observe::Action;
    use tensormem::history::{History, HistoryEvent};
    let bt = |f: &str, line: u32| {
        format!(
            "   0: app::{f}\n             at ./src/model.rs:{line}:9\n   1: app::main\n             at ./src/main.rs:7:5\n"
        )
    };
    let ev = |t: u64, action, address, size: u64, backtrace: Option<String>, tag: Option<&str>| HistoryEvent {
        time_ns: t,
        action,
        address,
        size,
        allocator: "cpu".into(),
        tag: tag.map(str::to_owned),
        description: None,
        backtrace,
    };
    let events = vec![
        ev(1, Action::Alloc, 0x1000_0000, 1 << 20, Some(bt("load_weights", 42)), None),
        ev(2, Action::Alloc, 0x2000_0000, 256 << 10, Some(bt("attention", 77)), None),
        ev(3, Action::Free, 0x2000_0000, 256 << 10, None, None),
        ev(4, Action::Alloc, 0x3000_0000, 512 << 10, None, Some("decoder/layer0")),
        ev(5, Action::Alloc, 0x4000_0000, 2 << 20, Some(bt("attention", 77)), None),
        ev(6, Action::Free, 0x4000_0000, 2 << 20, None, None),
    ];
    History { version: 1, start_unix_ms: 1_700_000_000_000, capacity: 100, dropped: 0, events }.to_json()
}

#[test]
fn pprof_profiles_are_read_by_go_tool_pprof() {
    let dir_guard = tmp("pprof");
    let dir = dir_guard.path();
    let history = dir.join("history.json");
    std::fs::write(&history, sites_history()).unwrap();
    let profile = dir.join("heap.pb.gz");
    let run = tensormem(&["pprof", history.to_str().unwrap(), "-o", profile.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(text(&run.stdout).contains("3 allocation sites from recorded backtraces"), "{}", text(&run.stdout));
    let bytes = std::fs::read(&profile).unwrap();
    assert_eq!(&bytes[..2], [0x1f, 0x8b], "gzip");
    // The same file again needs --force; the history itself is never the output.
    assert_one_line_error(
        &tensormem(&["pprof", history.to_str().unwrap(), "-o", profile.to_str().unwrap()]),
        "--force",
    );
    let same = tensormem(&["pprof", history.to_str().unwrap(), "-o", history.to_str().unwrap(), "--force"]);
    assert_one_line_error(&same, "is the history being read");
    let Some(go) = go() else { return };
    let top = |index: &str| {
        let out = Command::new(go)
            .args(["tool", "pprof", "-top", "-nodecount=20", &format!("-sample_index={index}")])
            .arg(&profile)
            .env("HOME", dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "go tool pprof: {}", text(&out.stderr));
        text(&out.stdout)
    };
    // `flat flat% sum% cum cum% name`: the flat bytes of each function.
    let flat = |report: &str, name: &str| -> String {
        let line =
            report.lines().find(|l| l.trim_end().ends_with(name)).unwrap_or_else(|| panic!("{name} in {report}"));
        line.split_whitespace().next().unwrap().to_owned()
    };
    let peak = top("live_bytes_at_peak");
    assert!(peak.contains("Type: live_bytes_at_peak"), "{peak}");
    // pprof counts in units of 1024: the peak's 3.5 MiB is 3584kB.
    assert!(peak.contains("Total samples = 3584kB"), "{peak}");
    assert_eq!(flat(&peak, "app::attention"), "2048kB");
    assert_eq!(flat(&peak, "app::load_weights"), "1024kB");
    assert_eq!(flat(&peak, "layer0"), "512kB", "the scope path stands in for a missing backtrace");
    let allocated = top("bytes_allocated");
    assert!(allocated.contains("Total samples = 3840kB"), "{allocated}");
    assert_eq!(flat(&allocated, "app::attention"), "2304kB", "both attention blocks, 2 MiB + 256 KiB");
}

#[test]
fn pprof_refuses_what_is_not_a_history() {
    let dir_guard = tmp("pprof-bad");
    let out = dir_guard.path().join("p.pb.gz");
    assert_one_line_error(
        &tensormem(&["pprof", "benches/traces/kv_cache_stress.json", "-o", out.to_str().unwrap()]),
        "kv_cache_stress.json",
    );
    assert_one_line_error(
        &tensormem(&["pprof", "no/such/history.json", "-o", out.to_str().unwrap()]),
        "no/such/history.json",
    );
    let bad = dir_guard.path().join("bad.json");
    std::fs::write(
        &bad,
        "{\"version\":1,\"start_unix_ms\":0,\"capacity\":1,\"dropped\":0,\"events\":[{\"time_ns\":0}]}",
    )
    .unwrap();
    assert_one_line_error(&tensormem(&["pprof", bad.to_str().unwrap(), "-o", out.to_str().unwrap()]), "bad.json");
    assert!(!out.exists());
    // A target in a folder that does not exist.
    let good = dir_guard.path().join("good.json");
    std::fs::write(&good, sites_history()).unwrap();
    let nowhere = dir_guard.path().join("missing/dir/p.pb.gz");
    assert_one_line_error(
        &tensormem(&["pprof", good.to_str().unwrap(), "-o", nowhere.to_str().unwrap()]),
        "cannot write",
    );
}
