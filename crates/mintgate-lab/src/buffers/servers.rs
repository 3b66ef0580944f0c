//! The lab's servers: one [`Step`] per (path, implementation), each
//! answering one message per call on a real loopback UDP socket and
//! recording its allocations and copies in an [`Accounting`]; the serving
//! loop around them, which times the stack's work apart from the socket
//! calls; and the resources and pool the CoAP paths serve from.
//!
//! Invariant: a mintgate step and its naive twin make the same socket calls
//! and the same parsing, so that what differs between them is the buffers
//! alone; payloads are at most [`MAX_N`] bytes of [`PATTERN`], which the
//! clients check.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mintgate_buf::{Accounting, BlockMut, Layer, LayerSnapshot, PartitionConfig, Pool};
use mintgate_coap::server::{
    bad_critical_option, Datagram, Dedup, Endpoint, EndpointConfig, Incoming, Outgoing, Request,
    Resource, Responded, Router, Seen, Tail,
};
use mintgate_coap::wire::{
    head_len, Code, ContentFormat, MessageType, MessageWriter, OptionNumber, Packet,
};
use mintgate_gateway::udp::{Received, RecvBatch, SendBatch};

use super::{Impl, PathKind, MAX_DGRAM, MAX_N, PATTERN};

/// The lab's pool: partitions in 64-byte steps from 128 to 1344 bytes, 64
/// blocks each, so that a block is never more than 63 bytes larger than
/// what was asked for (the gateway's default pool has two partitions, 192
/// and 1280 bytes, which would round a 256-byte response up to 1280).
pub fn lab_partitions() -> Vec<PartitionConfig> {
    (2..=21)
        .map(|k| PartitionConfig {
            block_size: 64 * k,
            blocks: 64,
        })
        .collect()
}

/// What the server side of one message does. `step` is called when a
/// datagram is waiting; it returns whether a message was answered.
/// Time spent inside socket calls is added to `sys`, so that the buffer
/// work can be told apart from the kernel's.
pub(super) trait Step: Send {
    fn step(&mut self, sock: &UdpSocket, sys: &mut Duration) -> io::Result<bool>;
    fn accounting(&self) -> &Accounting;
}

/// Runs a socket call `f`, adding its duration to `sys`.
fn sys_call<T>(sys: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    *sys += t.elapsed();
    r
}

/// Server-side sums since the last reset.
#[derive(Default)]
pub(super) struct Totals {
    pub(super) msgs: u64,
    pub(super) ns: u128,
    pub(super) sys_ns: u128,
    pub(super) layers: [LayerSnapshot; 6],
}

pub(super) fn snapshot(acc: &Accounting) -> [LayerSnapshot; 6] {
    Layer::ALL.map(|l| acc.snapshot(l))
}

