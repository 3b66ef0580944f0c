//! The lab's measurements: the client side of each path (one request
//! outstanding, every answer checked against the pattern), the per-size
//! runs that turn a server's sums into per-message [`BufRow`]s, and the
//! same accounting seen through a running gateway ([`GatewayCheck`]).
//!
//! Invariant: only measured exchanges count (the warm-up ones are reset
//! away), and a row is taken only once the server has counted every
//! message the client sent.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use mintgate_buf::{Layer, LayerSnapshot};
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_gateway::config::{self, PoolMode};
use mintgate_gateway::{Config, Gateway};

use super::servers::{make_step, serve, snapshot, Totals};
use super::{lab_partitions, lab_router, Impl, PathKind, IO_TIMEOUT, MAX_N, PATTERN};

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

pub(super) fn gateway_check(msgs: usize) -> anyhow::Result<Vec<GatewayCheck>> {
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
