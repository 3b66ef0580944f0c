//! mintgate's proxies from HTTP/1.1, HTTP/2 and HTTP/3 (QUIC) to CoAP
//! (RFC 8075; paper 002's QUIC proxy).
//!
//! - [`mapping`]: the HTTP <-> CoAP mapping as pure functions.
//! - [`cache`]: the Max-Age cache with ETag revalidation.
//! - [`upstream`]: the async CoAP client (one socket, one task, the sans-IO
//!   client of `mintgate-coap` with the configured congestion controller,
//!   NSTART per upstream).
//! - [`limits`]: per-client rate limits and bearer tokens.
//! - [`service`]: [`Proxy`], the request path shared by every front end.
//! - [`server`]: the axum router and the HTTP/1.1 + HTTP/2 listener.
//! - [`h3`]: the HTTP/3 listener (quinn + h3), 0-RTT with replay limits.
//! - [`tls`]: certificates (configured or self-signed) and rustls configs.
//! - [`client`]: HTTP/1.1, HTTP/2 and HTTP/3 clients (`mintgate http`, the lab).
//!
//! [`ProxyServer`] runs the front ends and the upstream client on a tokio
//! runtime of their own, so that they never compete with the CoAP
//! pipeline's threads for a worker. This crate does not depend on the
//! gateway: the CLI wires the two.

// Input comes off the network: no panic may be reachable from it.

pub mod cache;
pub mod client;
pub mod config;
pub mod h3;
pub mod health;
pub mod limits;
pub mod mapping;
pub mod section;
pub mod server;
pub mod service;
pub mod tls;
pub mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

pub use config::{Listen, ProxyConfig, TlsConfig, WriteAuth};
pub use server::router;
pub use service::{ClientInfo, Proxy};
/// Re-exported for users of [`client`] and [`service`] (same versions).
pub use {bytes, http, tokio};

/// Sockets for a [`ProxyServer`], bound by the caller (e.g. inside a
/// network namespace). Listeners must be non-blocking.
#[derive(Default)]
pub struct Sockets {
    /// HTTP/1.1 and HTTP/2 listener.
    pub http: Option<std::net::TcpListener>,
    /// HTTP/3 (QUIC) socket.
    pub h3: Option<std::net::UdpSocket>,
    /// The upstream CoAP client's socket (default: a new dual-stack one).
    pub upstream: Option<std::net::UdpSocket>,
    /// Where the HTTP listener hands CoAP over WebSockets upgrades
    /// (`GET /.well-known/coap`); without it they are the proxy's (404).
    pub ws_handoff: Option<server::Handoff>,
}

