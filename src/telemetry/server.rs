//! [`MetricsServer`]: `GET /metrics` on a background thread (hyper 1 on a private tokio
//! runtime, so no async runtime is forced on the caller), stopped when its handle is dropped.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::telemetry::AllocatorCollector;

/// Prometheus' text exposition format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4";

/// Longest any of the server's timeouts may be; longer values are cut to this.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// How long a connection past its `connection_timeout` may take to finish the request it is in.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The pause after a failed `accept` (such as EMFILE, too many open files), doubled up to 1 s
/// while failures repeat, so that the server thread does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Limits of a [`MetricsServer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// Connections served at once (default 64). When a new one arrives at the cap, one open
    /// connection is closed to make room: the oldest that has not yet sent a whole request head
    /// (a stalled or silent client), else the one kept alive idle the longest (it has had its
    /// answers and waits for nothing). Only when every connection is in the middle of a request
    /// is the new one closed.
    pub max_connections: usize,
    /// A client must send each request head within this time (default 5 s).
    pub header_read_timeout: Duration,
    /// Largest request head accepted; larger ones get 431 (default 16 KiB, at least 8 KiB).
    pub max_request_bytes: usize,
    /// How long a connection may stay open (default 30 s); then it finishes the request it is
    /// serving (up to 5 s more) and closes.
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

impl ServerOptions {
    /// The options as the server uses them: timeouts cut to 24 hours (a timer cannot run past
    /// the end of time: `Duration::MAX` would overflow), at least one connection.
    fn sanitized(self) -> Self {
        Self {
            max_connections: self.max_connections.max(1),
            header_read_timeout: self.header_read_timeout.min(MAX_TIMEOUT),
            max_request_bytes: self.max_request_bytes.max(8192),
            connection_timeout: self.connection_timeout.min(MAX_TIMEOUT),
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

/// What a [`MetricsServer`] serves.
enum Metrics {
    Collector(AllocatorCollector),
    Registry(prometheus::Registry),
}

impl Metrics {
    fn render(&self) -> String {
        match self {
            Metrics::Collector(c) => c.render(),
            Metrics::Registry(r) => prometheus::TextEncoder::new().encode_to_string(&r.gather()).unwrap_or_default(),
        }
    }
}

/// Serves metrics at `GET /metrics` from a background thread: an [`AllocatorCollector`], or a
/// whole `prometheus::Registry` with the engine's own metrics beside the allocators'
/// ([`start_registry`](Self::start_registry)).
///
/// Other paths get 404, other methods 405, malformed requests 400 (oversized heads 431), all
/// with `Content-Type: text/plain; version=0.0.4` on success. Each connection is served on its
/// own task and the exposition is rendered on a blocking thread, so neither a slow client nor a
/// slow `stats()` delays accepting and serving others. At the connection cap a stalled client
/// (one that has not sent a whole request head), else the longest idle kept-alive one, makes
/// room for the newcomer; a client that does not send its head in time is disconnected; a
/// failed `accept` pauses before the next. The server stops when the handle is dropped.
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
        Self::spawn(addr, Metrics::Collector(collector), options)
    }

    /// Serves everything gathered by `registry` (a `prometheus::Registry`, the version
    /// re-exported as [`tensormem::prometheus`](crate::prometheus)) on `addr`: register an
    /// [`AllocatorCollector`] in it beside the engine's own metrics.
    ///
    /// ```
    /// use tensormem::prometheus::{IntCounter, Registry};
    /// use tensormem::telemetry::{AllocatorCollector, MetricsServer, ServerOptions};
    ///
    /// let registry = Registry::new();
    /// registry.register(Box::new(AllocatorCollector::global()))?;
    /// let requests = IntCounter::new("engine_requests_total", "Requests served.")?;
    /// registry.register(Box::new(requests.clone()))?;
    /// requests.inc();
    /// let server = MetricsServer::start_registry("127.0.0.1:0", registry, ServerOptions::default())?;
    /// # let _ = server;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_registry(
        addr: impl ToSocketAddrs + fmt::Debug,
        registry: prometheus::Registry,
        options: ServerOptions,
    ) -> Result<Self, ServerError> {
        Self::spawn(addr, Metrics::Registry(registry), options)
    }

