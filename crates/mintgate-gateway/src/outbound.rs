//! The gateway's outbound CoAP client: requests to other CoAP servers over
//! one UDP socket, driving the sans-IO [`Client`] with the wall clock,
//! with block-wise transfers ([`Transfer`], RFC 7959) and, when given one,
//! the network cache ([`Cache`], RFC 7252 5.6) in front.
//!
//! With a cache, a GET without validators of its own is answered from a
//! fresh entry without touching the network (Max-Age lowered by the entry's
//! age, RFC 7252 5.6.1); a stale entry with an ETag is revalidated (the GET
//! carries the ETag; a 2.03 refreshes the entry and the stored
//! representation is returned); anything else goes to the server and a
//! cacheable answer is stored. A PUT, POST or DELETE drops what is stored
//! for a GET of the same resource.
//!
//! Over coaps ([`Outbound::new_dtls`]) the same client runs inside one DTLS
//! session with its destination (mintgate-dtls on OpenSSL).
//!
//! Blocking and single-threaded: one request at a time, each bounded by its
//! deadline.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use bytes::Bytes;

use mintgate_coap::cache::{self, Cache, CacheKey, Lookup};
use mintgate_coap::client::blockwise::{BlockConfig, BlockError, Response, Step, Transfer};
use mintgate_coap::client::{Client, ClientConfig, Event, Request, RequestError};
use mintgate_coap::oscore::client::{AnswerError, Outer, Sealer};
use mintgate_coap::rto::RtoController;
use mintgate_coap::wire::{encode_uint, Code, MessageType, OptionNumber};
use mintgate_dtls::{ClientSettings, DtlsClient, DtlsError};

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The server answered it.
    Network,
    /// A fresh cache entry, this many seconds old; no datagram was sent.
    Cache {
        /// Age in whole seconds.
        age: u32,
    },
    /// A stale cache entry the server confirmed with 2.03 Valid.
    Revalidated,
}

/// An answer and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The whole response.
    pub response: Response,
    /// Network, cache or revalidated.
    pub source: Source,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// Nothing came back before the deadline.
    #[error("no response within the timeout")]
    Timeout,
    /// The server rejected the request with a Reset.
    #[error("the server rejected the request with a Reset")]
    Reset,
    /// ICMP port unreachable: nothing listens there.
    #[error("port unreachable (nothing listens there)")]
    Unreachable,
    /// The block-wise transfer broke down.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// The request cannot be sent.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A socket error.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// The DTLS session (coaps) failed: handshake, keys, certificates.
    #[error(transparent)]
    Dtls(#[from] DtlsError),
    /// A request could not be protected, or its answer not verified
    /// (OSCORE).
    #[error("OSCORE: {0}")]
    Oscore(mintgate_coap::oscore::Error),
    /// A protected request got an unprotected answer: the server refused
    /// it (an unknown context, a replay, a ciphertext that did not verify).
    #[error("the server refused the OSCORE request: {code}")]
    Refused {
        /// The answer's code.
        code: Code,
        /// Its payload (the server's diagnostic, if any).
        payload: Bytes,
    },
}

/// Counters of an [`Outbound`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboundStats {
    /// Requests answered by the network.
    pub network: u64,
    /// Requests answered from a fresh cache entry.
    pub cache_hits: u64,
    /// Requests answered by a revalidated entry.
    pub revalidated: u64,
    /// Exchanges (datagram round trips, blocks included) started.
    pub exchanges: u64,
}

/// The outbound client. See the [module documentation](self).
pub struct Outbound {
    socket: UdpSocket,
    connected: Option<SocketAddr>,
    /// coaps: the DTLS session to the one destination it was made for
    /// (it owns its own socket; `socket` is then unused).
    dtls: Option<(SocketAddr, DtlsClient)>,
    client: Client,
    block: BlockConfig,
    cache: Option<Cache>,
    stats: OutboundStats,
    buf: Vec<u8>,
}

impl Outbound {
    /// A client on a fresh socket (IPv6 when `ipv6`, else IPv4),
    /// retransmitting as `rto` decides.
    pub fn new(
        ipv6: bool,
        config: ClientConfig,
        rto: Box<dyn RtoController>,
        seed: u64,
        block: BlockConfig,
    ) -> io::Result<Outbound> {
        let bind: SocketAddr = if ipv6 {
            (IpAddr::from(Ipv6Addr::UNSPECIFIED), 0).into()
        } else {
            (IpAddr::from([0u8; 4]), 0).into()
        };
        Ok(Outbound {
            socket: UdpSocket::bind(bind)?,
            connected: None,
            dtls: None,
            client: Client::new(config, rto, seed),
            block,
            cache: None,
            stats: OutboundStats::default(),
            buf: vec![0u8; 65536],
        })
    }

