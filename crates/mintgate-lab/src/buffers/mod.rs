//! `lab buffers`: paper 003, Tables 3-5. Bytes allocated, bytes copied and
//! time per message for payloads of n = 128, 256, ... 1024 bytes, through
//! mintgate's pooled buffers and through a naive copy-per-layer baseline,
//! over real loopback UDP sockets.
//!
//! Paths:
//! - `echo`: a UDP echo. mintgate receives the datagram into a pool block
//!   sized to it (its length is read first with `MSG_PEEK | MSG_TRUNC`) and
//!   sends that same block back (`recvmmsg`/`sendmmsg` of the gateway's
//!   `udp` module): no byte is copied in user space.
//! - `coap`: a NON GET answered with an n-byte payload that the application
//!   holds in its own buffer, through the server code the gateway runs
//!   (the server endpoint: classify, de-duplication, a router and a
//!   resource, the response builder; `sendmmsg` of head + payload). The
//!   handler writes the payload once into the response block (n copied).
//! - `coap-static`: the same with a payload in static memory, sent by
//!   reference (no payload byte copied).
//! - `http`: an HTTP/1.1 GET through mintgate's HTTP -> CoAP proxy, the n
//!   bytes coming back as the HTTP body; heap allocations counted by the
//!   counting global allocator (see [`http`] for what is counted).
//!
//! The naive baseline does the same socket calls and the same parsing, but
//! every layer takes a fresh `Vec` and copies what it got from the layer
//! above (app -> CoAP -> UDP -> socket), as the paper found Zephyr doing.
//!
//! What is counted, per message, on the server: every allocation and copy
//! recorded in an [`Accounting`] (mintgate: the pool's own; naive: the lab
//! records each `Vec` and each copy). `alloc_bytes` is the scope of the
//! paper's measurement, the buffers of the message that carries the n bytes:
//! for `echo` the block it arrives in (it is also the one sent); for `coap`
//! the response's blocks. The CoAP request's receive buffer (a max-size
//! block or `Vec`, independent of n) is listed per layer in
//! `buffers_layers.csv` and not in `alloc_bytes`. `copy_bytes` counts every
//! user-space copy of every layer, header bytes included. The kernel's own
//! copy to and from the socket buffers is the same for both and not
//! counted. `ns_per_msg` is the server's time per message from the start
//! of the receive call to the return of the send call, less the time spent
//! inside the socket calls: the paper's measure (the stack's own work, not
//! the wire). The socket calls cost 10-20 us on loopback here, two orders
//! of magnitude more than the buffer work, and vary too much between runs
//! to leave the difference visible; the table gives the total as well.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

pub mod http;
use mintgate_buf::{Accounting, BlockMut, Layer, LayerSnapshot, PartitionConfig, Pool};
use mintgate_coap::server::{
    bad_critical_option, Datagram, Dedup, Endpoint, EndpointConfig, Incoming, Outgoing, Request,
    Resource, Responded, Router, Seen, Tail,
};
use mintgate_coap::wire::{
    head_len, Code, ContentFormat, MessageType, MessageWriter, OptionNumber, Packet,
};
use mintgate_gateway::config::{self, PoolMode};
use mintgate_gateway::udp::{Received, RecvBatch, SendBatch};
use mintgate_gateway::{Config, Gateway};
use plotters::prelude::*;

use crate::{line, paper, LabOptions, Summary};

/// Payload sizes, as in the paper (the 802.15.4 MTU is 127 bytes).
pub const SIZES: [usize; 8] = [128, 256, 384, 512, 640, 768, 896, 1024];

/// Largest request datagram the servers accept (the gateway's default
/// `coap.max_datagram`).
const MAX_DGRAM: usize = 1280;

/// Largest payload the lab resources produce.
const MAX_N: usize = 1024;

/// A server gives up on a message after this; a client after this.
const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// The bytes every payload is made of (deterministic, so that clients can
/// check what came back). Static, so that `coap-static` can send it by
/// reference.
static PATTERN: [u8; MAX_N] = pattern();

const fn pattern() -> [u8; MAX_N] {
    let mut p = [0u8; MAX_N];
    let mut i = 0;
    while i < MAX_N {
        p[i] = (i * 31 + 7) as u8;
        i += 1;
    }
    p
}

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

const ALL_PATHS: [PathKind; 4] = [
    PathKind::Echo,
    PathKind::Coap,
    PathKind::CoapStatic,
    PathKind::Http,
];

/// Which exchange is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// UDP echo.
    Echo,
    /// CoAP GET, payload produced from the application's buffer.
    Coap,
    /// CoAP GET, payload in static memory.
    CoapStatic,
    /// HTTP -> CoAP through the proxy.
    Http,
}

impl PathKind {
    /// The `path` column.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Echo => "echo",
            PathKind::Coap => "coap",
            PathKind::CoapStatic => "coap-static",
            PathKind::Http => "http",
        }
    }

    /// The lab resource's path (CoAP paths only).
    fn resource(self) -> &'static str {
        match self {
            PathKind::CoapStatic => "lab/static",
            _ => "lab/inline",
        }
    }
}

