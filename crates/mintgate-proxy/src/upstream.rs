//! The async upstream CoAP client: one UDP socket and one tokio task drive
//! mintgate's sans-IO [`Client`] for every proxied request.
//!
//! - Requests reach the task over a channel with a oneshot for the answer;
//!   the task feeds them to the client, sends what it asks to send, feeds
//!   it received datagrams and its timers, and completes each request with
//!   the exchange's event.
//! - Confirmable requests, retransmitted as the configured congestion
//!   controller (Basic, CoCoA or Adaptive RTO) decides; NSTART exchanges
//!   per upstream are in flight at once and the rest wait in the client's
//!   FIFO queue.
//! - Limits (answered with [`UpstreamError::Overloaded`], which the proxy
//!   maps to 503): at most `max_inflight` requests in flight or queued over
//!   all upstreams, and at most `max_queue_per_upstream` per upstream.
//! - The socket is bound to `[::]:0` accepting IPv4 too (v4-mapped), or to
//!   `0.0.0.0:0` where IPv6 is unavailable.
//!
//! - OSCORE (RFC 8613): requests to an upstream that has a security
//!   context ([`UpstreamConfig::oscore`]) are protected by the proxy, each
//!   exchange (each block) on its own, and answered only with what
//!   verifies: the proxy is then the OSCORE client, and the upstream sees
//!   the context's identity. A request that is already protected (an HTTP
//!   client's own OSCORE, RFC 8613 section 11) is forwarded as it is.
//!
//! An HTTP request that is abandoned (client gone, proxy timeout) leaves its
//! exchange running until the CoAP layer ends it; its answer is discarded,
//! and it holds its slot until then, so the limits stay honest.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mintgate_coap::client::blockwise::{BlockConfig, Step, Transfer};
use mintgate_coap::client::{Client, ClientConfig, Event, ExchangeId, Request};
use mintgate_coap::oscore::{self, Context, RequestId};
use mintgate_coap::rto::{Algorithm, TransmissionParams};
use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};

use crate::mapping::{CoapRequest, CoapResponse};

/// Settings of the upstream client.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    /// Retransmission-timeout controller.
    pub algorithm: Algorithm,
    /// Exchanges in flight per upstream (NSTART).
    pub nstart: usize,
    /// Requests in flight or queued over all upstreams, at most.
    pub max_inflight: usize,
    /// Requests in flight or queued per upstream, at most.
    pub max_queue_per_upstream: usize,
    /// How long a separate response may take after the empty ACK.
    pub separate_timeout: Duration,
    /// Seed of tokens, message IDs and the controller's randomness.
    pub seed: u64,
    /// Block-wise transfers (RFC 7959): request bodies larger than a block
    /// go up in blocks (Block1), block-wise answers are fetched whole
    /// (Block2) up to `max_body` bytes.
    pub block: BlockConfig,
    /// OSCORE security contexts by upstream address: requests to these
    /// are protected, their answers verified.
    pub oscore: UpstreamOscore,
}

/// OSCORE contexts of upstreams, by address (shared: the proxy and
/// anything else holding the context take its sequence numbers in turn).
#[derive(Clone, Default)]
pub struct UpstreamOscore(pub HashMap<SocketAddr, Arc<Mutex<Context>>>);

impl std::fmt::Debug for UpstreamOscore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl PartialEq for UpstreamOscore {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .all(|(a, c)| other.0.get(a).is_some_and(|o| Arc::ptr_eq(c, o)))
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            algorithm: Algorithm::Basic,
            nstart: 1,
            max_inflight: 1024,
            max_queue_per_upstream: 256,
            separate_timeout: Duration::from_secs(60),
            seed: rand::random(),
            block: block_config(),
            oscore: UpstreamOscore::default(),
        }
    }
}

/// Largest answer fetched block-wise, bytes (1 MiB): more is answered 502.
pub const MAX_RESPONSE_BODY: usize = 1 << 20;

