//! The HTTP/1.1 and HTTP/2 front end: an axum [`Router`] with the proxy's
//! routes, and a hyper accept loop that serves it (HTTP/1.1, and HTTP/2
//! with prior knowledge, on the same cleartext port).
//!
//! The routes are `/hc/{*target}` and, for each reverse mapping,
//! `{prefix}` and `{prefix}/{*rest}`: nothing else, so the router can be
//! merged with other routes (a dashboard at `/`) on one listener.
//!
//! Limits: at most `max_connections` connections in all and
//! `max_connections_per_source` per source (IPv4 address, IPv6 /64; more
//! are reset on accept, so one host cannot take every slot); a new
//! connection must deliver its first request head (after the HTTP/2
//! preface, for HTTP/2) within `header_timeout`, every later HTTP/1.1
//! request head must be complete within it once begun, and a request body
//! within it once its head is in (408); a connection with no request in
//! flight for `idle_timeout` is closed (HTTP/2 with GOAWAY; HTTP/2 is also
//! pinged every `idle_timeout / 2` and closed when a ping goes unanswered
//! for `idle_timeout`);
//! request bodies above `max_body` get 413 (by Content-Length before
//! reading, or while reading).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::routing::any;
use axum::Router;
use http::{header, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::net::TcpListener;
use tower::ServiceExt as _;

use crate::limits::{ConnCounter, ConnRefused};
use crate::mapping::ProxyError;
use crate::service::{ClientInfo, Proxy};

/// The proxy's routes as an axum router (state applied), for serving alone
/// or merging with other routes. Rate limits key on the peer address from
/// `ConnectInfo<SocketAddr>`; without it (a server that does not provide
/// it) all clients share one limit.
pub fn router(proxy: Arc<Proxy>) -> Router {
    let mut r = Router::new().route("/hc/{*target}", any(handle));
    for m in &proxy.config().reverse {
        r = r
            .route(&m.prefix, any(handle))
            .route(&format!("{}/{{*rest}}", m.prefix), any(handle));
    }
    r.with_state(proxy)
}

async fn handle(State(proxy): State<Arc<Proxy>>, req: Request) -> Response<Body> {
    let addr = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let (parts, body) = req.into_parts();
    let max = proxy.config().max_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large(max);
    }
    let body_timeout = parts
        .extensions
        .get::<BodyTimeout>()
        .map(|t| t.0)
        .unwrap_or(proxy.config().header_timeout);
    let body = match tokio::time::timeout(body_timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(max),
        Err(_) => {
            return ProxyError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} ms",
                    body_timeout.as_millis()
                ),
            )
            .to_response()
            .map(Body::from)
        }
    };
    let resp = proxy
        .handle(
            ClientInfo {
                addr,
                early_data: false,
            },
            &parts.method,
            &parts.uri,
            &parts.headers,
            body,
        )
        .await;
    resp.map(Body::from)
}

fn too_large(max: usize) -> Response<Body> {
    ProxyError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is over {max} bytes"),
    )
    .to_response()
    .map(Body::from)
}

/// Connection limits of the HTTP/1.1 and HTTP/2 listener.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections served at once per source (IPv4 address, IPv6 /64).
    pub max_connections_per_source: usize,
    /// A new connection must have sent its first request head (HTTP/1.1),
    /// or its HTTP/2 preface and first request head, within this; so must
    /// every later HTTP/1.1 request head once it has begun, and a request
    /// body once its head is in.
    pub header_timeout: std::time::Duration,
    /// A connection with no request in flight and none finished for this
    /// long is closed (HTTP/1.1 keep-alive, HTTP/2); HTTP/2 is also pinged
    /// every half of it.
    pub idle_timeout: std::time::Duration,
}

impl From<&crate::config::ProxyConfig> for ConnLimits {
    fn from(c: &crate::config::ProxyConfig) -> ConnLimits {
        ConnLimits {
            max_connections: c.max_connections,
            max_connections_per_source: c.max_connections_per_source,
            header_timeout: c.header_timeout,
            idle_timeout: c.idle_timeout,
        }
    }
}

