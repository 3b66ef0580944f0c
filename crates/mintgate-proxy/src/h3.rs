//! The HTTP/3 front end: quinn (QUIC) + h3, the same [`Proxy::handle`] as
//! HTTP/1.1 and HTTP/2.
//!
//! 0-RTT: every connection is taken as 0.5-RTT (`into_0rtt`, which always
//! succeeds on a server), so requests a returning client sent as early data
//! are read before the handshake completes. A request counts as early data
//! when, once its head has been read, the handshake has not completed yet.
//! Such requests may only use safe methods (GET, HEAD, OPTIONS); others are
//! answered 425 Too Early and the client retries after the handshake
//! (RFC 8470). A request read after the handshake completed is processed
//! whatever its method, even if its bytes came as early data: the completed
//! handshake (the client's Finished) proves the connection is not a replay.
//!
//! Limits: at most `max_connections` connections in all and
//! `max_connections_per_source` per source (more are refused), the HTTP/3
//! settings exchange, each request head and then its body within
//! `header_timeout` (the stream is dropped otherwise), 100
//! concurrent request streams per connection, an idle connection closes
//! after `idle_timeout`, bodies above `max_body` get 413.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use http::{Response, StatusCode};
use quinn::crypto::rustls::QuicServerConfig;

use crate::config::ProxyConfig;
use crate::limits::ConnCounter;
use crate::mapping::ProxyError;
use crate::service::{ClientInfo, Proxy};
use crate::tls::{self, ServerCert};

/// The quinn server configuration for `cfg`'s TLS settings and limits.
pub fn server_config(cfg: &ProxyConfig, cert: &ServerCert) -> anyhow::Result<quinn::ServerConfig> {
    let tls = tls::server_config(&cfg.tls, cert)?;
    let quic =
        QuicServerConfig::try_from(tls).context("the TLS configuration does not suit QUIC")?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(100u32.into())
        .max_concurrent_uni_streams(16u32.into());
    if let Ok(idle) = quinn::IdleTimeout::try_from(cfg.idle_timeout) {
        t.max_idle_timeout(Some(idle));
    }
    sc.transport_config(Arc::new(t));
    Ok(sc)
}

/// Creates the QUIC endpoint on an already bound UDP socket (must be
/// called inside a tokio runtime).
pub fn endpoint(
    socket: std::net::UdpSocket,
    sc: quinn::ServerConfig,
) -> anyhow::Result<quinn::Endpoint> {
    let runtime = quinn::default_runtime().context("no async runtime for QUIC")?;
    quinn::Endpoint::new(quinn::EndpointConfig::default(), Some(sc), socket, runtime)
        .context("creating the QUIC endpoint")
}

/// Serves HTTP/3 on `endpoint` until it is closed.
pub async fn serve(endpoint: quinn::Endpoint, proxy: Arc<Proxy>) {
    let cfg = proxy.config();
    let counter = ConnCounter::new(cfg.max_connections_per_source, cfg.max_connections);
    let header_timeout = cfg.header_timeout;
    while let Some(incoming) = endpoint.accept().await {
        // Per source as well as in all, so that one host cannot take every
        // slot. (A source address is only proven once the handshake
        // completes; before, the total cap is what holds.)
        let Ok(slot) = counter.try_open(incoming.remote_address().ip()) else {
            incoming.refuse();
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            // The handshake and the HTTP/3 settings exchange must be done
            // within the header timeout; afterwards QUIC's idle timeout holds.
            if let Err(e) = connection(incoming, proxy, header_timeout).await {
                tracing::debug!(error = %e, "h3 connection");
            }
            drop(slot);
        });
    }
}

async fn connection(
    incoming: quinn::Incoming,
    proxy: Arc<Proxy>,
    header_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let peer = incoming.remote_address();
    let connecting = incoming.accept()?;
    let (conn, handshake) = match connecting.into_0rtt() {
        Ok((c, done)) => (c, done.map(|_| ()).boxed().shared()),
        // Not reached on a server (into_0rtt always succeeds there); kept
        // for safety: wait for the full handshake.
        Err(connecting) => (
            connecting.await?,
            futures_util::future::ready(()).boxed().shared(),
        ),
    };
    let mut h3c: h3::server::Connection<h3_quinn::Connection, Bytes> = tokio::time::timeout(
        header_timeout,
        h3::server::Connection::new(h3_quinn::Connection::new(conn)),
    )
    .await
    .context("no HTTP/3 settings within the header timeout")??;
    loop {
        match h3c.accept().await {
            Ok(Some(resolver)) => {
                let proxy = proxy.clone();
                let handshake = handshake.clone();
                tokio::spawn(async move {
                    if let Err(e) = request(resolver, peer, handshake, proxy).await {
                        tracing::debug!(error = %e, "h3 request");
                    }
                });
            }
            Ok(None) => return Ok(()),
            Err(e) => {
                if e.is_h3_no_error() {
                    return Ok(());
                }
                return Err(e.into());
            }
        }
    }
}

type Shared = futures_util::future::Shared<futures_util::future::BoxFuture<'static, ()>>;

async fn request(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    peer: SocketAddr,
    handshake: Shared,
    proxy: Arc<Proxy>,
) -> anyhow::Result<()> {
    // a request head, and then its body, within the header timeout each
    let head_timeout = proxy.config().header_timeout;
    let (req, mut stream) = tokio::time::timeout(head_timeout, resolver.resolve_request())
        .await
        .context("no request head within the header timeout")??;
    let early_data = if proxy.config().tls.client_ca.is_some() {
        // Mutual TLS: nothing is served before the client's certificate has
        // been verified, which happens when the handshake completes.
        handshake.await;
        false
    } else {
        // Polled once: done if the handshake has completed by now.
        handshake.now_or_never().is_none()
    };
    let max = proxy.config().max_body;
    let mut body = BytesMut::new();
    let mut too_large = false;
    let body_deadline = tokio::time::Instant::now() + head_timeout;
    while let Some(mut chunk) = tokio::time::timeout_at(body_deadline, stream.recv_data())
        .await
        .context("the request body did not arrive within the header timeout")??
    {
        if body.len() + chunk.remaining() > max {
            too_large = true;
            break;
        }
        while chunk.has_remaining() {
            let c = chunk.chunk();
            body.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    let resp: Response<Bytes> = if too_large {
        ProxyError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over {max} bytes"),
        )
        .to_response()
    } else {
        proxy
            .handle(
                ClientInfo {
                    addr: peer.ip(),
                    early_data,
                },
                req.method(),
                req.uri(),
                req.headers(),
                body.freeze(),
            )
            .await
    };
    let (parts, body) = resp.into_parts();
    stream
        .send_response(Response::from_parts(parts, ()))
        .await?;
    if !body.is_empty() {
        stream.send_data(body).await?;
    }
    stream.finish().await?;
    Ok(())
}
