//! The `http` path of `lab buffers`: an HTTP/1.1 GET through a proxy to a
//! CoAP server whose answer carries n payload bytes, which come back as the
//! HTTP body (the paper's TCP/HTTP rows: n bytes sent over TCP).
//!
//! - `mintgate`: the real proxy (`mintgate-proxy`: hyper, the axum router,
//!   the async upstream CoAP client), its cache off, one keep-alive
//!   connection.
//! - `naive`: a blocking proxy built here that takes a fresh `Vec` and
//!   copies at every layer, as the paper found Zephyr doing: the request
//!   read into a fresh buffer, the target into a fresh string, a fresh CoAP
//!   datagram, a fresh receive buffer, the payload copied out by the CoAP
//!   layer, again into the HTTP body, and head and body into one fresh
//!   buffer for the socket.
//!
//! The CoAP server behind both is a minimal responder on its own thread
//! that allocates nothing (stack buffers, static payload), and the client
//! reuses one buffer, so the heap allocations counted while the measured
//! messages run are the proxy's.
//!
//! `alloc_bytes`: every heap allocation of the process during the measured
//! messages, from the counting global allocator ([`mintgate_buf::heap`]),
//! divided by the messages; it includes the HTTP machinery (headers, the
//! request's state, channels), which is independent of n. `copy_bytes`:
//! naive, each copy counted where it is made; mintgate, the bytes its own
//! code copies ([`mintgate_proxy::upstream::UpstreamStats::bytes_copied`]):
//! the upstream client receives each datagram into a shared receive area
//! and the response's payload reaches hyper as a slice of it, written with
//! the head by one vectored write (the kernel's copies into and out of the
//! process are not counted, on any path; hyper's encoding of the head is
//! not instrumented).
//! `ns_per_msg`: the client's round trip, both legs included.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use mintgate_buf::{heap, Layer};
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_proxy::mapping::Authority;
use mintgate_proxy::{Listen, ProxyConfig, ProxyServer};

use super::{query_n, BufRow, Impl, PathKind, MAX_N, PATTERN};

const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the http rows cannot be measured in this process, if they cannot.
pub fn unavailable() -> Option<&'static str> {
    (!heap::installed()).then_some(
        "not measured: this binary's global allocator is not mintgate_buf::heap::CountingAlloc \
         (the mintgate binary has it)",
    )
}

/// Measures `http` for `imp` at every size: `warm` unmeasured then `msgs`
/// measured GETs per size, one outstanding.
pub fn measure(
    imp: Impl,
    sizes: &[usize],
    msgs: usize,
    warm: usize,
) -> anyhow::Result<Vec<BufRow>> {
    if let Some(why) = unavailable() {
        anyhow::bail!("{why}");
    }
    let coap = Responder::start().context("starting the CoAP responder")?;
    let result = match imp {
        Impl::Mintgate => measure_mintgate(coap.addr, sizes, msgs, warm),
        Impl::Naive => measure_naive(coap.addr, sizes, msgs, warm),
    };
    coap.stop()?;
    result
}

fn measure_mintgate(
    coap: SocketAddr,
    sizes: &[usize],
    msgs: usize,
    warm: usize,
) -> anyhow::Result<Vec<BufRow>> {
    let cfg = ProxyConfig {
        allow: vec![Authority::from(coap)],
        cache_entries: 0,
        server_timing: false,
        ..ProxyConfig::default()
    };
    let listen = Listen {
        http: Some("127.0.0.1:0".parse()?),
        h3: None,
    };
    let srv = ProxyServer::start(cfg, &listen, 1).context("starting the proxy")?;
    let http = srv
        .http_addr()
        .ok_or_else(|| anyhow!("the proxy has no HTTP listener"))?;
    let copied = || srv.proxy().upstream().stats().bytes_copied.load(Relaxed);
    run_sizes(Impl::Mintgate, http, coap, sizes, msgs, warm, copied)
}

fn measure_naive(
    coap: SocketAddr,
    sizes: &[usize],
    msgs: usize,
    warm: usize,
) -> anyhow::Result<Vec<BufRow>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let http = listener.local_addr()?;
    let copies = Arc::new(AtomicU64::new(0));
    let proxy = {
        let copies = copies.clone();
        std::thread::Builder::new()
            .name("lab-naive-proxy".into())
            .spawn(move || naive_proxy(listener, coap, &copies))?
    };
    let rows = run_sizes(Impl::Naive, http, coap, sizes, msgs, warm, || {
        copies.load(Relaxed)
    });
    // The client's connection is closed by now: the proxy's loop ends.
    let served = proxy
        .join()
        .map_err(|_| anyhow!("the naive proxy panicked"))?;
    let rows = rows?;
    served.context("the naive proxy failed")?;
    Ok(rows)
}