/// Counters of one listener's connections.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Connections accepted and served.
    pub accepted: AtomicU64,
    /// Closed on accept: the source had `max_connections_per_source` open.
    pub refused_per_source: AtomicU64,
    /// Closed on accept: `max_connections` were open.
    pub refused_total: AtomicU64,
    /// Closed because the first request (or the HTTP/2 preface) did not
    /// arrive within the header timeout.
    pub header_timeouts: AtomicU64,
    /// Closed after the idle timeout.
    pub idle_closed: AtomicU64,
    /// Open now.
    pub open: AtomicU64,
    /// Handed to another server ([`Handoff`]: CoAP over WebSockets).
    pub handed_off: AtomicU64,
}

/// Connections the HTTP listener hands to another server: those whose first
/// request is `GET` of [`COAP_WS_PATH`], a CoAP over WebSockets upgrade
/// (RFC 8323 4), go to `to` with their bytes still unread (the CoAP server
/// does the upgrade and applies its own bounds), so `coap+ws` shares the
/// HTTP port. Any other connection is the proxy's as before; telling them
/// apart costs a `peek` of the first bytes, waited for at most the header
/// timeout.
#[derive(Clone)]
pub struct Handoff {
    /// Takes the connection and its peer; false when it refused it (the
    /// connection is then closed).
    pub to: Arc<dyn Fn(std::net::TcpStream, SocketAddr) -> bool + Send + Sync>,
}

/// The path of CoAP over WebSockets (RFC 8323 4.4).
pub const COAP_WS_PATH: &str = "/.well-known/coap";

/// Whether the first bytes on `stream` are `GET /.well-known/coap ` (read
/// without taking them), waiting for them until `deadline`: false as soon
/// as they differ, at the end of the stream, or at the deadline.
async fn is_coap_ws(stream: &tokio::net::TcpStream, deadline: tokio::time::Instant) -> bool {
    let want = format!("GET {COAP_WS_PATH} ");
    let want = want.as_bytes();
    let mut buf = [0u8; 32];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        let m = n.min(want.len());
        if n == 0 || buf[..m] != want[..m] {
            return false;
        }
        if m == want.len() {
            return true;
        }
        // the rest of the request line is on its way
        if tokio::time::timeout_at(
            deadline,
            tokio::time::sleep(std::time::Duration::from_millis(5)),
        )
        .await
        .is_err()
        {
            return false;
        }
    }
}

/// What the watchdog of one connection reads: requests started, requests in
/// flight, and when the last one ended.
struct Activity {
    start: tokio::time::Instant,
    started: AtomicU64,
    inflight: AtomicU64,
    /// Milliseconds from `start` to the end of the last request.
    last_ms: AtomicU64,
}

/// Decrements `inflight` and stamps `last_ms` when a request's future ends
/// (answered or dropped).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.last_ms
            .store(a.start.elapsed().as_millis() as u64, Relaxed);
        a.inflight.fetch_sub(1, Relaxed);
    }
}

/// Serves `app` on `listener` (HTTP/1.1 and HTTP/2 prior knowledge) until
/// `shutdown` completes. Peer addresses are given to handlers as
/// `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    serve_counted(listener, app, limits, Arc::default(), None, shutdown).await
}

