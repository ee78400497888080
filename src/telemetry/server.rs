//! [`MetricsServer`]: `GET /metrics` on a background thread (hyper 1 on a private tokio
//! runtime, so no async runtime is forced on the caller), stopped when its handle is dropped.

use std::convert::Infallible;
use std::fmt;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot};

use crate::telemetry::AllocatorCollector;

/// Prometheus' text exposition format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4";

/// Limits of a [`MetricsServer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// Connections served at once; further ones are closed at once (default 64).
    pub max_connections: usize,
    /// A client must send its whole request head within this time (default 5 s).
    pub header_read_timeout: Duration,
    /// Largest request head accepted; larger ones get 431 (default 16 KiB, at least 8 KiB).
    pub max_request_bytes: usize,
    /// Longest a connection may stay open (default 30 s).
    pub connection_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(5),
            max_request_bytes: 16 << 10,
            connection_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The address does not resolve.
    #[error("metrics server: cannot resolve address {addr}: {source}")]
    Resolve {
        /// The address as given (its `Debug` form).
        addr: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The address cannot be bound (for example, the port is in use).
    #[error("metrics server: cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's error (e.g. "Address already in use").
        source: std::io::Error,
    },
    /// The background runtime could not be started.
    #[error("metrics server: cannot start its background thread: {0}")]
    Runtime(std::io::Error),
}

/// Serves the [`AllocatorCollector`]'s exposition at `GET /metrics` from a background thread.
///
/// Other paths get 404, other methods 405, malformed requests 400 (oversized heads 431), all
/// with `Content-Type: text/plain; version=0.0.4` on success. Each connection is served on its
/// own task, so a slow or stalled client delays nobody else; connections are capped, and a client
/// that does not send its request head in time is disconnected. The server stops when the
/// handle is dropped.
///
/// ```
/// use std::io::{Read, Write};
/// use tensormem::telemetry::MetricsServer;
///
/// let server = MetricsServer::start("127.0.0.1:0")?; // 0: any free port, for the example
/// let mut conn = std::net::TcpStream::connect(server.local_addr())?;
/// conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
/// let mut response = String::new();
/// conn.read_to_string(&mut response)?;
/// assert!(response.starts_with("HTTP/1.1 200 OK"));
/// assert!(response.contains("content-type: text/plain; version=0.0.4"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MetricsServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Prometheus' customary port for a process exporter, on loopback only: listening on other
    /// interfaces must be asked for explicitly.
    pub const DEFAULT_ADDR: &'static str = "127.0.0.1:9464";

    /// Serves the global registry's metrics on `addr` with the default limits.
    ///
    /// # Errors
    /// [`ServerError::Bind`] when the address is taken, [`ServerError::Resolve`],
    /// [`ServerError::Runtime`].
    pub fn start(addr: impl ToSocketAddrs + fmt::Debug) -> Result<Self, ServerError> {
        Self::start_with(addr, AllocatorCollector::global(), ServerOptions::default())
    }

    /// Serves the global registry's metrics on [`DEFAULT_ADDR`](Self::DEFAULT_ADDR).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_default() -> Result<Self, ServerError> {
        Self::start(Self::DEFAULT_ADDR)
    }

    /// Serves `collector` on `addr` with `options`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with(
        addr: impl ToSocketAddrs + fmt::Debug,
        collector: AllocatorCollector,
        options: ServerOptions,
    ) -> Result<Self, ServerError> {
        let shown = format!("{addr:?}");
        let resolved = addr
            .to_socket_addrs()
            .and_then(|mut a| a.next().ok_or_else(|| std::io::Error::other("no address")))
            .map_err(|source| ServerError::Resolve { addr: shown, source })?;
        let listener = TcpListener::bind(resolved).map_err(|source| ServerError::Bind { addr: resolved, source })?;
        let local = listener.local_addr().map_err(|source| ServerError::Bind { addr: resolved, source })?;
        listener.set_nonblocking(true).map_err(|source| ServerError::Bind { addr: resolved, source })?;
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ServerError::Runtime)?;
        let (shutdown, stop) = oneshot::channel();
        let collector = Arc::new(collector);
        let thread = std::thread::Builder::new()
            .name("tensormem-metrics".to_owned())
            .spawn(move || runtime.block_on(serve(listener, collector, options, stop)))
            .map_err(ServerError::Runtime)?;
        Ok(Self { addr: local, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// The address it listens on (with the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish()
    }
}

async fn serve(
    listener: TcpListener,
    collector: Arc<AllocatorCollector>,
    options: ServerOptions,
    mut stop: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.max_request_bytes.max(8192));
    let http = Arc::new(http);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        // Over the cap: close at once rather than queue.
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else { continue };
        let (collector, http) = (Arc::clone(&collector), Arc::clone(&http));
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let collector = Arc::clone(&collector);
                async move { Ok::<_, Infallible>(respond(&req, &collector)) }
            });
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(options.connection_timeout, conn).await;
            drop(permit);
        });
    }
}

fn respond(req: &Request<Incoming>, collector: &AllocatorCollector) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
        r
    };
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, format!("not found: {} (metrics are at /metrics)\n", req.uri().path()));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, format!("method {} not allowed; use GET\n", req.method()));
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    text(StatusCode::OK, collector.render())
}
