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
    let s = server(ServerOptions { header_read_timeout: Duration::from_millis(500), ..ServerOptions::default() });
    let addr = s.local_addr();
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /metr").unwrap();
    for _ in 0..5 {
        let start = Instant::now();
        assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
        assert!(start.elapsed() < Duration::from_millis(400), "a scrape waited for the stalled client");
    }
    // The stalled client is disconnected once its head is overdue.
    stalled.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let start = Instant::now();
    let _ = stalled.read_to_end(&mut buf);
    assert!(start.elapsed() < Duration::from_secs(4), "the stalled connection was kept open");
}

#[test]
fn connections_beyond_the_cap_are_closed_until_slots_free_up() {
    let s = server(ServerOptions {
        max_connections: 2,
        header_read_timeout: Duration::from_millis(600),
        ..ServerOptions::default()
    });
    let addr = s.local_addr();
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    // Both slots are taken by idle clients: the third connection is closed without an answer.
    assert_eq!(get(addr, "/metrics"), "");
    // Once the idle ones time out, scrapes are served again.
    std::thread::sleep(Duration::from_millis(900));
    assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
    drop(idle);
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