fn run_sizes(
    imp: Impl,
    http: SocketAddr,
    coap: SocketAddr,
    sizes: &[usize],
    msgs: usize,
    warm: usize,
    copied: impl Fn() -> u64,
) -> anyhow::Result<Vec<BufRow>> {
    let mut client = Getter::connect(http)?;
    let mut rows = Vec::new();
    for &n in sizes {
        anyhow::ensure!(n <= MAX_N, "payload {n} exceeds {MAX_N}");
        let req =
            format!("GET /hc/coap://{coap}/lab/inline?n={n} HTTP/1.1\r\nHost: {http}\r\n\r\n");
        for _ in 0..warm {
            client.get(req.as_bytes(), n)?;
        }
        let c0 = copied();
        let t0 = Instant::now();
        heap::start();
        let got = (0..msgs).try_for_each(|_| client.get(req.as_bytes(), n));
        let h = heap::stop();
        let ns = t0.elapsed().as_nanos() as f64;
        got?;
        let k = msgs.max(1) as f64;
        let alloc = h.bytes as f64 / k;
        let copy = copied().saturating_sub(c0) as f64 / k;
        let mut layers = [(0.0, 0.0); 6];
        layers[Layer::Proxy as usize] = (alloc, copy);
        rows.push(BufRow {
            path: PathKind::Http,
            imp,
            n,
            msgs: msgs as u64,
            alloc_bytes: alloc,
            copy_bytes: copy,
            ns_per_msg: ns / k,
            total_ns_per_msg: ns / k,
            layers,
        });
    }
    Ok(rows)
}

/// A keep-alive HTTP/1.1 client that allocates nothing per request.
struct Getter {
    s: TcpStream,
    buf: Box<[u8]>,
}

impl Getter {
    fn connect(addr: SocketAddr) -> anyhow::Result<Getter> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .with_context(|| format!("connecting to the proxy at {addr}"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Getter {
            s,
            buf: vec![0u8; 16 * 1024].into_boxed_slice(),
        })
    }

    /// Sends `req` and reads the whole answer, which must be 200 with an
    /// `n`-byte body.
    fn get(&mut self, req: &[u8], n: usize) -> anyhow::Result<()> {
        self.s.write_all(req)?;
        let mut have = 0;
        let head_end = loop {
            if let Some(i) = find(&self.buf[..have], b"\r\n\r\n") {
                break i + 4;
            }
            anyhow::ensure!(have < self.buf.len(), "response head too large");
            let got = self.s.read(&mut self.buf[have..])?;
            anyhow::ensure!(got > 0, "the proxy closed the connection");
            have += got;
        };
        let head = &self.buf[..head_end];
        anyhow::ensure!(
            head.starts_with(b"HTTP/1.1 200"),
            "the proxy answered {}",
            String::from_utf8_lossy(&head[..head.len().min(64)])
        );
        let len = content_length(head).ok_or_else(|| anyhow!("no content-length"))?;
        anyhow::ensure!(len == n, "body of {len} bytes, expected {n}");
        while have < head_end + len {
            let got = self.s.read(&mut self.buf[have..head_end + len])?;
            anyhow::ensure!(got > 0, "the proxy closed the connection");
            have += got;
        }
        anyhow::ensure!(
            self.buf[head_end..head_end + len] == PATTERN[..n],
            "the body is not the payload"
        );
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The Content-Length of a response head, read without allocating.
fn content_length(head: &[u8]) -> Option<usize> {
    head.split(|b| *b == b'\n').find_map(|line| {
        let (name, value) = line.split_at(line.iter().position(|b| *b == b':')?);
        if !name.eq_ignore_ascii_case(b"content-length") {
            return None;
        }
        std::str::from_utf8(&value[1..]).ok()?.trim().parse().ok()
    })
}

/// The CoAP server behind the proxies: answers GET `/lab/inline?n=N` with N
/// bytes of static payload, from stack buffers only.
struct Responder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<io::Result<()>>,
}

impl Responder {
    fn start() -> io::Result<Responder> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let addr = sock.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("lab-coap-responder".into())
                .spawn(move || {
                    let mut buf = [0u8; 1500];
                    let mut out = [0u8; 128 + MAX_N];
                    while !stop.load(Relaxed) {
                        match sock.recv_from(&mut buf) {
                            Ok((len, peer)) => {
                                if let Some(k) = answer(&buf[..len], &mut out) {
                                    sock.send_to(&out[..k], peer)?;
                                }
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                                ) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(())
                })?
        };
        Ok(Responder { addr, stop, thread })
    }

