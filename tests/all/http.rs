//! The /metrics endpoint: answers, bad requests, stalled clients, the connection cap, a port in
//! use, and stopping on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensormem::telemetry::{AllocatorCollector, MetricsServer, ServerError, ServerOptions};
use tensormem::{AllocatorRegistry, SystemAllocator};

fn server(options: ServerOptions) -> MetricsServer {
    let registry = Arc::new(AllocatorRegistry::new());
    registry.register("cpu", 0, Arc::new(SystemAllocator::new())).unwrap();
    MetricsServer::start_with("127.0.0.1:0", AllocatorCollector::for_registry(registry), options).unwrap()
}

/// Sends `request` and returns the whole response (the server closes or times out).
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(addr: SocketAddr, path: &str) -> String {
    exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
}

#[test]
fn metrics_are_served_with_the_exposition_content_type() {
    let s = server(ServerOptions::default());
    let r = get(s.local_addr(), "/metrics");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("content-type: text/plain; version=0.0.4\r\n"), "{r}");
    assert!(r.contains("tensormem_allocator_in_use_bytes{allocator=\"cpu\"} 0"), "{r}");
    let head = exchange(s.local_addr(), b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
}

#[test]
fn other_paths_methods_and_malformed_requests_get_4xx() {
    let s = server(ServerOptions::default());
    let addr = s.local_addr();
    assert!(get(addr, "/").starts_with("HTTP/1.1 404 Not Found\r\n"));
    assert!(get(addr, "/metrics/extra").starts_with("HTTP/1.1 404"));
    let post = exchange(addr, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{post}");
    assert!(post.contains("allow: GET, HEAD\r\n"), "{post}");
    for garbage in
        [&b"GARBAGE\r\n\r\n"[..], b"GET /metrics HTTP/9.9\r\n\r\n", b"GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n"]
    {
        let r = exchange(addr, garbage);
        assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{:?} -> {r:?}", String::from_utf8_lossy(garbage));
    }
    let huge = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n", "a".repeat(64 << 10));
    let r = exchange(addr, huge.as_bytes());
    assert!(r.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{r:?}");
    // Still serving after all that.
    assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn a_stalled_client_does_not_block_other_scrapes_and_is_dropped() {
    // Bounds far from the timeout on either side, so that a slow machine cannot blur them.
    let s = server(ServerOptions { header_read_timeout: Duration::from_secs(4), ..ServerOptions::default() });
    let addr = s.local_addr();
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /metr").unwrap();
    for _ in 0..5 {
        let start = Instant::now();
        assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
        assert!(start.elapsed() < Duration::from_secs(2), "a scrape waited for the stalled client");
    }
    // The stalled client is disconnected once its head is overdue.
    stalled.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = Vec::new();
    let start = Instant::now();
    let _ = stalled.read_to_end(&mut buf);
    assert!(start.elapsed() < Duration::from_secs(20), "the stalled connection was kept open");
}

#[test]
fn at_the_cap_a_stalled_client_makes_room_for_a_scrape() {
    let s = server(ServerOptions {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        ..ServerOptions::default()
    });
    let addr = s.local_addr();
    let mut idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    // Both slots are taken by clients that sent nothing: the oldest is closed for the scrape.
    let start = Instant::now();
    assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
    assert!(start.elapsed() < Duration::from_secs(10), "the newcomer waited for the stalled clients");
    idle[0].set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(idle[0].read(&mut buf).unwrap_or(0), 0, "the oldest stalled client was closed");
    idle.clear();
}

/// Opens a kept-alive connection that has had one whole answer and then waits, idle.
fn idle_client(addr: SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(c.read(&mut byte).unwrap(), 1, "the server closed a kept-alive connection");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a content-length");
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).unwrap();
    c
}

#[test]
fn idle_kept_alive_clients_at_the_cap_make_room_oldest_first() {
    let s = server(ServerOptions { max_connections: 4, ..ServerOptions::default() });
    let addr = s.local_addr();
    // Every slot holds a client that has had its answer and keeps the connection open.
    let mut idle: Vec<TcpStream> = (0..4).map(|_| idle_client(addr)).collect();
    // Three scrapes in a row all get through: each takes the slot of the longest idle client.
    for round in 0..3 {
        let r = get(addr, "/metrics");
        assert!(r.starts_with("HTTP/1.1 200 OK"), "scrape {round} at the cap of idle clients: {r:?}");
    }
    // The first idle client was closed for the first scrape; the last one is still served.
    idle[0].set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(idle[0].read(&mut buf).unwrap_or(0), 0, "the longest idle client was closed");
    let last = idle.last_mut().unwrap();
    last.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = last.read_to_end(&mut out);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200 OK"), "the newest idle client was evicted");
    idle.clear();
}

#[test]
fn a_client_waiting_for_its_answer_is_not_evicted_for_a_newcomer() {
    let s = slow_server(Duration::from_millis(800), ServerOptions { max_connections: 1, ..ServerOptions::default() });
    let addr = s.local_addr();
    let mut busy = TcpStream::connect(addr).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    busy.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The only slot is answering a request: the newcomer is refused, the answer still comes.
    let refused = get(addr, "/metrics");
    assert_eq!(refused, "", "a newcomer took the slot of a request in flight");
    let mut out = Vec::new();
    let _ = busy.read_to_end(&mut out);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn fifty_slow_and_twenty_silent_clients_do_not_lock_prometheus_out() {
    let s = server(ServerOptions::default());
    let addr = s.local_addr();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // 50 slowloris clients: a byte of a request head every 100 ms, never finishing it.
    let slow: Vec<_> = (0..50)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let Ok(mut c) = TcpStream::connect(addr) else { return };
                let head =
                    b"GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
                for &b in head.iter().cycle() {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) || c.write_all(&[b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    // 20 silent clients: connected, sending nothing.
    let silent: Vec<TcpStream> = (0..20).filter_map(|_| TcpStream::connect(addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..20 {
        let start = Instant::now();
        let r = get(addr, "/metrics");
        assert!(r.starts_with("HTTP/1.1 200 OK"), "scrape {i}: {r:?}");
        assert!(start.elapsed() < Duration::from_secs(4), "scrape {i} took {:?}", start.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(silent);
    for t in slow {
        t.join().unwrap();
    }
}

/// An allocator whose `stats()` takes `delay`: a custom allocator holding a lock for long.
#[derive(Debug)]
struct Slow(SystemAllocator, Duration);

// SAFETY: every call is forwarded to the system allocator; `stats` only sleeps first.
unsafe impl tensormem::Allocator for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn allocate_raw(
        &self,
        layout: std::alloc::Layout,
        attrs: &tensormem::AllocationAttributes,
    ) -> Result<std::ptr::NonNull<u8>, tensormem::AllocError> {
        self.0.allocate_raw(layout, attrs)
    }
    unsafe fn deallocate_raw(&self, ptr: std::ptr::NonNull<u8>, layout: std::alloc::Layout) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.0.deallocate_raw(ptr, layout) }
    }
    fn stats(&self) -> Option<tensormem::AllocatorStats> {
        std::thread::sleep(self.1);
        self.0.stats()
    }
}

fn slow_server(delay: Duration, options: ServerOptions) -> MetricsServer {
    let registry = Arc::new(AllocatorRegistry::new());
    registry.register("slow", 0, Arc::new(Slow(SystemAllocator::new(), delay))).unwrap();
    MetricsServer::start_with("127.0.0.1:0", AllocatorCollector::for_registry(registry), options).unwrap()
}

#[test]
fn a_slow_stats_call_delays_only_its_own_scrape() {
    let s = slow_server(Duration::from_secs(6), ServerOptions::default());
    let addr = s.local_addr();
    let slow_scrape = std::thread::spawn(move || get(addr, "/metrics"));
    std::thread::sleep(Duration::from_millis(200));
    // While the render runs, connections are still accepted and answered.
    let start = Instant::now();
    assert!(get(addr, "/other").starts_with("HTTP/1.1 404"));
    assert!(start.elapsed() < Duration::from_secs(3), "the I/O thread waited for stats(): {:?}", start.elapsed());
    assert!(slow_scrape.join().unwrap().contains("tensormem_allocator_in_use_bytes{allocator=\"slow\"} 0"));
}

#[test]
fn the_connection_limit_lets_the_request_in_flight_finish() {
    let s = slow_server(
        Duration::from_millis(600),
        ServerOptions { connection_timeout: Duration::from_millis(300), ..ServerOptions::default() },
    );
    let mut c = TcpStream::connect(s.local_addr()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The answer takes until ~800 ms, past the 300 ms limit: it still comes whole.
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    let r = String::from_utf8_lossy(&out);
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    let body_len: usize = r
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a content-length");
    assert_eq!(r.split("\r\n\r\n").nth(1).map(str::len), Some(body_len), "the response was cut");
}

#[test]
fn endless_timeouts_are_saturated_not_a_panic() {
    let s = server(ServerOptions {
        header_read_timeout: Duration::MAX,
        connection_timeout: Duration::MAX,
        max_connections: 0,
        max_request_bytes: 0,
    });
    assert!(get(s.local_addr(), "/metrics").starts_with("HTTP/1.1 200 OK"));
    assert!(get(s.local_addr(), "/metrics").starts_with("HTTP/1.1 200 OK"), "the server thread survived");
}

#[test]
fn a_users_prometheus_registry_is_served_whole() {
    use tensormem::prometheus::{IntCounter, Registry};
    let registry = Registry::new();
    let allocators = Arc::new(AllocatorRegistry::new());
    allocators.register("cpu", 0, Arc::new(SystemAllocator::new())).unwrap();
    registry.register(Box::new(AllocatorCollector::for_registry(allocators))).unwrap();
    let requests = IntCounter::new("engine_requests_total", "Requests served.").unwrap();
    registry.register(Box::new(requests.clone())).unwrap();
    requests.inc_by(3);
    let s = MetricsServer::start_registry("127.0.0.1:0", registry, ServerOptions::default()).unwrap();
    let r = get(s.local_addr(), "/metrics");
    assert!(r.contains("engine_requests_total 3"), "{r}");
    assert!(r.contains("tensormem_allocator_in_use_bytes{allocator=\"cpu\"} 0"), "{r}");
}

#[test]
fn running_out_of_file_descriptors_does_not_spin_the_server_thread() {
    // RLIMIT_NOFILE is process-wide: the check runs in a child process of this test binary.
    if std::env::var_os("TENSORMEM_TEST_EMFILE_CHILD").is_some() {
        return emfile_child();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "http::running_out_of_file_descriptors_does_not_spin_the_server_thread", "--nocapture"])
        .env("TENSORMEM_TEST_EMFILE_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("EMFILE CHILD OK"), "{text}");
}

fn emfile_child() {
    let s = server(ServerOptions::default());
    let addr = s.local_addr();
    // Leave a handful of descriptors, then use them up with connections the server must accept.
    let lim = libc::rlimit { rlim_cur: 64, rlim_max: 64 };
    // SAFETY: setrlimit reads the struct we pass; it only lowers this child's descriptor limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut held = Vec::new();
    while let Ok(c) = TcpStream::connect(addr) {
        held.push(c);
        if held.len() > 200 {
            break;
        }
    }
    // Now accept() fails with EMFILE while connections wait. Measure the process's CPU time.
    let cpu = || {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes the struct it is given.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
        // SAFETY: initialised above (zeroed, then written).
        let u = unsafe { u.assume_init() };
        Duration::new(u.ru_utime.tv_sec as u64, u.ru_utime.tv_usec as u32 * 1000)
            + Duration::new(u.ru_stime.tv_sec as u64, u.ru_stime.tv_usec as u32 * 1000)
    };
    let before = cpu();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu() - before;
    assert!(used < Duration::from_millis(300), "the server thread spun: {used:?} of CPU in 1 s");
    drop(held);
    println!("EMFILE CHILD OK ({used:?} of CPU in 1 s)");
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let s = server(ServerOptions::default());
    let err = MetricsServer::start(s.local_addr()).unwrap_err();
    let ServerError::Bind { addr, source } = &err else { panic!("{err:?}") };
    assert_eq!(*addr, s.local_addr());
    assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
    assert!(err.to_string().starts_with(&format!("metrics server: cannot listen on {}: ", s.local_addr())), "{err}");
    assert!(matches!(MetricsServer::start("no-such-host.invalid:1"), Err(ServerError::Resolve { .. })));
}

#[test]
fn dropping_the_handle_stops_the_server() {
    let s = server(ServerOptions::default());
    let addr = s.local_addr();
    assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200"));
    drop(s);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "still listening after drop");
    assert_eq!(MetricsServer::DEFAULT_ADDR, "127.0.0.1:9464");
}
