//! The HTTP/1.1 and HTTP/2 front end: an axum [`Router`] with the proxy's
//! routes, and a hyper accept loop that serves it (HTTP/1.1, and HTTP/2
//! with prior knowledge, on the same cleartext port).
//!
//! The routes are `/hc/{*target}` and, for each reverse mapping,
//! `{prefix}` and `{prefix}/{*rest}`: nothing else, so the router can be
//! merged with other routes (a dashboard at `/`) on one listener.
//!
//! Limits: at most `max_connections` connections (more are closed on
//! accept), a connection must start sending within `header_timeout` and an
//! HTTP/1.1 request head must be complete within it,
//! HTTP/2 connections are pinged every `idle_timeout / 2` and closed when
//! a ping goes unanswered, request bodies above `max_body` get 413 (by
//! Content-Length before reading, or while reading).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::routing::any;
use axum::Router;
use http::{header, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

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
    let body = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(_) => return too_large(max),
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
    /// HTTP/1.1 request-head timeout.
    pub header_timeout: std::time::Duration,
    /// HTTP/2 keep-alive ping interval is half of this.
    pub idle_timeout: std::time::Duration,
}

impl From<&crate::config::ProxyConfig> for ConnLimits {
    fn from(c: &crate::config::ProxyConfig) -> ConnLimits {
        ConnLimits {
            max_connections: c.max_connections,
            header_timeout: c.header_timeout,
            idle_timeout: c.idle_timeout,
        }
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
    let sem = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
        .keep_alive_interval(limits.idle_timeout / 2)
        .keep_alive_timeout(limits.idle_timeout / 2);
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
        let Ok(permit) = sem.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "connection limit reached; closing");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let b = builder.clone();
        tokio::spawn(async move {
            // A client must start its request within the header timeout:
            // hyper's own timer starts only once bytes arrive (and telling
            // HTTP/1.1 from HTTP/2 waits for them too), so a silent
            // connection would otherwise hold its slot for ever.
            let mut first = [0u8; 1];
            if tokio::time::timeout(limits.header_timeout, stream.peek(&mut first))
                .await
                .is_err()
            {
                tracing::debug!(%peer, "no request within the header timeout; closing");
                drop(permit);
                return;
            }
            let svc =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    app.clone().oneshot(req.map(Body::new))
                });
            if let Err(e) = b.serve_connection(TokioIo::new(stream), svc).await {
                tracing::debug!(%peer, error = %e, "http connection");
            }
            drop(permit);
        });
    }
}