/// The proxy's block-wise settings: 1024-byte blocks up, the server's
/// block size down, answers up to [`MAX_RESPONSE_BODY`].
pub fn block_config() -> BlockConfig {
    BlockConfig {
        max_body: MAX_RESPONSE_BODY,
        ..BlockConfig::default()
    }
}

/// Why no response came.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The CoAP exchange gave up (no ACK after the last retransmission, or
    /// no separate response in time).
    #[error("the CoAP server did not answer")]
    Timeout,
    /// The CoAP server answered with a Reset.
    #[error("the CoAP server rejected the request with a Reset")]
    Reset,
    /// Over a limit; retry later.
    #[error("too many requests in flight to the CoAP server")]
    Overloaded,
    /// The request cannot be encoded (too large, bad option).
    #[error("cannot send the CoAP request: {0}")]
    Request(String),
    /// The socket failed or the task is gone.
    #[error("upstream I/O: {0}")]
    Io(String),
    /// A block-wise transfer failed (too large, the server broke the
    /// rules, the representation kept changing).
    #[error("{0}")]
    Block(String),
    /// The request could not be protected, or the answer came unprotected
    /// or did not verify (OSCORE).
    #[error("OSCORE with the CoAP server: {0}")]
    Oscore(String),
}

/// A response and how the exchange went.
#[derive(Clone, Debug)]
pub struct UpstreamResponse {
    /// The response.
    pub response: CoapResponse,
    /// From the first transmission to the response.
    pub rtt: Duration,
    /// Retransmissions made.
    pub retransmissions: u32,
}

/// Counters of the upstream client.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    /// Requests accepted.
    pub requests: AtomicU64,
    /// Responses received.
    pub responses: AtomicU64,
    /// Exchanges that gave up.
    pub timeouts: AtomicU64,
    /// Requests refused over a limit.
    pub overloaded: AtomicU64,
    /// Retransmissions.
    pub retransmissions: AtomicU64,
    /// Bytes of response payload and option values copied out of received
    /// datagrams on the way to HTTP (the client's count; `lab buffers` reads
    /// it). Datagrams are received into shared buffers whose slices become
    /// the HTTP body, so nothing is copied.
    pub bytes_copied: AtomicU64,
    /// Datagrams longer than [`MAX_DATAGRAM`], dropped.
    pub oversize: AtomicU64,
}

/// Largest response datagram the upstream client accepts (a CoAP message
/// over UDP is meant to fit one IP packet, RFC 7252 4.6; larger answers
/// are dropped and counted in [`UpstreamStats::oversize`]).
pub const MAX_DATAGRAM: usize = 4096;

/// Datagrams are received into areas of this size, each split into one
/// shared buffer per datagram; a new area is taken when less than
/// `MAX_DATAGRAM + 1` bytes are left, so at most 1/16 of an area is left
/// unused. An area is freed when the last response sliced from it is.
const RECV_AREA: usize = 16 * MAX_DATAGRAM;

/// The receive side of the upstream socket: whole datagrams as [`Bytes`]
/// without a copy.
struct RecvArea {
    area: BytesMut,
}

impl RecvArea {
    fn new() -> RecvArea {
        RecvArea {
            area: BytesMut::new(),
        }
    }

    /// Room for one more datagram (and one byte more, to see truncation).
    fn room(&mut self) -> &mut BytesMut {
        if self.area.capacity() - self.area.len() <= MAX_DATAGRAM {
            self.area = BytesMut::with_capacity(RECV_AREA);
        }
        &mut self.area
    }

    /// The datagram just received (the area's filled bytes), or None when
    /// it was longer than [`MAX_DATAGRAM`].
    fn take(&mut self) -> Option<Bytes> {
        let d = self.area.split().freeze();
        (d.len() <= MAX_DATAGRAM).then_some(d)
    }
}

struct Cmd {
    dest: SocketAddr,
    req: CoapRequest,
    reply: oneshot::Sender<Result<UpstreamResponse, UpstreamError>>,
}