    fn spawn(
        addr: impl ToSocketAddrs + fmt::Debug,
        metrics: Metrics,
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
        let metrics = Arc::new(metrics);
        let options = options.sanitized();
        let thread = std::thread::Builder::new()
            .name("tensormem-metrics".to_owned())
            .spawn(move || runtime.block_on(serve(listener, metrics, options, stop)))
            .map_err(ServerError::Runtime)?;
        tracing::info!(addr = %local, "metrics server: serving /metrics");
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

/// What an open connection is doing, in one word: [`STALLED`] until its first request head is
/// in, [`BUSY`] while a request is being answered, otherwise the tick at which it became idle
/// (between [`STALLED`] and [`BUSY`], so the smallest is the longest idle).
type ConnState = Arc<AtomicU64>;
/// No whole request head yet: a silent or slowloris client.
const STALLED: u64 = 0;
/// A request is being answered (from its head until its body is written or dropped).
const BUSY: u64 = u64::MAX;

/// One open connection.
struct Conn {
    id: u64,
    state: ConnState,
    abort: AbortHandle,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Conns {
    next_id: u64,
    open: VecDeque<Conn>,
}

impl Conns {
    /// The connection to close for a newcomer at the cap: the oldest stalled one, else the
    /// longest idle one; `None` when every connection is answering a request.
    fn victim(&self) -> Option<usize> {
        if let Some(i) = self.open.iter().position(|c| c.state.load(Relaxed) == STALLED) {
            return Some(i);
        }
        self.open
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((c.state.load(Relaxed), i)).filter(|&(s, _)| s != BUSY))
            .min()
            .map(|(_, i)| i)
    }
}

/// Ticks for idle-since stamps: strictly between [`STALLED`] and [`BUSY`].
static IDLE_TICK: AtomicU64 = AtomicU64::new(1);

/// A response body that marks its connection idle when it is dropped: hyper drops it once the
/// body is written (or the connection failed), so the connection then waits for nothing.
struct TrackedBody {
    inner: Full<Bytes>,
    state: ConnState,
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        self.state.store(IDLE_TICK.fetch_add(1, Relaxed).min(BUSY - 1), Relaxed);
    }
}

async fn serve(listener: TcpListener, metrics: Arc<Metrics>, options: ServerOptions, mut stop: oneshot::Receiver<()>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    let conns = Arc::new(Mutex::new(Conns::default()));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(options.max_request_bytes);
    let http = Arc::new(http);
    let mut backoff = ACCEPT_BACKOFF;
    loop {
        let stream = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = ACCEPT_BACKOFF;
                    stream
                }
                Err(error) => {
                    tracing::warn!(%error, pause = ?backoff, "metrics server: accept failed");
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        // The lock is held until the task is spawned and listed: the task cannot run (and
        // unlist itself) before that on this single-threaded runtime.
        let mut open = conns.lock();
        if open.open.len() >= options.max_connections {
            match open.victim() {
                Some(i) => {
                    if let Some(evicted) = open.open.remove(i) {
                        evicted.abort.abort();
                    }
                }
                // Every connection is answering a request: refuse the newcomer.
                None => continue,
            }
        }
        let id = open.next_id;
        open.next_id += 1;
        let state = Arc::new(AtomicU64::new(STALLED));
        let task =
            tokio::spawn(connection(stream, Arc::clone(&http), Arc::clone(&metrics), Arc::clone(&state), options, {
                let conns = Arc::clone(&conns);
                move || conns.lock().open.retain(|c| c.id != id)
            }));
        open.open.push_back(Conn { id, state, abort: task.abort_handle() });
    }
}

/// Serves one connection until the client closes it, it times out, or it is evicted.
async fn connection(
    stream: tokio::net::TcpStream,
    http: Arc<http1::Builder>,
    metrics: Arc<Metrics>,
    state: ConnState,
    options: ServerOptions,
    done: impl FnOnce(),
) {
    let service = service_fn(move |req| {
        state.store(BUSY, Relaxed);
        let metrics = Arc::clone(&metrics);
        let state = Arc::clone(&state);
        async move {
            let response = respond(req, metrics).await;
            Ok::<_, Infallible>(response.map(|inner| TrackedBody { inner, state }))
        }
    });
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = tokio::time::sleep(options.connection_timeout) => {
            // Finish the request in flight (if any), then close.
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
        }
    }
    done();
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
    r
}

async fn respond(req: Request<Incoming>, metrics: Arc<Metrics>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, format!("not found: {} (metrics are at /metrics)\n", req.uri().path()));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, format!("method {} not allowed; use GET\n", req.method()));
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    // Off the I/O thread: an allocator's slow `stats()` delays this answer only.
    match tokio::task::spawn_blocking(move || metrics.render()).await {
        Ok(body) => text(StatusCode::OK, body),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "rendering the metrics failed\n".to_owned()),
    }
}