/// Which implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// mintgate's pooled, zero-copy buffers.
    Mintgate,
    /// A fresh `Vec` and a copy per layer.
    Naive,
}

impl Impl {
    /// The `impl` column.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Mintgate => "mintgate",
            Impl::Naive => "naive",
        }
    }
}

/// Per-message averages of one (path, impl, n).
#[derive(Clone, Debug)]
pub struct BufRow {
    /// The path.
    pub path: PathKind,
    /// The implementation.
    pub imp: Impl,
    /// Payload bytes.
    pub n: usize,
    /// Messages the server handled in the measurement.
    pub msgs: u64,
    /// Bytes allocated for the message carrying the payload (see the module
    /// documentation for the scope).
    pub alloc_bytes: f64,
    /// Bytes copied, every layer.
    pub copy_bytes: f64,
    /// Server time per message outside socket calls (the buffer and
    /// protocol work), ns.
    pub ns_per_msg: f64,
    /// Server time per message including the socket calls, ns.
    pub total_ns_per_msg: f64,
    /// (allocated, copied) per message for each [`Layer`], in index order.
    pub layers: [(f64, f64); 6],
}

/// A least-squares line `a * n + c`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Slope.
    pub a: f64,
    /// Intercept.
    pub c: f64,
}

/// Fits `y = a * x + c` by least squares; `None` with fewer than two
/// distinct x.
pub fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let k = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / k;
    let my = points.iter().map(|p| p.1).sum::<f64>() / k;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let a = sxy / sxx;
    Some(Fit { a, c: my - a * mx })
}

/// Messages per point on the http path, at least: the proxy's upstream
/// client takes its receive buffers 64 KiB at a time, which over few
/// messages lands as steps of 64 KiB / messages per point.
const HTTP_MIN_MSGS: usize = 2000;

/// Runs the lab: every path and implementation at every size, then a check
/// of the `coap` figures through a running [`Gateway`]. Writes
/// `buffers.csv`, `buffers_layers.csv` and `buffers.svg`.
pub fn lab_buffers(opts: &LabOptions) -> anyhow::Result<Summary> {
    let msgs = if opts.quick { 300 } else { 2000 };
    let warm = if opts.quick { 20 } else { 100 };
    let http_msgs = msgs.max(HTTP_MIN_MSGS);
    crate::create_out(&opts.out)?;
    let progress = &opts.progress;
    progress(&format!(
        "lab buffers: n = {:?}, {msgs} messages per point ({http_msgs} on http) after {warm} \
         unmeasured, one outstanding, loopback UDP",
        SIZES
    ));
    let mut rows = Vec::new();
    for path in [PathKind::Echo, PathKind::Coap, PathKind::CoapStatic] {
        for imp in [Impl::Mintgate, Impl::Naive] {
            let t0 = Instant::now();
            let got = measure(path, imp, &SIZES, msgs, warm)
                .with_context(|| format!("path {} impl {}", path.name(), imp.name()))?;
            if let (Some(first), Some(last)) = (got.first(), got.last()) {
                progress(&format!(
                    "lab buffers: {:<11} {:<8} n={}: alloc {:.0} copy {:.0} {:.0} ns | n={}: \
                     alloc {:.0} copy {:.0} {:.0} ns ({:.1} s)",
                    path.name(),
                    imp.name(),
                    first.n,
                    first.alloc_bytes,
                    first.copy_bytes,
                    first.ns_per_msg,
                    last.n,
                    last.alloc_bytes,
                    last.copy_bytes,
                    last.ns_per_msg,
                    t0.elapsed().as_secs_f64()
                ));
            }
            rows.extend(got);
        }
    }
    let http_note = match http::unavailable() {
        Some(why) => {
            progress(&format!("lab buffers: http: {why}"));
            format!("http: {why}")
        }
        None => {
            for imp in [Impl::Mintgate, Impl::Naive] {
                let t0 = Instant::now();
                let got = http::measure(imp, &SIZES, http_msgs, warm)
                    .with_context(|| format!("path http impl {}", imp.name()))?;
                if let (Some(first), Some(last)) = (got.first(), got.last()) {
                    progress(&format!(
                        "lab buffers: http        {:<8} n={}: alloc {:.0} copy {:.0} | n={}: \
                         alloc {:.0} copy {:.0} ({:.1} s)",
                        imp.name(),
                        first.n,
                        first.alloc_bytes,
                        first.copy_bytes,
                        last.n,
                        last.alloc_bytes,
                        last.copy_bytes,
                        t0.elapsed().as_secs_f64()
                    ));
                }
                rows.extend(got);
            }
            String::new()
        }
    };
    progress("lab buffers: cross-check of the coap rows through a running gateway");
    let checks = gateway_check(if opts.quick { 100 } else { 500 })?;

    let csv_path = opts.out.join("buffers.csv");
    let mut csv = String::from("path,impl,n,alloc_bytes,copy_bytes,ns_per_msg\n");
    for r in &rows {
        line(
            &mut csv,
            format_args!(
                "{},{},{},{:.1},{:.1},{:.0}",
                r.path.name(),
                r.imp.name(),
                r.n,
                r.alloc_bytes,
                r.copy_bytes,
                r.ns_per_msg
            ),
        );
    }
    crate::write_file(&csv_path, &csv)?;
    let layers_path = opts.out.join("buffers_layers.csv");
    let mut lc = String::from("path,impl,n,layer,alloc_bytes,copy_bytes\n");
    for r in &rows {
        for (l, (a, c)) in Layer::ALL.iter().zip(r.layers) {
            if a > 0.0 || c > 0.0 {
                line(
                    &mut lc,
                    format_args!(
                        "{},{},{},{},{a:.1},{c:.1}",
                        r.path.name(),
                        r.imp.name(),
                        r.n,
                        l.name()
                    ),
                );
            }
        }
    }
    crate::write_file(&layers_path, &lc)?;
    let svg_path = opts.out.join("buffers.svg");
    buffers_svg(&svg_path, &rows)?;

    let (table, met) = table(&rows, &checks, &http_note, msgs);
    Ok(Summary {
        lab: "buffers",
        table,
        files: vec![csv_path, layers_path, svg_path],
        target_met: Some(met),
    })
}