impl Sockets {
    /// Binds the addresses of `listen`.
    pub fn bind(listen: &Listen) -> anyhow::Result<Sockets> {
        let http = match listen.http {
            Some(a) => {
                let l = std::net::TcpListener::bind(a)
                    .with_context(|| format!("binding the HTTP listener to tcp {a}"))?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        let h3 = match listen.h3 {
            Some(a) => {
                let s = std::net::UdpSocket::bind(a)
                    .with_context(|| format!("binding the HTTP/3 listener to udp {a}"))?;
                s.set_nonblocking(true)?;
                Some(s)
            }
            None => None,
        };
        Ok(Sockets {
            http,
            h3,
            upstream: None,
            ws_handoff: None,
        })
    }
}

/// The running proxy front ends; dropping it stops them.
pub struct ProxyServer {
    proxy: Arc<Proxy>,
    conn_stats: Arc<server::ConnStats>,
    upstream_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    h3_addr: Option<SocketAddr>,
    cert: Option<(PathBuf, bool)>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    endpoint: Option<quinn::Endpoint>,
    rt: Option<tokio::runtime::Runtime>,
}

impl ProxyServer {
    /// Validates `cfg`, binds `listen` and starts serving on `threads`
    /// runtime workers.
    pub fn start(cfg: ProxyConfig, listen: &Listen, threads: usize) -> anyhow::Result<ProxyServer> {
        Self::start_with(cfg, Sockets::bind(listen)?, threads, None)
    }

    /// The same on sockets the caller bound; `extra` routes (e.g. a
    /// dashboard) are served beside the proxy's on the HTTP listener.
    pub fn start_with(
        cfg: ProxyConfig,
        sockets: Sockets,
        threads: usize,
        extra: Option<axum::Router>,
    ) -> anyhow::Result<ProxyServer> {
        cfg.validate()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("proxy")
            .enable_all()
            .build()
            .context("starting the proxy's runtime")?;
        let _guard = rt.enter();
        let ucfg = upstream::UpstreamConfig {
            algorithm: cfg.congestion,
            nstart: cfg.nstart,
            max_inflight: cfg.max_inflight,
            max_queue_per_upstream: cfg.max_queue_per_upstream,
            separate_timeout: cfg.request_timeout,
            seed: rand::random(),
            block: upstream::block_config(),
            oscore: cfg.upstream_oscore.clone(),
        };
        let up = match sockets.upstream {
            Some(s) => upstream::Upstream::start_with(ucfg, s),
            None => upstream::Upstream::start(ucfg),
        }
        .context("binding the upstream CoAP socket")?;
        let upstream_addr = Some(up.local_addr());
        let proxy = Proxy::new(cfg.clone(), up);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut http_addr = None;
        let conn_stats = Arc::new(server::ConnStats::default());
        if let Some(l) = sockets.http {
            let l = tokio::net::TcpListener::from_std(l).context("the HTTP listener")?;
            http_addr = Some(l.local_addr()?);
            let mut app = router(proxy.clone());
            if let Some(extra) = extra {
                app = app.merge(extra);
            }
            let mut stopped = stopped.clone();
            rt.spawn(server::serve_counted(
                l,
                app,
                server::ConnLimits::from(&cfg),
                conn_stats.clone(),
                sockets.ws_handoff.clone(),
                async move {
                    let _ = stopped.wait_for(|s| *s).await;
                },
            ));
        }
        let mut h3_addr = None;
        let mut cert = None;
        let mut endpoint = None;
        if let Some(s) = sockets.h3 {
            let c = tls::load_or_generate(&cfg.tls)?;
            cert = Some((c.cert_path.clone(), c.generated));
            let sc = h3::server_config(&cfg, &c)?;
            let ep = h3::endpoint(s, sc)?;
            h3_addr = Some(ep.local_addr()?);
            rt.spawn(h3::serve(ep.clone(), proxy.clone()));
            endpoint = Some(ep);
        }
        drop(_guard);
        Ok(ProxyServer {
            proxy,
            conn_stats,
            upstream_addr,
            http_addr,
            h3_addr,
            cert,
            stop: Some(stop),
            endpoint,
            rt: Some(rt),
        })
    }

    /// The HTTP/1.1 + HTTP/2 address, when serving it.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The HTTP/1.1 + HTTP/2 listener's connection counters.
    pub fn conn_stats(&self) -> &Arc<server::ConnStats> {
        &self.conn_stats
    }

    /// The local address of the upstream CoAP client's socket: requests
    /// the proxy sends upstream come from it (a gateway serving the proxy
    /// in its own process takes them as the proxy's, not as loopback).
    pub fn upstream_addr(&self) -> Option<SocketAddr> {
        self.upstream_addr
    }

    /// The HTTP/3 address, when serving it.
    pub fn h3_addr(&self) -> Option<SocketAddr> {
        self.h3_addr
    }

    /// The HTTP/3 certificate file, and whether it was generated now.
    pub fn cert(&self) -> Option<(&std::path::Path, bool)> {
        self.cert.as_ref().map(|(p, g)| (p.as_path(), *g))
    }

    /// The proxy (configuration, counters).
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(ep) = self.endpoint.take() {
            ep.close(0u32.into(), b"shutting down");
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