/// Waits up to `timeout` for `sock` to be readable.
fn readable(sock: &UdpSocket, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    match r {
        r if r < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// The length of the datagram waiting in `sock`, without taking it.
fn peek_len(sock: &UdpSocket) -> io::Result<usize> {
    // SAFETY: a zero-length receive with MSG_TRUNC writes nothing and
    // returns the datagram's real length (Linux).
    let r = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

pub(super) fn serve(
    sock: UdpSocket,
    mut s: Box<dyn Step>,
    stop: Arc<AtomicBool>,
    totals: Arc<Mutex<Totals>>,
) -> io::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        if !readable(&sock, Duration::from_millis(50))? {
            continue;
        }
        let a0 = snapshot(s.accounting());
        let mut sys = Duration::ZERO;
        let t0 = Instant::now();
        let answered = s.step(&sock, &mut sys)?;
        let ns = t0.elapsed().as_nanos();
        let a1 = snapshot(s.accounting());
        if !answered {
            continue;
        }
        let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
        t.msgs += 1;
        t.ns += ns;
        t.sys_ns += sys.as_nanos();
        for (sum, (b, a)) in t.layers.iter_mut().zip(a1.iter().zip(a0.iter())) {
            let d = b.since(a);
            sum.allocs += d.allocs;
            sum.alloc_bytes += d.alloc_bytes;
            sum.copies += d.copies;
            sum.copy_bytes += d.copy_bytes;
        }
    }
    Ok(())
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// mintgate's echo: a block sized to the datagram, received into and sent
/// back as it is.
struct MintEcho {
    pool: Pool,
    rb: RecvBatch,
    sb: SendBatch,
    blocks: Vec<BlockMut>,
    got: Vec<Received>,
}

impl Step for MintEcho {
    fn step(&mut self, sock: &UdpSocket, sys: &mut Duration) -> io::Result<bool> {
        let len = sys_call(sys, || peek_len(sock))?;
        let block = self
            .pool
            .alloc(Layer::Receive, len.max(1), 0)
            .map_err(other)?;
        self.blocks.clear();
        self.blocks.push(block);
        self.got.clear();
        let n = sys_call(sys, || {
            self.rb.recv(sock, &mut self.blocks, &mut self.got, false)
        })?;
        let (Some(block), Some(info)) = (self.blocks.pop(), self.got.pop()) else {
            return Ok(false);
        };
        if n == 0 || info.truncated {
            return Ok(false);
        }
        let out = Outgoing {
            head: block.freeze(),
            tail: Tail::None,
        };
        self.sb.push(sock, info.peer, out);
        let (sent, _) = sys_call(sys, || self.sb.flush(sock));
        Ok(sent == 1)
    }

    fn accounting(&self) -> &Accounting {
        self.pool.accounting()
    }
}

/// The naive echo: the socket layer's buffer, the application's copy, the
/// UDP layer's copy.
struct NaiveEcho {
    acc: Accounting,
}

impl Step for NaiveEcho {
    fn step(&mut self, sock: &UdpSocket, sys: &mut Duration) -> io::Result<bool> {
        let len = sys_call(sys, || peek_len(sock))?;
        let mut rx = vec![0u8; len.max(1)];
        self.acc.record_alloc(Layer::Receive, rx.len());
        let (n, peer) = sys_call(sys, || sock.recv_from(&mut rx))?;
        rx.truncate(n);
        // the application takes the data it got
        let app = std::hint::black_box(rx.to_vec());
        self.acc.record_alloc(Layer::Handler, n);
        self.acc.record_copy(Layer::Handler, n);
        // the UDP layer builds its datagram
        let mut dgram = Vec::with_capacity(app.len());
        self.acc.record_alloc(Layer::Send, app.len());
        dgram.extend_from_slice(&app);
        self.acc.record_copy(Layer::Send, app.len());
        let sent = sys_call(sys, || sock.send_to(std::hint::black_box(&dgram), peer))?;
        Ok(sent == n)
    }

    fn accounting(&self) -> &Accounting {
        &self.acc
    }
}

/// The `n=N` query of a lab request, at most [`MAX_N`].
pub(super) fn query_n<'a>(mut query: impl Iterator<Item = &'a str>) -> Option<usize> {
    query
        .find_map(|q| q.strip_prefix("n="))
        .and_then(|v| v.parse().ok())
        .filter(|n| *n <= MAX_N)
}

/// The lab's resources: `/lab/inline?n=N` writes N bytes from the
/// application's own buffer into the response; `/lab/static?n=N` sends N
/// bytes of static memory by reference.
pub fn lab_router() -> Router {
    let app: Arc<Vec<u8>> = Arc::new(PATTERN.to_vec());
    let mut r = Router::new();
    let inline = Resource::new("lab/inline").get(move |req, rb| match query_n(req.query()) {
        Some(n) => {
            rb.content_format(ContentFormat::OCTET_STREAM)
                .write(&app[..n]);
        }
        None => {
            rb.set_code(Code::BAD_REQUEST);
        }
    });
    let stat = Resource::new("lab/static").get(|req, rb| match query_n(req.query()) {
        Some(n) => {
            rb.content_format(ContentFormat::OCTET_STREAM)
                .static_payload(&PATTERN[..n]);
        }
        None => {
            rb.set_code(Code::BAD_REQUEST);
        }
    });
    // a fresh router: these paths cannot collide
    let _ = r.add(inline);
    let _ = r.add(stat);
    r
}

fn dedup<R>() -> Dedup<R> {
    Dedup::new(4096, Duration::from_secs(247), Duration::from_secs(145))
}

/// mintgate's CoAP server path: a max-size receive block, the server
/// endpoint (classify, de-duplicate, route, handle, answer in the response
/// builder's pool blocks), `sendmmsg` of head + payload, as the gateway's
/// receiver and handler do.
struct MintCoap {
    pool: Pool,
    router: Router,
    endpoint: Endpoint,
    rb: RecvBatch,
    sb: SendBatch,
    blocks: Vec<BlockMut>,
    got: Vec<Received>,
}

/// The endpoint of the lab's mintgate path: whole answers (the paper's
/// accounting has no anti-amplification cut), up to the lab's sizes.
fn lab_endpoint(pool: &Pool) -> Endpoint {
    let cfg = EndpointConfig {
        amplification_factor: 0,
        max_payload: MAX_N,
        dedup_capacity: 4096,
        handler_slots: 1,
        ..EndpointConfig::default()
    };
    Endpoint::new(cfg, pool.clone(), Instant::now())
}

impl Step for MintCoap {
    fn step(&mut self, sock: &UdpSocket, sys: &mut Duration) -> io::Result<bool> {
        let block = self
            .pool
            .alloc(Layer::Receive, MAX_DGRAM, 0)
            .map_err(other)?;
        self.blocks.clear();
        self.blocks.push(block);
        self.got.clear();
        sys_call(sys, || {
            self.rb.recv(sock, &mut self.blocks, &mut self.got, false)
        })?;
        let (Some(block), Some(info)) = (self.blocks.pop(), self.got.pop()) else {
            return Ok(false);
        };
        if info.truncated {
            return Ok(false);
        }
        let now = Instant::now();
        let Incoming::Request { .. } =
            self.endpoint
                .handle_datagram(now, info.peer, 0, block.as_slice())
        else {
            return Ok(false);
        };
        let Ok(p) = Packet::new_checked(block.as_slice()) else {
            return Ok(false);
        };
        let ticket = self.endpoint.begin(0, now, info.peer, 0, &p, true);
        // The endpoint's process-then-respond steps, as netsim's CoAP node
        // takes them (sim/coap.rs); the I/O around them differs and the
        // crates stay apart.
        let req = Request {
            peer: info.peer,
            packet: &p,
            identity: None,
        };
        let handled = self.endpoint.process(now, &self.router, &req);
        match self
            .endpoint
            .respond(now, ticket, &self.router, &req, handled)
        {
            Responded::Send(t) => {
                let Datagram::Message(o) = t.datagram else {
                    return Ok(false);
                };
                self.sb.push(sock, info.peer, o);
                let (sent, _) = sys_call(sys, || self.sb.flush(sock));
                Ok(sent == 1)
            }
            Responded::Silent => Ok(false),
            Responded::Exhausted => Err(other("the lab pool is exhausted")),
        }
    }

    fn accounting(&self) -> &Accounting {
        self.pool.accounting()
    }
}

/// The naive CoAP server: a fresh receive buffer, the application's copy of
/// the payload, the CoAP layer's message buffer, the UDP layer's datagram.
struct NaiveCoap {
    acc: Accounting,
    dedup: Dedup<()>,
    router: Router,
    mid: u16,
}

impl NaiveCoap {
    /// The checks and the routing the real path does (critical options,
    /// the same [`Router`]): `Some(true)` for `lab/static`, and n.
    fn route(&self, peer: SocketAddr, p: &Packet<&[u8]>) -> Option<(bool, usize)> {
        if bad_critical_option(p).is_some()
            || p.option(OptionNumber::PROXY_URI).is_some()
            || p.option(OptionNumber::PROXY_SCHEME).is_some()
        {
            return None;
        }
        let req = Request {
            peer,
            packet: p,
            identity: None,
        };
        let r = self.router.find(&req)?;
        r.handler(p.code())?;
        Some((
            r.path() == PathKind::CoapStatic.resource(),
            query_n(req.query())?,
        ))
    }
}

impl Step for NaiveCoap {
    fn step(&mut self, sock: &UdpSocket, sys: &mut Duration) -> io::Result<bool> {
        let mut rx = vec![0u8; MAX_DGRAM];
        self.acc.record_alloc(Layer::Receive, rx.len());
        let (len, peer) = sys_call(sys, || sock.recv_from(&mut rx))?;
        rx.truncate(len);
        let Ok(p) = Packet::new_checked(&rx[..]) else {
            return Ok(false);
        };
        if p.msg_type() != MessageType::Non || !p.code().is_request() {
            return Ok(false);
        }
        if !matches!(
            self.dedup
                .check(Instant::now(), peer, p.message_id(), false),
            Seen::New
        ) {
            return Ok(false);
        }
        let Some((is_static, n)) = self.route(peer, &p) else {
            return Ok(false);
        };
        // the application layer: its payload in a buffer of its own
        let app_vec;
        let app: &[u8] = if is_static {
            &PATTERN[..n]
        } else {
            app_vec = std::hint::black_box(PATTERN[..n].to_vec());
            self.acc.record_alloc(Layer::Handler, n);
            self.acc.record_copy(Layer::Handler, n);
            &app_vec
        };
        // the CoAP layer: header written in place, payload copied behind it
        let cf = [(OptionNumber::CONTENT_FORMAT.0, 1usize)];
        let hl = head_len(p.token().len(), cf, n);
        let mut msg = vec![0u8; hl + n];
        self.acc.record_alloc(Layer::Coap, msg.len());
        self.mid = self.mid.wrapping_add(1);
        let mut w = MessageWriter::new(
            &mut msg,
            MessageType::Non,
            Code::CONTENT,
            self.mid,
            p.token(),
        )
        .map_err(other)?;
        w.option_uint(
            OptionNumber::CONTENT_FORMAT,
            ContentFormat::OCTET_STREAM.0 as u32,
        )
        .map_err(other)?
        .payload(app)
        .map_err(other)?;
        let mlen = w.finish();
        msg.truncate(mlen);
        self.acc.record_copy(Layer::Coap, n);
        // the UDP layer: the datagram in a buffer of its own
        let mut dgram = Vec::with_capacity(msg.len());
        self.acc.record_alloc(Layer::Send, msg.len());
        dgram.extend_from_slice(&msg);
        self.acc.record_copy(Layer::Send, msg.len());
        let sent = sys_call(sys, || sock.send_to(std::hint::black_box(&dgram), peer))?;
        Ok(sent == dgram.len())
    }

    fn accounting(&self) -> &Accounting {
        &self.acc
    }
}

pub(super) fn make_step(path: PathKind, imp: Impl) -> anyhow::Result<Box<dyn Step>> {
    let pool = || Pool::new(&lab_partitions());
    Ok(match (path, imp) {
        (PathKind::Echo, Impl::Mintgate) => Box::new(MintEcho {
            pool: pool(),
            rb: RecvBatch::new(1),
            sb: SendBatch::new(1),
            blocks: Vec::with_capacity(1),
            got: Vec::with_capacity(1),
        }),
        (PathKind::Echo, Impl::Naive) => Box::new(NaiveEcho {
            acc: Accounting::default(),
        }),
        (PathKind::Coap | PathKind::CoapStatic, Impl::Mintgate) => {
            let pool = pool();
            Box::new(MintCoap {
                endpoint: lab_endpoint(&pool),
                pool,
                router: lab_router(),
                rb: RecvBatch::new(1),
                sb: SendBatch::new(1),
                blocks: Vec::with_capacity(1),
                got: Vec::with_capacity(1),
            })
        }
        (PathKind::Coap | PathKind::CoapStatic, Impl::Naive) => Box::new(NaiveCoap {
            acc: Accounting::default(),
            dedup: dedup(),
            router: lab_router(),
            mid: 0,
        }),
        (PathKind::Http, _) => anyhow::bail!("the http path is measured by buffers::http::measure"),
    })
}