    fn stop(self) -> anyhow::Result<()> {
        self.stop.store(true, Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the CoAP responder panicked"))?
            .context("the CoAP responder failed")
    }
}

/// The answer to one request datagram, written into `out`; its length.
fn answer(dg: &[u8], out: &mut [u8]) -> Option<usize> {
    let p = Packet::new_checked(dg).ok()?;
    let n = query_n(
        p.options()
            .filter(|o| o.number == OptionNumber::URI_QUERY)
            .filter_map(|o| std::str::from_utf8(o.value).ok()),
    )?;
    let ty = match p.msg_type() {
        MessageType::Con => MessageType::Ack,
        _ => MessageType::Non,
    };
    let mut w = MessageWriter::new(out, ty, Code::CONTENT, p.message_id(), p.token()).ok()?;
    w.option_uint(OptionNumber::CONTENT_FORMAT, 42).ok()?;
    if n > 0 {
        w.payload(&PATTERN[..n]).ok()?;
    }
    Some(w.finish())
}

/// The naive proxy: one connection, one request at a time, a fresh buffer
/// and a copy at every layer; each copy is added to `copies`.
fn naive_proxy(listener: TcpListener, coap: SocketAddr, copies: &AtomicU64) -> io::Result<()> {
    listener.set_nonblocking(false)?;
    let (mut conn, _) = listener.accept()?;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_nodelay(true)?;
    let udp = UdpSocket::bind("127.0.0.1:0")?;
    udp.connect(coap)?;
    udp.set_read_timeout(Some(IO_TIMEOUT))?;
    let count = |k: usize| copies.fetch_add(k as u64, Relaxed);
    let mut mid: u16 = 1;
    loop {
        // TCP layer: the request, read into a fresh buffer.
        let mut chunk = [0u8; 2048];
        let mut req: Vec<u8> = Vec::new();
        while find(&req, b"\r\n\r\n").is_none() {
            let got = conn.read(&mut chunk)?;
            if got == 0 {
                return Ok(()); // the client is done
            }
            req.extend_from_slice(&chunk[..got]);
            count(got);
        }
        // HTTP layer: the target, copied into a string of its own.
        let line_end = find(&req, b"\r\n").unwrap_or(req.len());
        let line = String::from_utf8_lossy(&req[..line_end]).into_owned();
        count(line.len());
        let target = line
            .split(' ')
            .nth(1)
            .and_then(|t| t.strip_prefix("/hc/coap://"))
            .and_then(|t| t.split_once('/'))
            .map(|(_, rest)| rest.to_string())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad target"))?;
        count(target.len());
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        // CoAP layer: a fresh datagram, the options copied into it.
        let mut dg: Vec<u8> = vec![0x42, Code::GET.0, (mid >> 8) as u8, mid as u8, 0xab, 0xcd];
        let mut last = 0u16;
        let mut opt = |dg: &mut Vec<u8>, num: u16, v: &[u8]| {
            let delta = num - last;
            last = num;
            let ext = |x: usize| {
                if x < 13 {
                    (x as u8, None)
                } else {
                    (13, Some((x - 13) as u8))
                }
            };
            let (d, dx) = ext(delta as usize);
            let (l, lx) = ext(v.len());
            dg.push((d << 4) | l);
            dg.extend(dx);
            dg.extend(lx);
            dg.extend_from_slice(v);
            count(v.len());
        };
        for seg in path.split('/') {
            opt(&mut dg, OptionNumber::URI_PATH.0, seg.as_bytes());
        }
        if !query.is_empty() {
            opt(&mut dg, OptionNumber::URI_QUERY.0, query.as_bytes());
        }
        mid = mid.wrapping_add(1);
        udp.send(&dg)?;
        // UDP layer: a fresh receive buffer of the largest datagram.
        let mut rx = vec![0u8; 128 + MAX_N];
        let len = udp.recv(&mut rx)?;
        let p = Packet::new_checked(&rx[..len])
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad CoAP answer"))?;
        // CoAP layer: the payload copied out of the datagram.
        let payload = p.payload().to_vec();
        count(payload.len());
        // HTTP layer: the body and the head, each a fresh buffer.
        let body = payload.clone();
        count(body.len());
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        count(head.len());
        // TCP layer: head and body copied into one buffer for the socket.
        let mut wire = Vec::with_capacity(head.len() + body.len());
        wire.extend_from_slice(head.as_bytes());
        wire.extend_from_slice(&body);
        count(wire.len());
        conn.write_all(&wire)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_found_in_any_case() {
        let h = b"HTTP/1.1 200 OK\r\nContent-Type: x\r\nCONTENT-LENGTH:  42 \r\n\r\n";
        assert_eq!(content_length(h), Some(42));
        assert_eq!(content_length(b"HTTP/1.1 200 OK\r\n\r\n"), None);
    }

    #[test]
    fn the_responder_answers_with_n_bytes() {
        let mut req = [0u8; 64];
        let mut w = MessageWriter::new(&mut req, MessageType::Con, Code::GET, 7, b"tk").unwrap();
        w.option(OptionNumber::URI_PATH, b"lab").unwrap();
        w.option(OptionNumber::URI_QUERY, b"n=300").unwrap();
        let k = w.finish();
        let mut out = [0u8; 128 + MAX_N];
        let len = answer(&req[..k], &mut out).unwrap();
        let p = Packet::new_checked(&out[..len]).unwrap();
        assert_eq!(p.msg_type(), MessageType::Ack);
        assert_eq!((p.message_id(), p.token()), (7, &b"tk"[..]));
        assert_eq!(p.payload(), &PATTERN[..300]);
    }
}
