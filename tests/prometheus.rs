//! Against a real Prometheus: three exporter processes scraped every second, the per-instance
//! sums matching what each process reports, every dashboard query returning data, and
//! `promtool check metrics` clean.
//!
//! Needs Debian's `prometheus` and `promtool` (`.ci/run` installs them). Without them the test
//! says why and passes, unless `TENSORMEM_REQUIRE_PROMETHEUS=1`, under which it fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// The exporter example, compiled into this test: each exporter process is this test binary
// running `exporter_process`, so the test starts no `cargo`.
#[path = "../examples/exporter.rs"]
#[allow(dead_code)]
mod exporter;

/// Set in the exporter processes: the port to serve on.
const EXPORTER_PORT_ENV: &str = "TENSORMEM_TEST_EXPORTER_PORT";

/// In an exporter process (started by the test below), serves for 300 s with 3 s of workload;
/// in a normal run, does nothing.
#[test]
fn exporter_process() {
    if let Some(port) = std::env::var(EXPORTER_PORT_ENV).ok().and_then(|p| p.parse().ok()) {
        let _ = exporter::run(port, Some(300), Some(3));
    }
}

/// Kills and reaps every process it holds when dropped, whatever happened.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn find(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(binary)).find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A plain HTTP/1.1 GET; returns the body of a 200 answer.
fn http_get(addr: SocketAddr, path_and_query: &str) -> Option<String> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(c, "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    if !text.starts_with("HTTP/1.1 200") {
        return None;
    }
    let (head, body) = text.split_once("\r\n\r\n")?;
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        // De-chunk.
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.push_str(tail.get(..n)?);
            rest = tail.get(n + 2..)?;
        }
        return Some(out);
    }
    Some(body.to_owned())
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs an instant query; returns the `data.result` array.
fn query(prom: SocketAddr, q: &str) -> Vec<serde_json::Value> {
    let body = http_get(prom, &format!("/api/v1/query?query={}", encode(q))).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Whether Prometheus runs the query (valid PromQL), whatever it returns.
fn query_ok(prom: SocketAddr, q: &str) -> bool {
    let body = http_get(prom, &format!("/api/v1/query?query={}", encode(q))).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["status"] == "success"
}

/// The sum of `tensormem_allocator_in_use_bytes` over allocators in an exposition.
fn in_use_sum(exposition: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with("tensormem_allocator_in_use_bytes{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts an exporter process on a free port and waits until it answers. A port found free can
/// be taken before the exporter binds it (by any process's outgoing connection): the exporter
/// then exits, and another port is tried.
fn start_exporter(exe: &std::path::Path, procs: &mut Processes) -> SocketAddr {
    for _ in 0..5 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut child = Command::new(exe)
            .args(["--exact", "exporter_process", "--nocapture", "--test-threads=1"])
            .env(EXPORTER_PORT_ENV, addr.port().to_string())
            .env("TENSORMEM_ALLOC_CONF", "bfc.memory_limit=64MiB,bfc.allow_growth=true")
            .env_remove("TENSORMEM_ALLOCATOR")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if http_get(addr, "/metrics").is_some() {
                procs.0.push(child);
                return addr;
            }
            if child.try_wait().unwrap().is_some() {
                break; // it could not listen there
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("no exporter answered on any of 5 ports");
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_real_prometheus_scrapes_a_fleet_of_exporters() {
    let required = std::env::var("TENSORMEM_REQUIRE_PROMETHEUS").is_ok_and(|v| v == "1");
    let (Some(prometheus), Some(promtool)) = (find("prometheus"), find("promtool")) else {
        assert!(!required, "TENSORMEM_REQUIRE_PROMETHEUS=1 but `prometheus` or `promtool` is not on PATH");
        skip(
            "a_real_prometheus_scrapes_a_fleet_of_exporters",
            "`prometheus` and `promtool` are not on PATH (apt-get install prometheus)",
        );
        return;
    };

    let exe = std::env::current_exe().unwrap();

    let mut procs = Processes(Vec::new());
    let fleet: Vec<SocketAddr> = (0..3).map(|_| start_exporter(&exe, &mut procs)).collect();

    let dir = std::env::temp_dir().join(format!("tensormem-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let targets: Vec<String> = fleet.iter().map(|a| format!("'{a}'")).collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tensormem\n    \
         static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let prom = SocketAddr::from(([127, 0, 0, 1], free_port()));
    procs.0.push(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // All three targets up.
    wait_for("three targets up", Duration::from_secs(60), || query(prom, "up{job=\"tensormem\"} == 1").len() == 3);
    // The exporters hold still after 3 s; wait for a few scrapes after that.
    std::thread::sleep(Duration::from_secs(5));

    let sums = query(prom, "sum by (instance) (tensormem_allocator_in_use_bytes)");
    assert_eq!(sums.len(), 3, "{sums:?}");
    for series in &sums {
        let instance = series["metric"]["instance"].as_str().unwrap();
        let scraped: f64 = series["value"][1].as_str().unwrap().parse().unwrap();
        let addr: SocketAddr = instance.parse().unwrap();
        let reported = in_use_sum(&http_get(addr, "/metrics").unwrap());
        assert!(scraped > 0.0);
        assert_eq!(scraped, reported, "{instance}: Prometheus has {scraped}, the process reports {reported}");
    }

    // Every query of the dashboard returns data, with the variables set to "all".
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/tensormem.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        // Rows have no targets.
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().replace("$instance", ".*").replace("$allocator", ".*"));
        }
    }
    assert!(exprs.len() >= 10);
    for expr in &exprs {
        // Device series exist only on machines with a CUDA device: there the query must be
        // valid PromQL that Prometheus runs; everywhere else it must return data.
        if expr.contains("tensormem_device_") {
            assert!(query_ok(prom, expr), "dashboard query is not valid PromQL: {expr}");
        } else {
            assert!(!query(prom, expr).is_empty(), "dashboard query returned no data: {expr}");
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"]["query"].as_str() {
            let series = q.replace("label_values(", "").replace("$instance", ".*");
            let metric = series.rsplit_once(',').map_or(series.as_str(), |(m, _)| m);
            assert!(!query(prom, metric).is_empty(), "variable query has no data: {q}");
        }
    }

    // promtool is happy with the exposition, warnings included.
    let exposition = http_get(fleet[0], "/metrics").unwrap();
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}");

    drop(procs);
    for addr in &fleet {
        assert!(TcpStream::connect_timeout(addr, Duration::from_millis(500)).is_err(), "an exporter is still running");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Says that a test skips, and why, where `cargo test` shows it without `--nocapture`: straight
/// to the process's standard error (the test harness captures only `print!` and `eprint!`).
fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}