/// What the server side of one message does. `step` is called when a
/// datagram is waiting; it returns whether a message was answered.
/// Time spent inside socket calls is added to `sys`, so that the buffer
/// work can be told apart from the kernel's.
trait Step: Send {
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
struct Totals {
    msgs: u64,
    ns: u128,
    sys_ns: u128,
    layers: [LayerSnapshot; 6],
}

fn snapshot(acc: &Accounting) -> [LayerSnapshot; 6] {
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

fn serve(
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
fn query_n<'a>(mut query: impl Iterator<Item = &'a str>) -> Option<usize> {
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

fn make_step(path: PathKind, imp: Impl) -> anyhow::Result<Box<dyn Step>> {
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

/// A client of one path: sends one request of size n and checks the answer.
struct Client {
    sock: UdpSocket,
    path: PathKind,
    mid: u16,
    buf: Vec<u8>,
}

impl Client {
    fn new(server: SocketAddr, path: PathKind) -> anyhow::Result<Client> {
        let sock = UdpSocket::bind("127.0.0.1:0").context("binding the client socket")?;
        sock.connect(server)?;
        sock.set_read_timeout(Some(IO_TIMEOUT))?;
        Ok(Client {
            sock,
            path,
            mid: 0x4000,
            buf: vec![0u8; 2048],
        })
    }

    /// One exchange; an error when no (valid) answer came within the timeout.
    fn exchange(&mut self, n: usize) -> anyhow::Result<()> {
        self.mid = self.mid.wrapping_add(1);
        let token = self.mid.to_be_bytes();
        match self.path {
            PathKind::Echo => {
                self.sock.send(&PATTERN[..n])?;
            }
            _ => {
                let mut req = [0u8; 64];
                let mut q = [0u8; 8];
                let qn = {
                    use std::io::Write as _;
                    let mut c = io::Cursor::new(&mut q[..]);
                    write!(c, "n={n}")?;
                    c.position() as usize
                };
                let mut w =
                    MessageWriter::new(&mut req, MessageType::Non, Code::GET, self.mid, &token)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                w.path_options(OptionNumber::URI_PATH, self.path.resource())
                    .and_then(|w| w.option(OptionNumber::URI_QUERY, &q[..qn]))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let len = w.finish();
                self.sock.send(&req[..len])?;
            }
        }
        let got = self
            .sock
            .recv(&mut self.buf)
            .with_context(|| format!("no answer to a {n}-byte {} request", self.path.name()))?;
        let answer = &self.buf[..got];
        let payload = match self.path {
            PathKind::Echo => answer,
            _ => {
                let p = Packet::new_checked(answer).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                anyhow::ensure!(
                    p.code() == Code::CONTENT && p.token() == token,
                    "unexpected answer {:?} (token {:?})",
                    p.code(),
                    p.token()
                );
                let off = p.payload_offset();
                &answer[off..]
            }
        };
        anyhow::ensure!(
            payload == &PATTERN[..n],
            "the {} answer carried {} bytes, not the {n} expected",
            self.path.name(),
            payload.len()
        );
        Ok(())
    }
}

/// Waits (at most 2 s) until the server has counted `k` messages.
fn wait_msgs(totals: &Mutex<Totals>, k: u64) -> anyhow::Result<()> {
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let m = totals.lock().unwrap_or_else(|e| e.into_inner()).msgs;
        if m >= k {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "the server counted {m} of {k} messages"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Measures one (path, impl) at every size: a server thread on its own
/// socket, `warm` unmeasured then `msgs` measured exchanges per size, one
/// outstanding.
pub fn measure(
    path: PathKind,
    imp: Impl,
    sizes: &[usize],
    msgs: usize,
    warm: usize,
) -> anyhow::Result<Vec<BufRow>> {
    let step = make_step(path, imp)?;
    let sock = UdpSocket::bind("127.0.0.1:0").context("binding the server socket")?;
    let addr = sock.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let totals = Arc::new(Mutex::new(Totals::default()));
    let server = {
        let (stop, totals) = (stop.clone(), totals.clone());
        std::thread::Builder::new()
            .name("lab-buffers".into())
            .spawn(move || serve(sock, step, stop, totals))?
    };
    let run = || -> anyhow::Result<Vec<BufRow>> {
        let mut client = Client::new(addr, path)?;
        let mut rows = Vec::new();
        for &n in sizes {
            anyhow::ensure!(n <= MAX_N, "payload {n} exceeds {MAX_N}");
            for _ in 0..warm {
                client.exchange(n)?;
            }
            wait_msgs(&totals, warm as u64)?;
            *totals.lock().unwrap_or_else(|e| e.into_inner()) = Totals::default();
            for _ in 0..msgs {
                client.exchange(n)?;
            }
            wait_msgs(&totals, msgs as u64)?;
            let t = std::mem::take(&mut *totals.lock().unwrap_or_else(|e| e.into_inner()));
            rows.push(row(path, imp, n, &t));
        }
        Ok(rows)
    };
    let result = run();
    stop.store(true, Ordering::Relaxed);
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("the lab server panicked"))?;
    served.context("the lab server failed")?;
    result
}

fn row(path: PathKind, imp: Impl, n: usize, t: &Totals) -> BufRow {
    let k = t.msgs.max(1) as f64;
    let layers = t
        .layers
        .map(|l| (l.alloc_bytes as f64 / k, l.copy_bytes as f64 / k));
    let alloc_bytes = Layer::ALL
        .iter()
        .zip(layers)
        .filter(|(l, _)| path == PathKind::Echo || **l != Layer::Receive)
        .map(|(_, (a, _))| a)
        .sum();
    BufRow {
        path,
        imp,
        n,
        msgs: t.msgs,
        alloc_bytes,
        copy_bytes: layers.iter().map(|(_, c)| c).sum(),
        ns_per_msg: t.ns.saturating_sub(t.sys_ns) as f64 / k,
        total_ns_per_msg: t.ns as f64 / k,
        layers,
    }
}

/// The `coap` and `coap-static` accounting seen through a running gateway
/// (receiver thread, HTP queue, handler thread, `sendmmsg`).
#[derive(Clone, Copy, Debug)]
pub struct GatewayCheck {
    /// The path.
    pub path: PathKind,
    /// Payload bytes.
    pub n: usize,
    /// Messages.
    pub msgs: u64,
    /// Response bytes allocated per message (all layers but receive).
    pub alloc_bytes: f64,
    /// Bytes copied per message (all layers).
    pub copy_bytes: f64,
}

fn gateway_check(msgs: usize) -> anyhow::Result<Vec<GatewayCheck>> {
    let mut cfg = Config::default();
    cfg.coap.bind = vec!["127.0.0.1:0".parse().expect("literal address")];
    cfg.pipeline.pool = PoolMode::Fixed(1);
    // only the receiver thread takes receive blocks, one per datagram
    cfg.pipeline.handler_receives = false;
    // the paper's accounting is of whole answers: a cut one (for an
    // unverified source) is a copy the paper's pipeline does not have
    cfg.coap.amplification_factor = 0;
    cfg.buffers.partitions = lab_partitions()
        .into_iter()
        .map(|p| config::Partition {
            block_size: p.block_size,
            blocks: p.blocks,
        })
        .collect();
    let gw = Gateway::start(cfg, lab_router()).context("starting the gateway")?;
    let addr = *gw.local_addrs().first().context("no listener")?;
    let handled = || gw.counters().htp_handled.load(Ordering::Relaxed);
    let wait_handled = |k: u64| -> anyhow::Result<()> {
        let end = Instant::now() + Duration::from_secs(2);
        while handled() < k {
            anyhow::ensure!(Instant::now() < end, "the gateway handled {}", handled());
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    };
    let mut out = Vec::new();
    for (path, n) in [
        (PathKind::Coap, 256),
        (PathKind::Coap, 1024),
        (PathKind::CoapStatic, 512),
    ] {
        let mut c = Client::new(addr, path)?;
        let before_warm = handled();
        for _ in 0..10 {
            c.exchange(n)?;
        }
        wait_handled(before_warm + 10)?;
        let h0 = handled();
        let a0 = snapshot(gw.pool().accounting());
        for _ in 0..msgs {
            c.exchange(n)?;
        }
        wait_handled(h0 + msgs as u64)?;
        let a1 = snapshot(gw.pool().accounting());
        let k = (handled() - h0).max(1) as f64;
        let d: Vec<(Layer, LayerSnapshot)> = Layer::ALL
            .iter()
            .zip(a1.iter().zip(a0.iter()))
            .map(|(l, (b, a))| (*l, b.since(a)))
            .collect();
        out.push(GatewayCheck {
            path,
            n,
            msgs: k as u64,
            alloc_bytes: d
                .iter()
                .filter(|(l, _)| *l != Layer::Receive)
                .map(|(_, s)| s.alloc_bytes as f64)
                .sum::<f64>()
                / k,
            copy_bytes: d.iter().map(|(_, s)| s.copy_bytes as f64).sum::<f64>() / k,
        });
    }
    gw.shutdown();
    Ok(out)
}

fn rows_of(rows: &[BufRow], path: PathKind, imp: Impl) -> Vec<&BufRow> {
    rows.iter()
        .filter(|r| r.path == path && r.imp == imp)
        .collect()
}

fn fit_of(rows: &[&BufRow], f: fn(&BufRow) -> f64) -> Option<Fit> {
    fit(&rows.iter().map(|r| (r.n as f64, f(r))).collect::<Vec<_>>())
}

fn pct(naive: f64, ours: f64) -> f64 {
    if naive > 0.0 {
        100.0 * (naive - ours) / naive
    } else {
        0.0
    }
}

/// The printed table and whether every target held.
fn table(rows: &[BufRow], checks: &[GatewayCheck], http_note: &str, msgs: usize) -> (String, bool) {
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab buffers (paper 003, Tables 3-5): per message, {msgs} messages per point ({} on \
             http), loopback UDP, one outstanding",
            msgs.max(HTTP_MIN_MSGS)
        ),
    );
    line(
        &mut t,
        format_args!(
            "alloc = buffers of the message carrying the n bytes (echo: its receive block; coap: \
             the response; the request's receive buffer is in buffers_layers.csv), copy = every \
             user-space copy incl. header bytes, ns = server time from receive call to send \
             return less the time inside socket calls"
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:<11} | {:>5} | {:>9} {:>9} {:>8} | {:>9} {:>9} {:>8} | {:>6} {:>6} {:>6} || paper \
             Zephyr improvement (Tables 3/4/5)",
            "path",
            "n",
            "mg alloc",
            "mg copy",
            "mg ns",
            "nv alloc",
            "nv copy",
            "nv ns",
            "-alloc",
            "-copy",
            "-time"
        ),
    );
    for path in ALL_PATHS {
        let ours = rows_of(rows, path, Impl::Mintgate);
        let naive = rows_of(rows, path, Impl::Naive);
        for (m, v) in ours.iter().zip(&naive) {
            let p = |tab: &[paper::ReductionRow]| -> String {
                tab.iter()
                    .find(|r| r.n == m.n)
                    .map(|r| match path {
                        PathKind::Echo => format!("{:.1}%", r.echo),
                        PathKind::Http => format!("{:.1}%", r.http),
                        _ => format!("{:.1}%", r.coap),
                    })
                    .unwrap_or_else(|| "-".into())
            };
            line(
                &mut t,
                format_args!(
                    "{:<11} | {:>5} | {:>9.0} {:>9.0} {:>8.0} | {:>9.0} {:>9.0} {:>8.0} | {:>5.1}% \
                     {:>5.1}% {:>5.1}% || {} / {} / {}",
                    path.name(),
                    m.n,
                    m.alloc_bytes,
                    m.copy_bytes,
                    m.ns_per_msg,
                    v.alloc_bytes,
                    v.copy_bytes,
                    v.ns_per_msg,
                    pct(v.alloc_bytes, m.alloc_bytes),
                    pct(v.copy_bytes, m.copy_bytes),
                    pct(v.ns_per_msg, m.ns_per_msg),
                    p(paper::TABLE3_ALLOC),
                    p(paper::TABLE4_COPY),
                    p(paper::TABLE5_TIME),
                ),
            );
        }
    }
    let avg = |path: PathKind, f: fn(&BufRow) -> f64| -> f64 {
        let m = rows_of(rows, path, Impl::Mintgate);
        let v = rows_of(rows, path, Impl::Naive);
        let k = m.len().max(1) as f64;
        m.iter().zip(&v).map(|(m, v)| pct(f(v), f(m))).sum::<f64>() / k
    };
    for (path, pa) in [
        (PathKind::Echo, paper::AVG_ECHO),
        (PathKind::Coap, paper::AVG_COAP),
        (PathKind::CoapStatic, paper::AVG_COAP),
        (PathKind::Http, paper::AVG_HTTP),
    ] {
        if rows_of(rows, path, Impl::Mintgate).is_empty() {
            continue;
        }
        line(
            &mut t,
            format_args!(
                "average reduction {:<11}: alloc {:.1}%  copy {:.1}%  time {:.1}%   (paper {}: {:.1}% \
                 / {:.1}% / {:.1}%)",
                path.name(),
                avg(path, |r| r.alloc_bytes),
                avg(path, |r| r.copy_bytes),
                avg(path, |r| r.ns_per_msg),
                match path {
                    PathKind::Echo => "echo",
                    PathKind::Http => "http",
                    _ => "coap",
                },
                pa.0,
                pa.1,
                pa.2
            ),
        );
    }
    for path in [PathKind::Echo, PathKind::Coap, PathKind::CoapStatic] {
        let tot = |imp| {
            let rs = rows_of(rows, path, imp);
            rs.iter().map(|r| r.total_ns_per_msg).sum::<f64>() / rs.len().max(1) as f64
        };
        line(
            &mut t,
            format_args!(
                "server time with the socket calls, {:<11}: mintgate {:.0} ns, naive {:.0} ns per \
                 message (average over n; the kernel's share dominates)",
                path.name(),
                tot(Impl::Mintgate),
                tot(Impl::Naive)
            ),
        );
    }
    let rt = |imp| {
        let rs = rows_of(rows, PathKind::Http, imp);
        (!rs.is_empty()).then(|| rs.iter().map(|r| r.ns_per_msg).sum::<f64>() / rs.len() as f64)
    };
    if let (Some(m), Some(v)) = (rt(Impl::Mintgate), rt(Impl::Naive)) {
        line(
            &mut t,
            format_args!(
                "http time is the client's round trip through the proxy and the CoAP leg: mintgate \
                 {m:.0} ns, naive {v:.0} ns per message (average over n); http alloc is every heap \
                 byte of the process per message, copy the proxy's own copies"
            ),
        );
    }
    line(
        &mut t,
        format_args!("fitted lines (least squares over n = 128..1024), ours:"),
    );
    for path in ALL_PATHS {
        for imp in [Impl::Mintgate, Impl::Naive] {
            let rs = rows_of(rows, path, imp);
            let (Some(a), Some(c), Some(ns)) = (
                fit_of(&rs, |r| r.alloc_bytes),
                fit_of(&rs, |r| r.copy_bytes),
                fit_of(&rs, |r| r.ns_per_msg),
            ) else {
                continue;
            };
            line(
                &mut t,
                format_args!(
                    "  {:<11} {:<8}: alloc {:.2}n {:+.0}   copy {:.2}n {:+.0}   time {:.2}n {:+.0} ns",
                    path.name(),
                    imp.name(),
                    a.a,
                    a.c,
                    c.a,
                    c.c,
                    ns.a,
                    ns.c
                ),
            );
        }
    }
    for l in paper::P003_FITS {
        line(&mut t, format_args!("{l}"));
    }
    {
        if !http_note.is_empty() {
            line(&mut t, format_args!("{http_note}"));
        }
        let (a, c, tm) = paper::AVG_HTTP;
        let last = paper::TABLE3_ALLOC.last().map(|r| r.http).unwrap_or(0.0);
        line(
            &mut t,
            format_args!(
                "  (paper HTTP: average reduction alloc {a:.1}% copy {c:.1}% time {tm:.1}%, alloc \
                 {last:.1}% at 1024 bytes; target alloc <= 1.2n + c, copy <= n)"
            ),
        );
    }
    line(
        &mut t,
        format_args!("the same through a running gateway (receiver, HTP queue, handler thread):"),
    );
    for c in checks {
        let lab = rows
            .iter()
            .find(|r| r.path == c.path && r.imp == Impl::Mintgate && r.n == c.n);
        line(
            &mut t,
            format_args!(
                "  {:<11} n={:<5}: alloc {:.0} copy {:.0} per message over {} ({})",
                c.path.name(),
                c.n,
                c.alloc_bytes,
                c.copy_bytes,
                c.msgs,
                match lab {
                    Some(r)
                        if (r.alloc_bytes - c.alloc_bytes).abs() < 0.5
                            && (r.copy_bytes - c.copy_bytes).abs() < 0.5 =>
                        "same as the lab loop".to_string(),
                    Some(r) => format!(
                        "lab loop: alloc {:.0} copy {:.0}: DIFFERENT",
                        r.alloc_bytes, r.copy_bytes
                    ),
                    None => "no lab row".into(),
                }
            ),
        );
    }
    let (verdicts, met) = targets(rows, checks);
    for v in verdicts {
        line(&mut t, format_args!("{v}"));
    }
    (t, met)
}

/// The targets, checked point by point: echo and coap allocate at
/// most n + 128 with a fitted slope of about 1 and intercept at most 128,
/// copy at most n; coap-static copies 0 payload bytes and 0 bytes at all.
fn targets(rows: &[BufRow], checks: &[GatewayCheck]) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut all = true;
    let mut verdict = |ok: bool, what: String| {
        all &= ok;
        out.push(format!(
            "target {}: {what}",
            if ok { "met" } else { "NOT met" }
        ));
    };
    for path in [PathKind::Echo, PathKind::Coap] {
        let rs = rows_of(rows, path, Impl::Mintgate);
        let worst_c = rs
            .iter()
            .map(|r| r.alloc_bytes - r.n as f64)
            .fold(f64::MIN, f64::max);
        let f = fit_of(&rs, |r| r.alloc_bytes);
        let ok = worst_c <= 128.0 && f.is_some_and(|f| (f.a - 1.0).abs() <= 0.1 && f.c <= 128.0);
        verdict(
            ok,
            format!(
                "{}: allocated = n + c, c <= 128 (largest alloc - n: {worst_c:.0}; fit {})",
                path.name(),
                f.map(|f| format!("{:.2}n {:+.0}", f.a, f.c))
                    .unwrap_or_default()
            ),
        );
        let worst = rs
            .iter()
            .map(|r| r.copy_bytes - r.n as f64)
            .fold(f64::MIN, f64::max);
        let payload = rs
            .iter()
            .map(|r| r.layers[Layer::Handler as usize].1 - r.n as f64)
            .fold(f64::MIN, f64::max);
        verdict(
            worst <= 0.0,
            format!(
                "{}: copied <= n (largest copy - n: {worst:+.0} bytes, of which payload: \
                 {payload:+.0}{})",
                path.name(),
                if worst > payload.max(0.0) {
                    "; the rest is the CoAP header, encoded on the stack and copied into the \
                     block's headroom"
                } else {
                    ""
                }
            ),
        );
    }
    let st = rows_of(rows, PathKind::CoapStatic, Impl::Mintgate);
    let most = st.iter().map(|r| r.copy_bytes).fold(0.0, f64::max);
    let payload = st
        .iter()
        .map(|r| r.layers[Layer::Handler as usize].1)
        .fold(0.0, f64::max);
    verdict(
        payload == 0.0,
        format!("coap-static: 0 payload bytes copied (most: {payload:.0})"),
    );
    verdict(
        most == 0.0,
        format!(
            "coap-static: 0 bytes copied at all (most: {most:.0}{})",
            if most > payload {
                ", the CoAP header encoded on the stack and copied into its block"
            } else {
                ""
            }
        ),
    );
    let worst_c = st
        .iter()
        .map(|r| r.alloc_bytes - r.n as f64)
        .fold(f64::MIN, f64::max);
    verdict(
        worst_c <= 128.0,
        format!("coap-static: allocated <= n + 128 (largest alloc - n: {worst_c:.0})"),
    );
    let h = rows_of(rows, PathKind::Http, Impl::Mintgate);
    if !h.is_empty() {
        let f = fit_of(&h, |r| r.alloc_bytes);
        verdict(
            f.is_some_and(|f| f.a <= 1.2),
            format!(
                "http: allocated <= 1.2n + c (fit {})",
                f.map(|f| format!("{:.2}n {:+.0}", f.a, f.c))
                    .unwrap_or_default()
            ),
        );
        let worst = h
            .iter()
            .map(|r| r.copy_bytes - r.n as f64)
            .fold(f64::MIN, f64::max);
        verdict(
            worst <= 0.0,
            format!(
                "http: copied <= n (largest copy - n: {worst:+.0} bytes{})",
                if worst > 0.0 {
                    ": copied by the upstream client out of received datagrams"
                } else {
                    ""
                }
            ),
        );
    }
    let consistent = checks.iter().all(|c| {
        rows.iter()
            .find(|r| r.path == c.path && r.imp == Impl::Mintgate && r.n == c.n)
            .is_some_and(|r| {
                (r.alloc_bytes - c.alloc_bytes).abs() < 0.5
                    && (r.copy_bytes - c.copy_bytes).abs() < 0.5
            })
    });
    verdict(
        consistent,
        "the running gateway allocates and copies what the lab loop does".into(),
    );
    (out, all)
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}

/// `buffers.svg`: allocated, copied and time per message against n, one
/// line per (path, impl); the paper's improved-Zephyr lines and the
/// minimal-resource standard as references.
fn buffers_svg(path: &Path, rows: &[BufRow]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 1200)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((3, 1));
    let series: [(PathKind, Impl, RGBColor); 8] = [
        (PathKind::Echo, Impl::Mintgate, RGBColor(0x1f, 0x77, 0xb4)),
        (PathKind::Echo, Impl::Naive, RGBColor(0xae, 0xc7, 0xe8)),
        (PathKind::Coap, Impl::Mintgate, RGBColor(0xd6, 0x27, 0x28)),
        (PathKind::Coap, Impl::Naive, RGBColor(0xff, 0x98, 0x96)),
        (
            PathKind::CoapStatic,
            Impl::Mintgate,
            RGBColor(0x2c, 0xa0, 0x2c),
        ),
        (
            PathKind::CoapStatic,
            Impl::Naive,
            RGBColor(0x98, 0xdf, 0x8a),
        ),
        (PathKind::Http, Impl::Mintgate, RGBColor(0x94, 0x67, 0xbd)),
        (PathKind::Http, Impl::Naive, RGBColor(0xc5, 0xb0, 0xd5)),
    ];
    type Metric = fn(&BufRow) -> f64;
    let metrics: [(&str, &str, Metric); 3] = [
        ("bytes allocated per message", "bytes", |r| r.alloc_bytes),
        ("bytes copied per message", "bytes", |r| r.copy_bytes),
        ("server time per message", "ns", |r| r.ns_per_msg),
    ];
    let x = 0f64..1100f64;
    for (i, (area, (title, unit, f))) in panels.iter().zip(metrics).enumerate() {
        // http's time is a client round trip (tens of us): not on the
        // server-time panel, whose scale is the buffer work's.
        let shown = |p: PathKind| i != 2 || p != PathKind::Http;
        let ymax = rows
            .iter()
            .filter(|r| shown(r.path))
            .map(f)
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{title} (paper 003 Table {}; mintgate vs naive)", 3 + i),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(x.clone(), 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("payload n (bytes)")
            .y_desc(unit)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(err)?;
        for (p, imp, color) in series.into_iter().filter(|s| shown(s.0)) {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.path == p && r.imp == imp)
                .map(|r| (r.n as f64, f(r)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(format!("{} {}", p.name(), imp.name()))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(pts.into_iter().map(|q| Circle::new(q, 3, color.filled())))
                .map_err(err)?;
        }
        let refs: &[(&str, f64, f64)] = match i {
            0 => &[
                ("paper: improved Zephyr UDP 1.18n + 300", 1.18, 300.0),
                ("minimal standard n + 48 (UDP headers)", 1.0, 48.0),
            ],
            1 => &[
                ("paper: improved Zephyr UDP n + 46", 1.0, 46.0),
                ("paper: Zephyr UDP 3n (+ d, not given)", 3.0, 0.0),
            ],
            _ => &[],
        };
        for (k, (label, a, c)) in refs.iter().enumerate() {
            let color = if k == 0 {
                BLACK
            } else {
                RGBColor(0x7f, 0x7f, 0x7f)
            };
            let pts: Vec<(f64, f64)> = [128.0, 1024.0].iter().map(|n| (*n, a * n + c)).collect();
            chart
                .draw_series(DashedLineSeries::new(pts, 6, 4, color.stroke_width(1)))
                .map_err(err)?
                .label(*label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_line_and_refuses_a_point() {
        let pts: Vec<(f64, f64)> = SIZES
            .iter()
            .map(|n| (*n as f64, 2.5 * *n as f64 + 40.0))
            .collect();
        let f = fit(&pts).unwrap();
        assert!(
            (f.a - 2.5).abs() < 1e-9 && (f.c - 40.0).abs() < 1e-6,
            "{f:?}"
        );
        assert!(fit(&[(1.0, 1.0)]).is_none());
        assert!(fit(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
    }

    #[test]
    fn query_n_is_bounded() {
        assert_eq!(query_n(["a=1", "n=512"].into_iter()), Some(512));
        assert_eq!(query_n(["n=2048"].into_iter()), None);
        assert_eq!(query_n(["n=x"].into_iter()), None);
    }

    /// Few messages, but real sockets and real accounting: the zero-copy
    /// echo copies nothing and allocates one block that fits the datagram;
    /// the naive one copies twice per message.
    #[test]
    fn echo_accounting_per_message() {
        let m = measure(PathKind::Echo, Impl::Mintgate, &[256, 1024], 20, 2).unwrap();
        for r in &m {
            assert_eq!(r.msgs, 20);
            assert_eq!(r.copy_bytes, 0.0, "{r:?}");
            assert!(
                r.alloc_bytes >= r.n as f64 && r.alloc_bytes < r.n as f64 + 64.0,
                "{r:?}"
            );
        }
        let v = measure(PathKind::Echo, Impl::Naive, &[256], 20, 2).unwrap();
        assert_eq!(v[0].copy_bytes, 512.0, "{:?}", v[0]);
        assert_eq!(v[0].alloc_bytes, 768.0, "{:?}", v[0]);
    }

    #[test]
    fn coap_paths_answer_and_count() {
        let m = measure(PathKind::Coap, Impl::Mintgate, &[512], 10, 2).unwrap();
        // the handler copies the n payload bytes once
        assert_eq!(m[0].layers[Layer::Handler as usize].1, 512.0, "{:?}", m[0]);
        let s = measure(PathKind::CoapStatic, Impl::Mintgate, &[512], 10, 2).unwrap();
        assert_eq!(s[0].layers[Layer::Handler as usize].1, 0.0, "{:?}", s[0]);
        assert!(s[0].alloc_bytes < 512.0, "{:?}", s[0]);
        let v = measure(PathKind::Coap, Impl::Naive, &[512], 10, 2).unwrap();
        assert!(v[0].copy_bytes >= 3.0 * 512.0, "{:?}", v[0]);
        assert!(make_step(PathKind::Http, Impl::Mintgate).is_err());
    }
}
