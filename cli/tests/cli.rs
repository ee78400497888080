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
    assert_one_line_error(&tensormem(&["replay", malformed.to_str().unwrap()]), "not valid JSON");
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
    assert_one_line_error(&tensormem(&["demo", "--steps", "0", "--out", dir.to_str().unwrap()]), "--steps");
    // Usage mistakes are clap's (status 2), not panics.
    let out = tensormem(&["demo", "--steps", "many"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!text(&out.stderr).contains("panicked"));
}

/// Whether this build drives CUDA and the machine has a device (never on CI).
fn has_cuda_device() -> bool {
    #[cfg(feature = "cuda")]
    return tensormem::allocators::cuda::device_count() > 0;
    #[cfg(not(feature = "cuda"))]
    false
}