/// A handle to the upstream task; cheap to clone. The task ends when every
/// handle is dropped.
#[derive(Clone)]
pub struct Upstream {
    tx: mpsc::UnboundedSender<Cmd>,
    inflight: Arc<AtomicUsize>,
    max_inflight: usize,
    stats: Arc<UpstreamStats>,
    local: SocketAddr,
}

/// Releases an in-flight slot when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A non-blocking upstream socket bound to `addr`, or by default to a
/// dual-stack `[::]:0` (`0.0.0.0:0` where IPv6 is missing).
pub fn bind(addr: Option<SocketAddr>) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let Some(a) = addr else {
        return bind_socket();
    };
    let s = Socket::new(Domain::for_address(a), Type::DGRAM, Some(Protocol::UDP))?;
    if a.is_ipv6() {
        s.set_only_v6(false)?;
    }
    s.bind(&a.into())?;
    let _ = s.set_recv_buffer_size(1 << 20);
    let _ = s.set_send_buffer_size(1 << 20);
    s.set_nonblocking(true)?;
    Ok(s.into())
}

fn bind_socket() -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let v6 = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)).and_then(|s| {
        s.set_only_v6(false)?;
        s.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)).into())?;
        Ok(s)
    });
    let s = match v6 {
        Ok(s) => s,
        Err(_) => {
            let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
            s.bind(&SocketAddr::from(([0u8; 4], 0)).into())?;
            s
        }
    };
    let _ = s.set_recv_buffer_size(1 << 20);
    let _ = s.set_send_buffer_size(1 << 20);
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// `dest` as the socket needs it (v4-mapped on a dual-stack socket).
fn to_socket(dest: SocketAddr, dual: bool) -> SocketAddr {
    match dest {
        SocketAddr::V4(v4) if dual => {
            SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
        }
        d => d,
    }
}

/// A received source as the client knows it (v4-mapped back to IPv4).
fn from_socket(src: SocketAddr) -> SocketAddr {
    match src {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((IpAddr::V4(v4), v6.port())),
            None => src,
        },
        s => s,
    }
}

impl Upstream {
    /// Binds the socket and spawns the task on the current tokio runtime.
    pub fn start(cfg: UpstreamConfig) -> io::Result<Upstream> {
        Self::start_with(cfg, bind_socket()?)
    }

    /// The same with a socket the caller bound (e.g. in another network
    /// namespace). It must be non-blocking.
    pub fn start_with(cfg: UpstreamConfig, socket: std::net::UdpSocket) -> io::Result<Upstream> {
        let socket = UdpSocket::from_std(socket)?;
        let local = socket.local_addr()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(UpstreamStats::default());
        let params = TransmissionParams {
            nstart: cfg.nstart.max(1),
            ..TransmissionParams::default()
        };
        let mut ccfg = ClientConfig::new(params);
        ccfg.separate_timeout = cfg.separate_timeout;
        ccfg.non_timeout = cfg.separate_timeout;
        let client = Client::new(
            ccfg,
            cfg.algorithm.controller(params, cfg.seed.rotate_left(17)),
            cfg.seed,
        );
        let task = Task {
            socket,
            dual: local.is_ipv6(),
            client,
            rx,
            pending: HashMap::new(),
            per_dest: HashMap::new(),
            max_per_dest: cfg.max_queue_per_upstream.max(1),
            block: cfg.block,
            oscore: cfg.oscore,
            stats: stats.clone(),
        };
        tokio::spawn(task.run());
        Ok(Upstream {
            tx,
            inflight: Arc::new(AtomicUsize::new(0)),
            max_inflight: cfg.max_inflight.max(1),
            stats,
            local,
        })
    }

    /// The socket's local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The counters.
    pub fn stats(&self) -> &UpstreamStats {
        &self.stats
    }

