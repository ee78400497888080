//! The timeline page in a real headless Chromium: it loads with no errors, draws the expected
//! bands, stays quick with 100k events, draws hostile scope tags as text, and leaves a
//! screenshot under the target directory's `tmp/timeline/`.
//!
//! Skipped (with the reason printed) when no Chromium is installed, unless
//! `TENSORMEM_REQUIRE_CHROMIUM=1` (as `.ci/run` sets after installing Debian's `chromium`).

use std::path::{Path, PathBuf};
use std::process::Command;

use tensormem::allocators::observe::Action;
use tensormem::history::{History, HistoryEvent};
use tensormem::timeline::render_html;

fn chromium() -> Option<PathBuf> {
    let required = std::env::var("TENSORMEM_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            return Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    assert!(!required, "TENSORMEM_REQUIRE_CHROMIUM=1 but no chromium binary is on PATH");
    skip(
        "a browser test",
        "no chromium on PATH (install Debian's `chromium`, or set TENSORMEM_REQUIRE_CHROMIUM=1 to fail)",
    );
    None
}

/// Where pages and screenshots go: cargo's scratch folder for integration tests, inside the
/// target directory that `CARGO_TARGET_DIR` (or the default) names.
fn target_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("timeline");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Loads `html` in Chromium and returns the DOM after its scripts ran, and stderr.
fn load(browser: &Path, name: &str, html: &str, screenshot: bool) -> (String, String) {
    let dir = target_dir();
    let page = dir.join(format!("{name}.html"));
    std::fs::write(&page, html).unwrap();
    let url = format!("file://{}", page.display());
    let profile = dir.join(format!("profile-{name}"));
    let common = [
        "--headless=new".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--no-first-run".to_owned(),
        "--hide-scrollbars".to_owned(),
        "--window-size=1400,900".to_owned(),
        "--enable-logging=stderr".to_owned(),
        "--v=0".to_owned(),
        format!("--user-data-dir={}", profile.display()),
    ];
    let out = Command::new(browser).args(&common).arg("--dump-dom").arg(&url).output().unwrap();
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    if screenshot {
        let png = dir.join(format!("{name}.png"));
        let _ = std::fs::remove_file(&png);
        let shot = Command::new(browser)
            .args(&common)
            .arg(format!("--screenshot={}", png.display()))
            .arg(&url)
            .output()
            .unwrap();
        assert!(shot.status.success(), "screenshot failed: {}", String::from_utf8_lossy(&shot.stderr));
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "screenshot of {} bytes", bytes.len());
        eprintln!("screenshot: {}", png.display());
    }
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The value of `data-NAME` on the status element.
fn status(dom: &str, name: &str) -> String {
    let at = dom.find("id=\"status\"").expect("status element in the DOM");
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let key = format!("data-{name}=\"");
    let v = &tag[tag.find(&key).unwrap_or_else(|| panic!("no {key} in {tag}")) + key.len()..];
    v[..v.find('"').unwrap()].to_owned()
}

fn event(t: u64, action: Action, address: u64, size: u64, tag: Option<&str>) -> HistoryEvent {
    HistoryEvent {
        time_ns: t,
        action,
        address,
        size,
        allocator: "bfc".into(),
        tag: tag.map(str::to_owned),
        description: (action == Action::Alloc).then(|| format!("tensor f32 [{}]", size / 4)),
        backtrace: (action == Action::Alloc && size > 60_000).then(|| "0: demo::layer\n1: main".to_owned()),
    }
}

/// 37 allocations in three scopes, one freed out of order, one OOM, a segment.
fn known_history() -> History {
    let mut events = vec![event(0, Action::SegmentAlloc, 1 << 30, 64 << 20, None)];
    let tags = ["embed", "layer0/attn", "layer0/mlp"];
    for i in 0..37u64 {
        events.push(event(
            10 * i + 1,
            Action::Alloc,
            (1 << 30) + i * (1 << 20),
            4096 * (i + 1),
            Some(tags[i as usize % 3]),
        ));
        if i % 4 == 3 {
            events.push(event(10 * i + 5, Action::Free, (1 << 30) + (i - 2) * (1 << 20), 4096 * (i - 1), None));
        }
    }
    events.push(event(400, Action::Oom, 0, 1 << 40, Some("layer0/mlp")));
    events.push(event(410, Action::SegmentFree, 1 << 30, 64 << 20, None));
    History { version: 1, start_unix_ms: 0, capacity: 1000, dropped: 0, events }
}

#[test]
fn the_page_shows_what_was_live_at_the_peak() {
    let history = known_history();
    let peak = history.peak().unwrap();
    let html = render_html(&history);
    let heading = format!(
        "<h2>Live at the peak: {} in {} allocations, after event {} ",
        tensormem::ByteSize(peak.bytes),
        peak.allocations.len(),
        peak.event
    );
    assert!(html.contains(&heading), "{heading} in the page");
    // Every scope's share of the peak, largest first, matching the live set.
    let scopes = peak.by_scope();
    assert_eq!(scopes.len(), 3);
    let table = &html[html.find("<table id=\"peak-scopes\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    let mut at = 0;
    for g in &scopes {
        let row = format!("<tr><td>{}</td><td>{}</td>", g.key.as_deref().unwrap(), tensormem::ByteSize(g.bytes));
        let found = table[at..].find(&row).unwrap_or_else(|| panic!("{row} after {at} in {table}"));
        at += found + row.len();
    }
    assert!(html.contains("<table id=\"peak-descriptions\""));
    // The flame graph of the peak: allocations with a backtrace (those above 60 000 bytes) under
    // their outermost frame `main`, the others by scope path (`layer0` holds `attn` and `mlp`);
    // each box titled with its bytes and share.
    let sum = |f: &dyn Fn(&tensormem::history::LiveAllocation) -> bool| {
        peak.allocations.iter().filter(|a| f(a)).map(|a| a.size).sum::<u64>()
    };
    let traced = sum(&|a| a.backtrace.is_some());
    let scoped =
        |prefix: &str| sum(&|a| a.backtrace.is_none() && a.tag.as_deref().is_some_and(|t| t.starts_with(prefix)));
    assert!(traced > 0 && scoped("layer0/") > 0, "both kinds are live at the peak");
    for (name, b) in
        [("main", traced), ("layer0", scoped("layer0/")), ("attn", scoped("layer0/attn")), ("embed", scoped("embed"))]
    {
        let title =
            format!("title=\"{name}: {} ({:.1}%)\"", tensormem::ByteSize(b), b as f64 * 100.0 / peak.bytes as f64);
        assert!(html.contains(&title), "{title} in the flame graph");
    }
    assert!(html.contains(&format!("\"peak_event\":{}", peak.event)), "the data marks the peak");
}

#[test]
fn the_page_loads_without_errors_and_draws_every_band() {
    let Some(browser) = chromium() else { return };
    let history = known_history();
    let html = render_html(&history);
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("<script src"));
    let (dom, stderr) = load(&browser, "known", &html, true);
    assert_eq!(status(&dom, "ready"), "1", "the script did not finish: {stderr}");
    assert_eq!(status(&dom, "errors"), "0", "errors: {dom}");
    assert!(!stderr.contains("Uncaught"), "{stderr}");
    assert_eq!(status(&dom, "bands"), "37");
    assert_eq!(status(&dom, "drawn"), "37");
    // The per-tag table: 13 allocations in embed (i = 0, 3, .., 36).
    assert!(dom.contains("<td>embed</td><td>13</td>"), "{dom}");
    // The y axis reaches the reserved 64 MiB, far above the peak in use; the peak is marked.
    let max_in_use: f64 = status(&dom, "max-in-use").parse().unwrap();
    assert_eq!(status(&dom, "max-reserved"), (64u64 << 20).to_string());
    assert_eq!(status(&dom, "max-y"), (64u64 << 20).to_string());
    assert!(max_in_use > 0.0 && max_in_use < (64u64 << 20) as f64, "{max_in_use}");
    assert_eq!(status(&dom, "peak-x"), history.peak().unwrap().event.to_string());
}

#[test]
fn a_hundred_thousand_events_lay_out_quickly() {
    let Some(browser) = chromium() else { return };
    let mut events = Vec::with_capacity(100_000);
    let mut live: Vec<u64> = Vec::new();
    let mut seed = 7u64;
    for i in 0..100_000u64 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if live.len() > 200 || (!live.is_empty() && seed >> 63 == 1) {
            let a = live.swap_remove((seed >> 20) as usize % live.len());
            events.push(event(i * 100, Action::Free, a, 0, None));
        } else {
            let size = 256 << ((seed >> 40) % 12);
            live.push(i * 4096);
            events.push(event(
                i * 100,
                Action::Alloc,
                i * 4096,
                size,
                Some(["a", "b", "c", "d"][(seed >> 50) as usize % 4]),
            ));
        }
    }
    let h = History { version: 1, start_unix_ms: 0, capacity: 100_000, dropped: 0, events };
    let html = render_html(&h);
    let (dom, stderr) = load(&browser, "100k", &html, true);
    assert_eq!(status(&dom, "ready"), "1", "{stderr}");
    assert_eq!(status(&dom, "errors"), "0", "{dom}");
    assert_eq!(status(&dom, "bands"), "2000");
    eprintln!(
        "100k events: page {} KiB, layout and first draw {} ms in headless Chromium",
        html.len() / 1024,
        status(&dom, "layout-ms")
    );
}

#[test]
fn hostile_tags_are_drawn_as_text_and_run_no_script() {
    let Some(browser) = chromium() else { return };
    let mut h = known_history();
    let hostile = [
        "/*DATA*/<img src=x onerror=\"document.title='pwned'\">",
        "<!--<script>",
        "</script><script>document.title='pwned'</script>",
        "<!--TABLE--><!--SUMMARY-->",
    ];
    for (e, tag) in h.events.iter_mut().filter(|e| e.action == Action::Alloc).zip(hostile.iter().cycle()) {
        e.tag = Some((*tag).to_owned());
        e.description = Some(format!("{tag} & 'quoted'"));
    }
    let html = render_html(&h);
    let (dom, stderr) = load(&browser, "hostile", &html, false);
    assert_eq!(status(&dom, "ready"), "1", "the page's script did not finish: {stderr}");
    assert_eq!(status(&dom, "errors"), "0", "errors: {dom}");
    assert_eq!(status(&dom, "drawn"), "37");
    assert!(!dom.contains("<img"), "a tag became an element: {dom}");
    assert!(dom.contains("<title>tensormem memory timeline</title>"), "a tag ran as script: {dom}");
    assert!(dom.contains("<td>/*DATA*/&lt;img src=x onerror="), "the tag is not shown as text: {dom}");
    assert!(dom.contains("<td>&lt;!--&lt;script&gt;</td>"), "{dom}");
}

/// Says that a test skips, and why, where `cargo test` shows it without `--nocapture`: straight
/// to the process's standard error (the test harness captures only `print!` and `eprint!`).
fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}
