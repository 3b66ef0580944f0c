//! HTTP clients for `mintgate http` and the lab: HTTP/1.1 and HTTP/2
//! (cleartext, prior knowledge) over TCP with hyper, HTTP/3 over QUIC with
//! quinn + h3, each either keeping one connection (persistent) or opening a
//! new one per request.
//!
//! HTTP/3 keeps one QUIC endpoint and one TLS session store for its life,
//! so a new connection to a server seen before resumes the TLS session and
//! sends its request as 0-RTT early data. When the server rejects the early
//! data, the request is sent again on that connection after the handshake
//! (counted in [`Exchange::early_data`] as not early).
//!
//! Every operation is bounded by [`ClientOptions::timeout`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::{Buf, Bytes};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use quinn::crypto::rustls::QuicClientConfig;
use tokio::net::TcpStream;

use crate::tls::{self, Roots};

/// Which HTTP version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    /// HTTP/1.1 over TCP.
    H1,
    /// HTTP/2 over TCP, prior knowledge (h2c).
    H2,
    /// HTTP/3 over QUIC.
    H3,
}

impl Proto {
    /// `h1`, `h2`, `h3`.
    pub fn name(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H2 => "h2",
            Proto::H3 => "h3",
        }
    }
}

/// Client settings.
#[derive(Clone)]
pub struct ClientOptions {
    /// HTTP version.
    pub proto: Proto,
    /// A new connection for every request.
    pub new_conn: bool,
    /// HTTP/3: how to check the server's certificate.
    pub roots: Roots,
    /// HTTP/3: the name the certificate must carry (and SNI).
    pub server_name: String,
    /// HTTP/3: a client certificate and key (mutual TLS).
    pub client_cert: Option<(
        Vec<rustls::pki_types::CertificateDer<'static>>,
        Arc<rustls::pki_types::PrivateKeyDer<'static>>,
    )>,
    /// Bound on connecting plus one request and its response.
    pub timeout: Duration,
}

/// One request's outcome.
#[derive(Clone, Debug)]
pub struct Exchange {
    /// Status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// Response body.
    pub body: Bytes,
    /// From before connecting (new connection) or sending (persistent) to
    /// the last byte of the body.
    pub total: Duration,
    /// Time spent establishing the connection (zero on a reused one; for
    /// 0-RTT, until the connection object exists, not the handshake).
    pub connect: Duration,
    /// A new connection was made for this request.
    pub new_connection: bool,
    /// HTTP/3: the request went as 0-RTT early data and the server accepted
    /// it.
    pub early_data: bool,
    /// HTTP/3: the request went as early data, the server answered 425 Too
    /// Early (it serves only safe methods from early data), and it was sent
    /// again once the handshake was done (RFC 8470 4.2); the status is the
    /// second answer's.
    pub too_early_retried: bool,
}

impl Exchange {
    /// The CoAP round trip the proxy reported in `Server-Timing: coap;dur=MS`.
    pub fn coap_rtt(&self) -> Option<Duration> {
        for v in self.headers.get_all("server-timing") {
            let Ok(v) = v.to_str() else { continue };
            for metric in v.split(',') {
                let mut parts = metric.split(';').map(str::trim);
                if parts.next() != Some("coap") {
                    continue;
                }
                for p in parts {
                    if let Some(d) = p.strip_prefix("dur=") {
                        if let Ok(ms) = d.parse::<f64>() {
                            if ms.is_finite() && ms >= 0.0 {
                                return Some(Duration::from_secs_f64(ms / 1e3));
                            }
                        }
                    }
                }
            }
        }
        None
    }
}

type H1Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
type H2Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;
type H3Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

enum Conn {
    None,
    H1(H1Sender),
    H2(H2Sender),
    H3(H3Sender, quinn::Connection),
}