    /// Requests in flight or queued now.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Relaxed)
    }

    /// Sends `req` (confirmable) to `dest` and waits for the outcome.
    pub async fn request(
        &self,
        dest: SocketAddr,
        req: CoapRequest,
    ) -> Result<UpstreamResponse, UpstreamError> {
        if self.inflight.fetch_add(1, Relaxed) >= self.max_inflight {
            self.inflight.fetch_sub(1, Relaxed);
            self.stats.overloaded.fetch_add(1, Relaxed);
            return Err(UpstreamError::Overloaded);
        }
        let _slot = Slot(self.inflight.clone());
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd { dest, req, reply })
            .map_err(|_| UpstreamError::Io("the upstream task has stopped".into()))?;
        rx.await
            .map_err(|_| UpstreamError::Io("the upstream task has stopped".into()))?
    }
}

struct Pending {
    dest: SocketAddr,
    reply: oneshot::Sender<Result<UpstreamResponse, UpstreamError>>,
    /// The request's block-wise transfer: one exchange, or one per block.
    transfer: Transfer,
    /// With OSCORE: the context, and what the exchange in flight was
    /// protected as.
    sealed: Option<Sealed>,
}

/// A transfer's OSCORE state: the context, the protected request in
/// flight and its id, and an answer's outer blocks so far.
struct Sealed {
    ctx: Arc<Mutex<Context>>,
    sent: Option<(Request, RequestId)>,
    outer: oscore::client::OuterBlocks,
}

impl Pending {
    /// `r` protected when the transfer is, as the exchange to start next.
    fn seal(&mut self, r: Request) -> Result<Request, UpstreamError> {
        let Some(s) = &mut self.sealed else {
            return Ok(r);
        };
        let (outer, id) = oscore::client::protect(&mut s.ctx.lock(), &r)
            .map_err(|e| UpstreamError::Oscore(e.to_string()))?;
        s.sent = Some((outer.clone(), id));
        s.outer = oscore::client::OuterBlocks::default();
        Ok(outer)
    }

    /// The answer to the exchange in flight, verified when it was
    /// protected; or, for a block of an answer a proxy cut into outer
    /// blocks, the request for the next block.
    fn open(&mut self, ev: Event) -> Result<oscore::client::Outer, UpstreamError> {
        use oscore::client::{AnswerError, Outer};
        let Some(Sealed {
            ctx,
            sent: Some((sent, id)),
            outer,
        }) = &mut self.sealed
        else {
            return Ok(Outer::Whole(ev));
        };
        let failed = |e: AnswerError| {
            UpstreamError::Oscore(match e {
                AnswerError::Unprotected { code, .. } => {
                    format!("it refused the protected request: {code}")
                }
                AnswerError::Oscore(e) => e.to_string(),
            })
        };
        match outer.on_event(sent, ev).map_err(failed)? {
            Outer::Whole(ev) => oscore::client::open_event(&ctx.lock(), id, ev)
                .map(Outer::Whole)
                .map_err(failed),
            next => Ok(next),
        }
    }
}

/// The task's state. Invariant: `per_dest[d]` is the number of entries of
/// `pending` whose dest is `d` (absent when 0), and `pending` holds exactly
/// the client's live exchanges.
struct Task {
    socket: UdpSocket,
    dual: bool,
    client: Client,
    rx: mpsc::UnboundedReceiver<Cmd>,
    pending: HashMap<ExchangeId, Pending>,
    per_dest: HashMap<SocketAddr, usize>,
    max_per_dest: usize,
    block: BlockConfig,
    oscore: UpstreamOscore,
    stats: Arc<UpstreamStats>,
}