/// [`serve`], counting into `stats`, handing CoAP over WebSockets to
/// `handoff` when given.
pub async fn serve_counted(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    stats: Arc<ConnStats>,
    handoff: Option<Handoff>,
    shutdown: impl Future<Output = ()>,
) {
    let counter = ConnCounter::new(limits.max_connections_per_source, limits.max_connections);
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // No read while a request is in flight: hyper's check for an early
        // EOF reserves a fresh 8 KiB read buffer per request (the request's
        // head still holds the old one), which `lab buffers` counted as a
        // per-message allocation whose size depended on timing. A client
        // that goes away is still noticed when its answer is written, and
        // every upstream exchange has its own timeout.
        .half_close(true)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        // a ping every half idle timeout, answered within the idle
        // timeout, else the peer is gone (a connection with requests in
        // flight is not idle, so this is what notices a dead one); an idle
        // connection is the watchdog's, which acts first
        .keep_alive_interval(limits.idle_timeout / 2)
        .keep_alive_timeout(limits.idle_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off a little, keep serving.
                    tracing::warn!(error = %e, "accept");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let slot = match counter.try_open(peer.ip()) {
            Ok(s) => s,
            Err(why) => {
                let c = match why {
                    ConnRefused::PerSource => &stats.refused_per_source,
                    ConnRefused::Total => &stats.refused_total,
                };
                c.fetch_add(1, Relaxed);
                tracing::debug!(%peer, ?why, "connection limit reached; closing");
                // An RST rather than a FIN: the slot and the descriptor are
                // given back at once, with no TIME_WAIT kept here.
                let _ = socket2::SockRef::from(&stream).set_linger(Some(std::time::Duration::ZERO));
                drop(stream);
                continue;
            }
        };
        stats.accepted.fetch_add(1, Relaxed);
        stats.open.fetch_add(1, Relaxed);
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let b = builder.clone();
        let stats = stats.clone();
        let handoff = handoff.clone();
        tokio::spawn(async move {
            // the header timeout counts from the accept, the peek included
            let accepted = tokio::time::Instant::now();
            if let Some(h) = handoff {
                let deadline = accepted + limits.header_timeout;
                if is_coap_ws(&stream, deadline).await {
                    stats.open.fetch_sub(1, Relaxed);
                    drop(slot);
                    match stream.into_std() {
                        Ok(s) => {
                            if (h.to)(s, peer) {
                                stats.handed_off.fetch_add(1, Relaxed);
                            }
                        }
                        Err(e) => tracing::debug!(%peer, error = %e, "handing a connection over"),
                    }
                    return;
                }
            }
            let activity = Arc::new(Activity {
                start: accepted,
                started: AtomicU64::new(0),
                inflight: AtomicU64::new(0),
                last_ms: AtomicU64::new(0),
            });
            let act = activity.clone();
            let body_timeout = limits.header_timeout;
            let svc =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    act.started.fetch_add(1, Relaxed);
                    act.inflight.fetch_add(1, Relaxed);
                    let guard = InFlight(act.clone());
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req.extensions_mut().insert(BodyTimeout(body_timeout));
                    let fut = app.clone().oneshot(req.map(Body::new));
                    async move {
                        let r = fut.await;
                        drop(guard);
                        r
                    }
                });
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let closed_by_watchdog = tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "http connection");
                    }
                    None
                }
                why = watchdog(&activity, limits) => Some(why),
            };
            match closed_by_watchdog {
                Some(Expired::FirstRequest) => {
                    stats.header_timeouts.fetch_add(1, Relaxed);
                    tracing::debug!(%peer, "no request within the header timeout; closing");
                }
                Some(Expired::Idle) => {
                    stats.idle_closed.fetch_add(1, Relaxed);
                    tracing::debug!(%peer, "idle; closing");
                    // HTTP/2 GOAWAY, HTTP/1.1 close; a peer that does not
                    // take it is dropped a moment later.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), conn.as_mut())
                        .await;
                }
                None => {}
            }
            stats.open.fetch_sub(1, Relaxed);
            drop(slot);
        });
    }
}

/// Why the watchdog ended a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expired {
    FirstRequest,
    Idle,
}

/// Completes when the connection has outstayed its welcome: no request
/// within the header timeout of the accept (this also bounds hyper's wait
/// for enough bytes to tell HTTP/1.1 from an HTTP/2 preface, and the
/// HTTP/2 preface and settings exchange), or no request in flight and none
/// ended for the idle timeout. Slow request heads after the first are
/// hyper's `header_read_timeout`.
async fn watchdog(a: &Activity, limits: ConnLimits) -> Expired {
    // Requests start and end without telling the watchdog: it looks again
    // at least this often, so a deadline is kept to within a quarter of
    // the shorter timeout.
    let step = (limits.header_timeout.min(limits.idle_timeout) / 4)
        .max(std::time::Duration::from_millis(10));
    loop {
        let deadline = if a.started.load(Relaxed) == 0 {
            a.start + limits.header_timeout
        } else if a.inflight.load(Relaxed) > 0 {
            // look again later; a request's own time is bounded elsewhere
            tokio::time::Instant::now() + step
        } else {
            a.start
                + std::time::Duration::from_millis(a.last_ms.load(Relaxed))
                + limits.idle_timeout
        };
        if tokio::time::Instant::now() >= deadline {
            return if a.started.load(Relaxed) == 0 {
                Expired::FirstRequest
            } else {
                Expired::Idle
            };
        }
        tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + step)).await;
    }
}

/// The time a handler may take to read a request body (the listener's
/// header timeout), as a request extension.
#[derive(Clone, Copy, Debug)]
pub struct BodyTimeout(pub std::time::Duration);