/// A client for one server address.
pub struct HttpClient {
    opts: ClientOptions,
    addr: SocketAddr,
    conn: Conn,
    endpoint: Option<quinn::Endpoint>,
    /// HTTP/3: the TLS side of new connections (session store inside).
    quic_tls: Option<Arc<QuicClientConfig>>,
    /// HTTP/3: the smoothed RTT of the last connection, the next one's
    /// initial RTT (RFC 9002 section 6.2.2 allows it for a resumed
    /// connection over the same path), so that a lost first packet is
    /// repeated after about three RTTs rather than quinn's default ~1 s.
    last_rtt: Option<Duration>,
}

/// The QUIC transport settings of a new client connection.
fn client_transport(initial_rtt: Option<Duration>) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(quinn::IdleTimeout::try_from(Duration::from_secs(30)).ok());
    if let Some(rtt) = initial_rtt {
        t.initial_rtt(rtt.clamp(Duration::from_millis(1), Duration::from_secs(1)));
    }
    Arc::new(t)
}

impl HttpClient {
    /// A client for `addr`. HTTP/3 binds its UDP endpoint here: on
    /// `socket` when given (e.g. made in another network namespace),
    /// otherwise on an ephemeral port of the matching family. Must be
    /// called inside a tokio runtime.
    pub fn new(
        opts: ClientOptions,
        addr: SocketAddr,
        socket: Option<std::net::UdpSocket>,
    ) -> anyhow::Result<HttpClient> {
        let mut quic_tls = None;
        let endpoint = if opts.proto == Proto::H3 {
            let socket = match socket {
                Some(s) => s,
                None => {
                    let bind: SocketAddr = if addr.is_ipv4() {
                        "0.0.0.0:0".parse()?
                    } else {
                        "[::]:0".parse()?
                    };
                    std::net::UdpSocket::bind(bind).context("binding the QUIC socket")?
                }
            };
            let runtime = quinn::default_runtime().context("no async runtime for QUIC")?;
            let mut ep =
                quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, runtime)
                    .context("creating the QUIC endpoint")?;
            let client_cert = opts
                .client_cert
                .as_ref()
                .map(|(c, k)| (c.clone(), k.clone_key()));
            let tls = tls::client_config(&opts.roots, client_cert)?;
            let quic =
                Arc::new(QuicClientConfig::try_from(tls).context("TLS configuration for QUIC")?);
            let mut cc = quinn::ClientConfig::new(quic.clone());
            cc.transport_config(client_transport(None));
            ep.set_default_client_config(cc);
            quic_tls = Some(quic);
            Some(ep)
        } else {
            None
        };
        Ok(HttpClient {
            opts,
            addr,
            conn: Conn::None,
            endpoint,
            quic_tls,
            last_rtt: None,
        })
    }

    /// Sends one request (`target` is the path and query) and reads the
    /// whole response.
    pub async fn request(
        &mut self,
        method: Method,
        target: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> anyhow::Result<Exchange> {
        let timeout = self.opts.timeout;
        match tokio::time::timeout(timeout, self.request_inner(method, target, headers, body)).await
        {
            Ok(r) => r,
            Err(_) => {
                self.conn = Conn::None;
                bail!("no complete response within {} ms", timeout.as_millis())
            }
        }
    }

    // request's arguments, passed on: request bounds this with the timeout.
    async fn request_inner(
        &mut self,
        method: Method,
        target: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> anyhow::Result<Exchange> {
        let start = Instant::now();
        let fresh = self.opts.new_conn || matches!(self.conn, Conn::None);
        let mut accepted: Option<quinn::ZeroRttAccepted> = None;
        if fresh {
            if let Conn::H3(_, c) = &self.conn {
                self.last_rtt = Some(c.rtt());
                c.close(0u32.into(), b"new connection");
            }
            self.conn = Conn::None;
            accepted = self.connect().await?;
        }
        let mut early = accepted.is_some();
        let mut too_early_retried = false;
        let connect = if fresh {
            start.elapsed()
        } else {
            Duration::ZERO
        };
        let authority = if self.opts.proto == Proto::H3 {
            format!("{}:{}", self.opts.server_name, self.addr.port())
        } else {
            self.addr.to_string()
        };
        let scheme = if self.opts.proto == Proto::H3 {
            "https"
        } else {
            "http"
        };
        let uri = format!("{scheme}://{authority}{target}");
        let mut rb = Request::builder().method(method.clone()).uri(&uri);
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        let (status, rheaders, rbody) = match &mut self.conn {
            Conn::H1(s) => {
                s.ready().await.context("the HTTP/1.1 connection closed")?;
                let resp = s.send_request(rb.body(Full::new(body))?).await?;
                let (p, b) = resp.into_parts();
                (p.status, p.headers, b.collect().await?.to_bytes())
            }
            Conn::H2(s) => {
                s.ready().await.context("the HTTP/2 connection closed")?;
                let resp = s.send_request(rb.body(Full::new(body))?).await?;
                let (p, b) = resp.into_parts();
                (p.status, p.headers, b.collect().await?.to_bytes())
            }
            Conn::H3(s, conn) => {
                let req = rb.body(())?;
                match h3_round_trip(s, req.clone(), body.clone()).await {
                    Ok(r) if early && r.0 == StatusCode::TOO_EARLY => {
                        // RFC 8470 4.2: send it again once the handshake
                        // is done, on the same connection.
                        if let Some(acc) = accepted.take() {
                            let _ = tokio::time::timeout(self.opts.timeout, acc).await;
                        }
                        early = false;
                        too_early_retried = true;
                        h3_round_trip(s, req, body).await?
                    }
                    Ok(r) => r,
                    Err(e) if early => {
                        // Early data rejected (or lost with the connection
                        // attempt): once the handshake is done, send again.
                        tracing::debug!(error = %e, "0-RTT request failed; retrying after the handshake");
                        early = false;
                        let conn = conn.clone();
                        let (mut s2, c2) = h3_handshake(conn).await?;
                        let r = h3_round_trip(&mut s2, req, body).await;
                        self.conn = Conn::H3(s2, c2);
                        r?
                    }
                    Err(e) => return Err(e),
                }
            }
            Conn::None => bail!("not connected"),
        };
        let total = start.elapsed();
        if let (true, Some(acc)) = (early, accepted) {
            // Counts only if the server accepted the early data (known once
            // the handshake has completed).
            early = tokio::time::timeout(Duration::from_secs(2), acc)
                .await
                .unwrap_or(false);
        }
        if self.opts.new_conn {
            if let Conn::H3(_, c) = &self.conn {
                // Linger (untimed) until the server's session ticket, sent
                // when it gets our Finished, can have arrived: about one
                // round trip after the handshake. Tickets are single-use, so
                // closing at once would leave the next connections without.
                let rtt = c.rtt().min(Duration::from_secs(1));
                tokio::time::sleep(rtt * 3 / 2 + Duration::from_millis(20)).await;
                self.last_rtt = Some(c.rtt());
                c.close(0u32.into(), b"done");
            }
            self.conn = Conn::None;
        }
        Ok(Exchange {
            status,
            headers: rheaders,
            body: rbody,
            total,
            connect,
            new_connection: fresh,
            early_data: early,
            too_early_retried,
        })
    }

    /// Opens a connection; for HTTP/3 with a resumable session, returns the
    /// future telling whether the server accepted the early data.
    async fn connect(&mut self) -> anyhow::Result<Option<quinn::ZeroRttAccepted>> {
        match self.opts.proto {
            Proto::H1 | Proto::H2 => {
                let tcp = TcpStream::connect(self.addr)
                    .await
                    .with_context(|| format!("connecting to {}", self.addr))?;
                tcp.set_nodelay(true)?;
                let io = TokioIo::new(tcp);
                if self.opts.proto == Proto::H1 {
                    let (s, c) = hyper::client::conn::http1::handshake(io).await?;
                    tokio::spawn(async move {
                        let _ = c.await;
                    });
                    self.conn = Conn::H1(s);
                } else {
                    let (s, c) =
                        hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
                    tokio::spawn(async move {
                        let _ = c.await;
                    });
                    self.conn = Conn::H2(s);
                }
                Ok(None)
            }
            Proto::H3 => {
                let ep = self
                    .endpoint
                    .as_ref()
                    .ok_or_else(|| anyhow!("no QUIC endpoint"))?;
                let tls = self
                    .quic_tls
                    .clone()
                    .ok_or_else(|| anyhow!("no QUIC client configuration"))?;
                let mut cc = quinn::ClientConfig::new(tls);
                cc.transport_config(client_transport(self.last_rtt));
                let connecting = ep
                    .connect_with(cc, self.addr, &self.opts.server_name)
                    .with_context(|| format!("connecting to {}", self.addr))?;
                let (conn, accepted) = match connecting.into_0rtt() {
                    Ok((conn, accepted)) => (conn, Some(accepted)),
                    Err(connecting) => (
                        connecting
                            .await
                            .with_context(|| format!("QUIC handshake with {}", self.addr))?,
                        None,
                    ),
                };
                let (s, c) = h3_handshake(conn).await?;
                self.conn = Conn::H3(s, c);
                Ok(accepted)
            }
        }
    }

    /// A handle for more requests on the current HTTP/2 or HTTP/3
    /// connection, concurrently with this client's and each other's (None
    /// when not connected, or on HTTP/1.1, which cannot multiplex).
    pub fn stream_handle(&self) -> Option<StreamHandle> {
        match &self.conn {
            Conn::H2(s) => Some(StreamHandle {
                kind: HandleKind::H2(s.clone()),
                base: format!("http://{}", self.addr),
            }),
            Conn::H3(s, _) => Some(StreamHandle {
                kind: HandleKind::H3(s.clone()),
                base: format!("https://{}:{}", self.opts.server_name, self.addr.port()),
            }),
            _ => None,
        }
    }

    /// Closes the connection, if any.
    pub fn close(&mut self) {
        if let Conn::H3(_, c) = &self.conn {
            self.last_rtt = Some(c.rtt());
            c.close(0u32.into(), b"bye");
        }
        self.conn = Conn::None;
    }

    /// Waits until the QUIC endpoint has sent its last packets (HTTP/3).
    pub async fn shutdown(mut self) {
        self.close();
        if let Some(ep) = self.endpoint.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
        }
    }
}