impl Task {
    async fn run(mut self) {
        let mut rx = RecvArea::new();
        let mut open = true;
        while open || !self.pending.is_empty() {
            self.flush().await;
            let deadline = self.client.poll_timeout();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.socket.recv_buf_from(rx.room()) => {
                    match r {
                        Ok((_, src)) => {
                            self.received(&mut rx, src);
                            // Take what else is waiting without another wake-up.
                            for _ in 0..64 {
                                match self.socket.try_recv_buf_from(rx.room()) {
                                    Ok((_, src)) => self.received(&mut rx, src),
                                    Err(_) => break,
                                }
                            }
                        }
                        Err(e) => {
                            // ICMP errors (port unreachable) surface here on
                            // some systems; the exchange then times out.
                            tracing::debug!(error = %e, "upstream receive");
                        }
                    }
                }
                cmd = self.rx.recv(), if open => {
                    match cmd {
                        Some(c) => {
                            self.start(c);
                            for _ in 0..64 {
                                match self.rx.try_recv() {
                                    Ok(c) => self.start(c),
                                    Err(_) => break,
                                }
                            }
                        }
                        None => open = false,
                    }
                }
                _ = sleep => self.client.handle_timeout(Instant::now()),
            }
        }
    }

    /// Hands the datagram just received into `rx` to the client.
    fn received(&mut self, rx: &mut RecvArea, src: SocketAddr) {
        match rx.take() {
            Some(d) => {
                self.client
                    .handle_datagram_bytes(Instant::now(), from_socket(src), d);
                self.stats
                    .bytes_copied
                    .store(self.client.stats().bytes_copied, Relaxed);
            }
            None => {
                self.stats.oversize.fetch_add(1, Relaxed);
            }
        }
    }

    fn start(&mut self, c: Cmd) {
        if c.reply.is_closed() {
            return;
        }
        let n = self.per_dest.get(&c.dest).copied().unwrap_or(0);
        if n >= self.max_per_dest {
            self.stats.overloaded.fetch_add(1, Relaxed);
            let _ = c.reply.send(Err(UpstreamError::Overloaded));
            return;
        }
        let req = Request {
            confirmable: true,
            code: c.req.code,
            options: c.req.options,
            payload: c.req.payload,
        };
        // a request the HTTP client protected itself goes as it is
        let sealed = match self.oscore.0.get(&c.dest) {
            Some(ctx) if !req.options.iter().any(|(n, _)| *n == oscore::OSCORE) => Some(Sealed {
                ctx: ctx.clone(),
                sent: None,
                outer: oscore::client::OuterBlocks::default(),
            }),
            _ => None,
        };
        let (transfer, first) = Transfer::new(req, self.block);
        let mut p = Pending {
            dest: c.dest,
            reply: c.reply,
            transfer,
            sealed,
        };
        let first = match p.seal(first) {
            Ok(r) => r,
            Err(e) => {
                let _ = p.reply.send(Err(e));
                return;
            }
        };
        match self.client.request(Instant::now(), c.dest, first) {
            Ok(id) => {
                self.stats.requests.fetch_add(1, Relaxed);
                *self.per_dest.entry(c.dest).or_insert(0) += 1;
                self.pending.insert(id, p);
            }
            Err(e) => {
                let _ = p.reply.send(Err(UpstreamError::Request(e.to_string())));
            }
        }
    }

    /// Sends what the client has to send and answers the requests whose
    /// exchanges ended; a block-wise transfer's next exchange starts at
    /// once, and what it sends goes out in the same call.
    async fn flush(&mut self) {
        loop {
            while let Some(t) = self.client.poll_transmit(Instant::now()) {
                let to = to_socket(t.dest, self.dual);
                if let Err(e) = self.socket.send_to(&t.bytes, to).await {
                    // A lost datagram: the controller retransmits or gives up.
                    tracing::debug!(error = %e, dest = %t.dest, "upstream send");
                }
            }
            let mut continued = false;
            while let Some(ev) = self.client.poll_event() {
                let Some(mut p) = self.pending.remove(&ev.id()) else {
                    continue;
                };
                if let Event::Response {
                    retransmissions, ..
                } = &ev
                {
                    self.stats.responses.fetch_add(1, Relaxed);
                    self.stats
                        .retransmissions
                        .fetch_add(u64::from(*retransmissions), Relaxed);
                }
                let out = match ev {
                    Event::Timeout { .. } => {
                        self.stats.timeouts.fetch_add(1, Relaxed);
                        Err(UpstreamError::Timeout)
                    }
                    Event::Reset { .. } => Err(UpstreamError::Reset),
                    ev => match p.open(ev).map(|o| match o {
                        oscore::client::Outer::Whole(ev) => Ok(p.transfer.on_event(ev)),
                        oscore::client::Outer::Next(again) => Err(again),
                    }) {
                        Err(e) => Err(e),
                        // a proxy's outer block: the same protected request
                        // for the next one; the request keeps its slot
                        Ok(Err(again)) => {
                            match self.client.request(Instant::now(), p.dest, again) {
                                Ok(id) => {
                                    self.pending.insert(id, p);
                                    continued = true;
                                    continue;
                                }
                                Err(e) => Err(UpstreamError::Request(e.to_string())),
                            }
                        }
                        Ok(Ok(Some(Step::Send(next)))) => {
                            // the next block: the request keeps its slot
                            if p.reply.is_closed() {
                                Err(UpstreamError::Io("abandoned".into()))
                            } else {
                                match p.seal(next).and_then(|next| {
                                    self.client
                                        .request(Instant::now(), p.dest, next)
                                        .map_err(|e| UpstreamError::Request(e.to_string()))
                                }) {
                                    Ok(id) => {
                                        self.pending.insert(id, p);
                                        continued = true;
                                        continue;
                                    }
                                    Err(e) => Err(e),
                                }
                            }
                        }
                        Ok(Ok(Some(Step::Done(r)))) => Ok(UpstreamResponse {
                            response: CoapResponse {
                                code: r.code,
                                options: r.options,
                                payload: r.payload,
                            },
                            rtt: r.rtt,
                            retransmissions: r.retransmissions,
                        }),
                        Ok(Ok(Some(Step::Failed(e)))) => Err(UpstreamError::Block(e.to_string())),
                        Ok(Ok(None)) => Err(UpstreamError::Io(
                            "an exchange ended without an answer".into(),
                        )),
                    },
                };
                if let Some(n) = self.per_dest.get_mut(&p.dest) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_dest.remove(&p.dest);
                    }
                }
                let _ = p.reply.send(out);
            }
            if !continued {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};

    #[test]
    fn datagrams_share_an_area_and_oversize_ones_are_refused() {
        let mut rx = RecvArea::new();
        rx.room().extend_from_slice(&[1; 100]);
        let a = rx.take().expect("fits");
        assert!(
            rx.room().capacity() > MAX_DATAGRAM,
            "room for the largest datagram and one byte more"
        );
        rx.room().extend_from_slice(&[2; 50]);
        let b = rx.take().expect("fits");
        assert_eq!((a.len(), b.len()), (100, 50));
        // b follows a in the same allocation
        assert_eq!(a.as_ptr_range().end, b.as_ptr());
        rx.room().extend_from_slice(&vec![3; MAX_DATAGRAM + 1]);
        assert!(rx.take().is_none(), "a truncated datagram is not handed on");
        rx.room().extend_from_slice(&[4; MAX_DATAGRAM]);
        assert_eq!(rx.take().map(|d| d.len()), Some(MAX_DATAGRAM));
        // a new area is taken when the old one has too little room left
        for _ in 0..RECV_AREA / MAX_DATAGRAM {
            rx.room().extend_from_slice(&[5; MAX_DATAGRAM]);
            assert!(rx.take().is_some());
        }
        assert_eq!((a[0], b[0]), (1, 2), "earlier datagrams are untouched");
    }

    /// A tiny CoAP responder on loopback: answers every CON GET with a
    /// piggybacked 2.05 carrying the request's first Uri-Path, after `delay`;
    /// counts requests. Drops the first `drop_first` datagrams.
    async fn responder(delay: Duration, drop_first: usize) -> (SocketAddr, Arc<AtomicUsize>) {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = s.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let seen2 = seen.clone();
        let s = Arc::new(s);
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, src)) = s.recv_from(&mut buf).await else {
                    return;
                };
                let k = seen2.fetch_add(1, Relaxed);
                if k < drop_first {
                    continue;
                }
                let Ok(p) = Packet::new_checked(&buf[..n]) else {
                    continue;
                };
                let path: Vec<u8> = p
                    .option(OptionNumber::URI_PATH)
                    .map(|o| o.value.to_vec())
                    .unwrap_or_default();
                let mut out = [0u8; 1500];
                let mut w = MessageWriter::new(
                    &mut out,
                    MessageType::Ack,
                    Code::CONTENT,
                    p.message_id(),
                    p.token(),
                )
                .unwrap();
                w.payload(&path).unwrap();
                let len = w.finish();
                let s = s.clone();
                let reply = out[..len].to_vec();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = s.send_to(&reply, src).await;
                });
            }
        });
        (addr, seen)
    }

    fn get(path: &str) -> CoapRequest {
        CoapRequest {
            code: Code::GET,
            options: vec![(OptionNumber::URI_PATH, path.as_bytes().to_vec())],
            payload: vec![],
        }
    }

    #[tokio::test]
    async fn answers_come_back_to_the_right_request() {
        let (addr, _) = responder(Duration::ZERO, 0).await;
        let up = Upstream::start(UpstreamConfig {
            nstart: 4,
            ..UpstreamConfig::default()
        })
        .unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let up = up.clone();
            tasks.push(tokio::spawn(async move {
                let r = up.request(addr, get(&format!("p{i}"))).await.unwrap();
                assert_eq!(r.response.code, Code::CONTENT);
                assert_eq!(r.response.payload, format!("p{i}").into_bytes());
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(up.stats().responses.load(Relaxed), 20);
        assert_eq!(up.inflight(), 0);
    }

    #[tokio::test]
    async fn a_lost_request_is_retransmitted() {
        let (addr, seen) = responder(Duration::ZERO, 1).await;
        let up = Upstream::start(UpstreamConfig {
            algorithm: Algorithm::Cocoa,
            ..UpstreamConfig::default()
        })
        .unwrap();
        let r = up.request(addr, get("x")).await.unwrap();
        assert_eq!(r.retransmissions, 1);
        assert_eq!(seen.load(Relaxed), 2);
    }

    #[tokio::test]
    async fn limits_answer_overloaded() {
        // A slow responder and NSTART 1: the second request waits in the
        // queue; the per-upstream limit is 2 and the global limit 3.
        let (addr, _) = responder(Duration::from_millis(300), 0).await;
        let up = Upstream::start(UpstreamConfig {
            max_inflight: 3,
            max_queue_per_upstream: 2,
            ..UpstreamConfig::default()
        })
        .unwrap();
        let a = tokio::spawn({
            let up = up.clone();
            async move { up.request(addr, get("a")).await }
        });
        let b = tokio::spawn({
            let up = up.clone();
            async move { up.request(addr, get("b")).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            up.request(addr, get("c")).await.unwrap_err(),
            UpstreamError::Overloaded
        );
        assert!(a.await.unwrap().is_ok());
        assert!(b.await.unwrap().is_ok());
        assert_eq!(up.stats().overloaded.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn silence_times_out() {
        // A socket that never answers; Basic with its default 2-3 s first
        // timeout would take ~45 s to give up, so check the request is still
        // pending after a while and that the limit counts it.
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let up = Upstream::start(UpstreamConfig::default()).unwrap();
        let r = tokio::time::timeout(Duration::from_millis(300), up.request(addr, get("x"))).await;
        assert!(r.is_err(), "no answer should have come");
        assert_eq!(up.stats().requests.load(Relaxed), 1);
    }
}