    /// A coaps client: a DTLS session with `dest` (handshake done by
    /// `deadline`), every request to `dest` going through it. Requests to
    /// any other destination fail.
    pub fn new_dtls(
        dest: SocketAddr,
        settings: ClientSettings,
        deadline: Instant,
        config: ClientConfig,
        rto: Box<dyn RtoController>,
        seed: u64,
        block: BlockConfig,
    ) -> Result<Outbound, OutboundError> {
        let mut out = Outbound::new(dest.is_ipv6(), config, rto, seed, block)?;
        let sock = out.socket.try_clone()?;
        sock.connect(dest)?;
        let client = match DtlsClient::connect(sock, settings, deadline) {
            Err(DtlsError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(OutboundError::Unreachable)
            }
            r => r?,
        };
        out.dtls = Some((dest, client));
        Ok(out)
    }

    /// The negotiated DTLS cipher suite of a coaps client.
    pub fn dtls_cipher(&self) -> Option<&'static str> {
        self.dtls.as_ref().and_then(|(_, c)| c.cipher())
    }

    /// Puts `cache` in front of the network.
    pub fn with_cache(mut self, cache: Cache) -> Outbound {
        self.cache = Some(cache);
        self
    }

    /// The cache, if any.
    pub fn cache(&self) -> Option<&Cache> {
        self.cache.as_ref()
    }

    /// The counters.
    pub fn stats(&self) -> OutboundStats {
        self.stats
    }

    /// The sans-IO client (for its counters and controller).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends `req` to `dest` and waits for the whole answer, until
    /// `deadline` at most.
    pub fn request(
        &mut self,
        dest: SocketAddr,
        mut req: Request,
        deadline: Instant,
    ) -> Result<Fetched, OutboundError> {
        let origin = dest.to_string();
        let cacheable = self.cache.is_some()
            && req.code == Code::GET
            && !req.options.iter().any(|(n, _)| {
                matches!(
                    *n,
                    OptionNumber::ETAG | OptionNumber::IF_MATCH | OptionNumber::IF_NONE_MATCH
                )
            });
        let key = CacheKey::new(&origin, req.code, &req.options);
        let mut revalidating = false;
        if let (true, Some(c)) = (cacheable, self.cache.as_mut()) {
            match c.lookup(&key, Instant::now()) {
                Lookup::Fresh(r, age) => {
                    self.stats.cache_hits += 1;
                    return Ok(Fetched {
                        response: from_cache(r, age),
                        source: Source::Cache { age },
                    });
                }
                Lookup::Stale(tag) => {
                    req.options.push((OptionNumber::ETAG, tag));
                    revalidating = true;
                }
                Lookup::Miss => {}
            }
        }
        let unsafe_method = matches!(req.code, Code::PUT | Code::POST | Code::DELETE);
        let target: Vec<(OptionNumber, Vec<u8>)> = req
            .options
            .iter()
            .filter(|(n, _)| {
                matches!(
                    *n,
                    OptionNumber::URI_HOST
                        | OptionNumber::URI_PORT
                        | OptionNumber::URI_PATH
                        | OptionNumber::URI_QUERY
                )
            })
            .cloned()
            .collect();
        let resp = self.transfer(dest, req, None, deadline)?;
        let now = Instant::now();
        let Some(c) = self.cache.as_mut() else {
            self.stats.network += 1;
            return Ok(Fetched {
                response: resp,
                source: Source::Network,
            });
        };
        let as_cached = cache::Response {
            code: resp.code,
            options: resp.options.clone(),
            payload: resp.payload.clone(),
        };
        if revalidating && resp.code == Code::VALID {
            if let Some(stored) = c.revalidated(&key, &as_cached, now) {
                self.stats.revalidated += 1;
                let mut r = from_cache(stored, 0);
                r.rtt = resp.rtt;
                r.retransmissions = resp.retransmissions;
                r.exchanges = resp.exchanges;
                return Ok(Fetched {
                    response: r,
                    source: Source::Revalidated,
                });
            }
        } else if cacheable {
            c.store(key, &as_cached, now);
        } else if unsafe_method {
            c.invalidate(&CacheKey::new(&origin, Code::GET, &target));
        }
        self.stats.network += 1;
        Ok(Fetched {
            response: resp,
            source: Source::Network,
        })
    }

    /// Runs the block-wise transfer of `req` to its end.
    /// Sends `req` protected by `sealer` (OSCORE) and waits for the whole
    /// answer, verified, until `deadline` at most. Block-wise transfers go
    /// inside the protection (RFC 8613 4.1.3.4.1): each block is a request
    /// protected on its own, so a body of any size passes a proxy that
    /// cannot read it. The cache is not used: the answers are for this
    /// client alone. An unprotected answer is [`OutboundError::Refused`].
    pub fn request_sealed(
        &mut self,
        dest: SocketAddr,
        req: Request,
        sealer: &mut Sealer<'_>,
        deadline: Instant,
    ) -> Result<Fetched, OutboundError> {
        let response = self.transfer(dest, req, Some(sealer), deadline)?;
        self.stats.network += 1;
        Ok(Fetched {
            response,
            source: Source::Network,
        })
    }

    fn transfer(
        &mut self,
        dest: SocketAddr,
        req: Request,
        mut sealer: Option<&mut Sealer<'_>>,
        deadline: Instant,
    ) -> Result<Response, OutboundError> {
        match &self.dtls {
            Some((d, _)) if *d != dest => {
                return Err(OutboundError::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("this coaps client has a DTLS session with {d}, not {dest}"),
                )))
            }
            Some(_) => {}
            None if self.connected != Some(dest) => {
                // connected, so that an ICMP port unreachable is reported
                self.socket.connect(dest)?;
                self.connected = Some(dest);
            }
            None => {}
        }
        let (mut t, first) = Transfer::new(req, self.block);
        self.client
            .request(Instant::now(), dest, seal(&mut sealer, first)?)?;
        self.stats.exchanges += 1;
        loop {
            while let Some(tx) = self.client.poll_transmit(Instant::now()) {
                if let Some((_, c)) = self.dtls.as_mut() {
                    match c.send(&tx.bytes) {
                        Err(DtlsError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                            return Err(OutboundError::Unreachable)
                        }
                        r => r?,
                    }
                    continue;
                }
                match self.socket.send(&tx.bytes) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        return Err(OutboundError::Unreachable)
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(ev) = self.client.poll_event() {
                match ev {
                    Event::Timeout { .. } => return Err(OutboundError::Timeout),
                    Event::Reset { .. } => return Err(OutboundError::Reset),
                    ev @ Event::Response { .. } => {
                        let ev = match open(&mut sealer, ev)? {
                            Outer::Whole(ev) => ev,
                            // a proxy's outer block of a protected answer:
                            // the same protected request for the next one
                            Outer::Next(again) => {
                                self.client.request(Instant::now(), dest, again)?;
                                self.stats.exchanges += 1;
                                continue;
                            }
                        };
                        match t.on_event(ev) {
                            Some(Step::Send(next)) => {
                                self.client.request(
                                    Instant::now(),
                                    dest,
                                    seal(&mut sealer, next)?,
                                )?;
                                self.stats.exchanges += 1;
                                continue;
                            }
                            Some(Step::Done(r)) => return Ok(r),
                            Some(Step::Failed(e)) => return Err(e.into()),
                            None => return Err(OutboundError::Timeout),
                        }
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(OutboundError::Timeout);
            }
            let wake = self
                .client
                .poll_timeout()
                .map_or(deadline, |t| t.min(deadline));
            let wait = wake
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            if let Some((_, c)) = self.dtls.as_mut() {
                match c.recv(&mut self.buf, wait) {
                    Ok(Some(n)) => {
                        self.client
                            .handle_datagram(Instant::now(), dest, &self.buf[..n])
                    }
                    Ok(None) => self.client.handle_timeout(Instant::now()),
                    Err(DtlsError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        return Err(OutboundError::Unreachable)
                    }
                    Err(e) => return Err(e.into()),
                }
                continue;
            }
            self.socket.set_read_timeout(Some(wait))?;
            match self.socket.recv(&mut self.buf) {
                Ok(n) => self
                    .client
                    .handle_datagram(Instant::now(), dest, &self.buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.client.handle_timeout(Instant::now())
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(OutboundError::Unreachable)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// `r` protected by `sealer`, when there is one.
fn seal(sealer: &mut Option<&mut Sealer<'_>>, r: Request) -> Result<Request, OutboundError> {
    match sealer.as_deref_mut() {
        Some(s) => s.seal(&r).map_err(OutboundError::Oscore),
        None => Ok(r),
    }
}

/// A response verified by `sealer` (when there is one) as its inner
/// response, or the request that asks for its next outer block.
fn open(sealer: &mut Option<&mut Sealer<'_>>, ev: Event) -> Result<Outer, OutboundError> {
    match sealer.as_deref_mut() {
        Some(s) => s.open_event(ev).map_err(|e| match e {
            AnswerError::Unprotected { code, payload } => OutboundError::Refused { code, payload },
            AnswerError::Oscore(e) => OutboundError::Oscore(e),
        }),
        None => Ok(Outer::Whole(ev)),
    }
}

/// A stored response as an answer: Max-Age lowered by `age` (RFC 7252
/// 5.6.1), no exchange made.
fn from_cache(r: cache::Response, age: u32) -> Response {
    let left = r.max_age().unwrap_or(0).saturating_sub(age);
    let mut options = r.options;
    options.retain(|(n, _)| *n != OptionNumber::MAX_AGE);
    options.push((
        OptionNumber::MAX_AGE,
        Bytes::copy_from_slice(encode_uint(left, &mut [0; 4])),
    ));
    options.sort_by_key(|(n, _)| *n);
    Response {
        code: r.code,
        msg_type: MessageType::Ack,
        options,
        payload: r.payload,
        rtt: Duration::ZERO,
        retransmissions: 0,
        exchanges: 0,
    }
}