enum HandleKind {
    H2(H2Sender),
    H3(H3Sender),
}

/// Another request stream on a multiplexed (HTTP/2 or HTTP/3) connection;
/// see [`HttpClient::stream_handle`].
pub struct StreamHandle {
    kind: HandleKind,
    base: String,
}

impl StreamHandle {
    /// Sends `method target` with `headers` and an empty body and reads the
    /// whole response; `total` is from sending to the last body byte.
    pub async fn request(
        &mut self,
        method: Method,
        target: &str,
        headers: &HeaderMap,
    ) -> anyhow::Result<Exchange> {
        let start = Instant::now();
        let mut rb = Request::builder()
            .method(method)
            .uri(format!("{}{target}", self.base));
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        let (status, headers, body) = match &mut self.kind {
            HandleKind::H2(s) => {
                s.ready().await.context("the HTTP/2 connection closed")?;
                let resp = s.send_request(rb.body(Full::new(Bytes::new()))?).await?;
                let (p, b) = resp.into_parts();
                (p.status, p.headers, b.collect().await?.to_bytes())
            }
            HandleKind::H3(s) => h3_round_trip(s, rb.body(())?, Bytes::new()).await?,
        };
        Ok(Exchange {
            status,
            headers,
            body,
            total: start.elapsed(),
            connect: Duration::ZERO,
            new_connection: false,
            early_data: false,
            too_early_retried: false,
        })
    }
}

async fn h3_handshake(conn: quinn::Connection) -> anyhow::Result<(H3Sender, quinn::Connection)> {
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok((send, conn))
}

async fn h3_round_trip(
    s: &mut H3Sender,
    req: Request<()>,
    body: Bytes,
) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
    let mut stream = s.send_request(req).await?;
    if !body.is_empty() {
        stream.send_data(body).await?;
    }
    stream.finish().await?;
    let resp = stream.recv_response().await?;
    let mut out = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await? {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    let (p, _) = resp.into_parts();
    Ok((p.status, p.headers, Bytes::from(out)))
}
