//! One load-generating thread: its share of the clients, one mio `Poll`
//! over their sockets, its own slot table, histogram and counters.
//!
//! The loop, until the run ends: expire requests older than the timeout,
//! send what is due (closed loop: a replacement for every request that
//! completed or expired; open loop: what the schedule says), then wait for
//! readiness no longer than the next deadline, and read every ready socket
//! in batches. Nothing in the loop allocates.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use mintgate_coap::wire::{Code, MessageType};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll};

use mintgate_coap::oscore::Context;

use crate::histogram::Histogram;
use crate::oscore::Protector;
use crate::schedule::Schedule;
use crate::slots::{Done, Slots};
use crate::sys::{self, RecvBatch, BATCH, RX_BUF};
use crate::template::{classify, empty_ack, Reply, RequestTemplate, Token};

/// The run's phase boundaries, shared by all workers.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Sending starts.
    pub start: Instant,
    /// Warm-up ends, measurement starts.
    pub measure_start: Instant,
    /// Measurement and sending end.
    pub send_end: Instant,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl Timing {
    /// The run ends at the latest here: every request was sent before
    /// `send_end`, so all are answered or expired by then.
    pub fn drain_end(&self) -> Instant {
        self.send_end + self.timeout
    }
}

/// How a worker decides when to send.
pub enum Driver {
    /// Keep `window` requests outstanding per client.
    Closed,
    /// Send on the schedule.
    Open(Schedule),
}

/// Counters of one worker, also the merged counters of a run. All but
/// `ok_in_window` and `ok_total` count only requests sent during the measured
/// period.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub errors: u64,
    pub unmatched: u64,
    pub skipped: u64,
    pub io_errors: u64,
    /// Datagrams (any phase) that arrived inside a coalesced GRO train.
    pub in_trains: u64,
    /// 2.xx responses that arrived during the measured period.
    pub ok_in_window: u64,
    /// 2.xx responses in any phase (for the progress rate).
    pub ok_total: u64,
    /// OSCORE: answers to measured requests that did not verify (also
    /// counted in `errors`).
    pub undecryptable: u64,
}

impl Counts {
    /// Adds `o`.
    pub fn add(&mut self, o: &Counts) {
        self.sent += o.sent;
        self.received += o.received;
        self.lost += o.lost;
        self.errors += o.errors;
        self.unmatched += o.unmatched;
        self.skipped += o.skipped;
        self.io_errors += o.io_errors;
        self.in_trains += o.in_trains;
        self.ok_in_window += o.ok_in_window;
        self.ok_total += o.ok_total;
        self.undecryptable += o.undecryptable;
    }

    /// Publishes the counters for the progress display.
    pub fn publish(&self, live: &Live) {
        live.sent.store(self.sent, Relaxed);
        live.received.store(self.received, Relaxed);
        live.lost.store(self.lost, Relaxed);
        live.errors.store(self.errors, Relaxed);
        live.ok_total.store(self.ok_total, Relaxed);
    }
}

/// Counters a worker publishes for the progress display, on its own cache
/// lines.
#[derive(Default)]
#[repr(align(128))]
pub struct Live {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub lost: AtomicU64,
    pub errors: AtomicU64,
    pub ok_total: AtomicU64,
}

/// What a worker hands back.
pub struct Outcome {
    pub counts: Counts,
    pub hist: Histogram,
    pub per_second: Vec<u64>,
    pub cpu: Duration,
}

/// How a worker's clients reach the server.
pub enum ClientIo {
    /// One connected socket per client.
    PerClient(Vec<UdpSocket>),
    /// One socket for all (from [`sys::shared_socket`]); client `i` sends
    /// from `first + i`, a loopback address of its own.
    Shared {
        sock: UdpSocket,
        target: SocketAddrV4,
        first: Ipv4Addr,
        clients: usize,
    },
}

/// Send and receive offloads a worker uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Offload {
    /// Closed loop: send a client's batch as one `UDP_SEGMENT` train.
    pub gso: bool,
    /// Receive trains whole (`UDP_GRO`) and split them here.
    pub gro: bool,
}

/// The shared socket of [`ClientIo::Shared`].
struct Shared {
    /// Owns `fd`.
    _sock: UdpSocket,
    fd: RawFd,
    target: SocketAddrV4,
    first: u32,
}

/// The poll token of the shared socket (client sockets use their index).
const SHARED: mio::Token = mio::Token(usize::MAX);

struct Client {
    /// Its own socket; `None` when the worker's clients share one.
    sock: Option<UdpSocket>,
    /// Its own socket's descriptor, or the shared one.
    fd: RawFd,
    /// Shared socket: the local address it sends from.
    src: Ipv4Addr,
    next_mid: u16,
    /// Closed loop: requests to send as soon as possible. Invariant: never
    /// more than the client's free slots.
    owed: u32,
    /// In `pending`.
    queued: bool,
}

/// How often the progress counters are published.
const PUBLISH_EVERY: Duration = Duration::from_millis(50);
/// Retry delay after a send found the socket buffer full.
const RETRY: Duration = Duration::from_millis(1);
/// Most scheduled sends taken per loop turn, so a late worker still reads.
const MAX_DUE_PER_TURN: usize = 4096;

/// One worker thread's state.
pub struct Worker {
    poll: Poll,
    clients: Vec<Client>,
    shared: Option<Shared>,
    slots: Slots,
    driver: Driver,
    /// Closed loop: clients with `owed > 0` (and `queued`).
    pending: Vec<usize>,
    spare: Vec<usize>,
    /// Copies of the request template, patched per send.
    batch: Vec<Box<[u8]>>,
    gso: bool,
    /// Taken out while its datagrams are handled (`None` only then).
    rx: Option<RecvBatch>,
    timing: Timing,
    tally: Tally,
    /// With OSCORE: protects requests and verifies answers.
    oscore: Option<Protector>,
    /// The request template, copied back before each protected request
    /// (protection rewrites the buffer).
    tmpl: Box<[u8]>,
    /// Length of each request in `batch`.
    lens: [usize; BATCH],
}

impl Worker {
    /// A worker over `io` (sockets already non-blocking, per-client ones
    /// connected), `cap` slots per client; closed loop owes each client
    /// `cap` requests at start.
    pub fn new(
        io: ClientIo,
        template: &RequestTemplate,
        cap: usize,
        driver: Driver,
        timing: Timing,
        bins: usize,
        offload: Offload,
    ) -> io::Result<Worker> {
        let poll = Poll::new()?;
        let closed = matches!(driver, Driver::Closed);
        let owed = if closed { cap as u32 } else { 0 };
        let client = |sock: Option<UdpSocket>, fd: RawFd, src: Ipv4Addr| Client {
            sock,
            fd,
            src,
            next_mid: rand::random(),
            owed,
            queued: closed,
        };
        let (clients, shared) = match io {
            ClientIo::PerClient(socks) => {
                let mut clients = Vec::with_capacity(socks.len());
                for (i, mut sock) in socks.into_iter().enumerate() {
                    poll.registry()
                        .register(&mut sock, mio::Token(i), Interest::READABLE)?;
                    let fd = sock.as_raw_fd();
                    clients.push(client(Some(sock), fd, Ipv4Addr::UNSPECIFIED));
                }
                (clients, None)
            }
            ClientIo::Shared {
                mut sock,
                target,
                first,
                clients: n,
            } => {
                poll.registry()
                    .register(&mut sock, SHARED, Interest::READABLE)?;
                let fd = sock.as_raw_fd();
                let first = u32::from(first);
                let clients = (0..n)
                    .map(|i| client(None, fd, Ipv4Addr::from(first + i as u32)))
                    .collect();
                let shared = Shared {
                    _sock: sock,
                    fd,
                    target,
                    first,
                };
                (clients, Some(shared))
            }
        };
        let n = clients.len();
        // GRO only if every socket takes it: one buffer layout for all, so
        // where one refuses it is turned off again on the others (a train
        // read into a datagram-sized buffer would be cut short).
        let fds: Vec<RawFd> = match &shared {
            Some(sh) => vec![sh.fd],
            None => clients.iter().map(|c| c.fd).collect(),
        };
        let gro = offload.gro && fds.iter().all(|&fd| sys::set_gro(fd, true));
        if offload.gro && !gro {
            for &fd in &fds {
                sys::set_gro(fd, false);
            }
        }
        let rx = match shared {
            Some(_) => RecvBatch::addressed(gro),
            None => RecvBatch::new(gro),
        };
        Ok(Worker {
            poll,
            slots: Slots::new(n, cap, timing.start),
            pending: if closed { (0..n).collect() } else { Vec::new() },
            spare: Vec::with_capacity(if closed { n } else { 0 }),
            clients,
            shared,
            driver,
            batch: (0..BATCH)
                .map(|_| {
                    let mut b = vec![0u8; RX_BUF].into_boxed_slice();
                    b[..template.bytes().len()].copy_from_slice(template.bytes());
                    b
                })
                .collect(),
            gso: offload.gso,
            rx: Some(rx),
            timing,
            tally: Tally::new(timing, bins),
            oscore: None,
            tmpl: template.bytes().into(),
            lens: [template.bytes().len(); BATCH],
        })
    }

    /// Protects every request with OSCORE under `ctxs` (given to the
    /// clients round robin) and verifies every answer.
    pub fn with_oscore(mut self, ctxs: Vec<Context>) -> Worker {
        self.oscore = Some(Protector::new(ctxs, self.clients.len(), self.slots.cap()));
        self
    }

    /// Runs until every request is answered or expired after `send_end`.
    pub fn run(self, live: &Live) -> io::Result<Outcome> {
        run_loop(self, live)
    }

    /// Closed loop: `c` may send one more request.
    fn owe(&mut self, c: usize) {
        if let Driver::Closed = self.driver {
            let cl = &mut self.clients[c];
            cl.owed += 1;
            if !cl.queued {
                cl.queued = true;
                self.pending.push(c);
            }
        }
    }

    fn send_due(&mut self, now: Instant) {
        match self.driver {
            Driver::Closed => {
                // `flush` may re-queue into `pending` while we walk the old list.
                let mut todo =
                    std::mem::replace(&mut self.pending, std::mem::take(&mut self.spare));
                for &c in &todo {
                    self.clients[c].queued = false;
                }
                if self.shared.is_some() {
                    self.flush_shared(&todo);
                } else {
                    for &c in &todo {
                        self.flush(c);
                    }
                }
                todo.clear();
                self.spare = todo;
            }
            Driver::Open(_) => {
                let end = self.timing.send_end;
                for _ in 0..MAX_DUE_PER_TURN {
                    let Driver::Open(s) = &mut self.driver else {
                        return;
                    };
                    let Some(c) = s.take_due(now, end) else {
                        return;
                    };
                    self.send_one(c);
                }
            }
        }
    }

    /// Closed loop: sends what `c` is owed, in batches; re-queues it when the
    /// socket buffer is full.
    fn flush(&mut self, c: usize) {
        let mut toks = [Token { slot: 0, gen: 0 }; BATCH];
        while self.clients[c].owed > 0 {
            let want = (self.clients[c].owed as usize).min(BATCH);
            let now = Instant::now();
            let measured = now >= self.timing.measure_start;
            let mut n = 0;
            while n < want {
                let Some(tok) = self.prepare(c, n, now, measured) else {
                    break;
                };
                toks[n] = tok;
                n += 1;
            }
            if n == 0 {
                self.clients[c].owed = 0;
                return;
            }
            let r = sys::send_batch(self.clients[c].fd, &mut self.batch, &self.lens, n, self.gso);
            let went = self.went(r, n);
            for &tok in &toks[went..n] {
                self.slots.release(c, tok);
            }
            if measured {
                self.tally.counts.sent += went as u64;
            }
            self.clients[c].owed -= went as u32;
            if went < n {
                self.requeue(c);
                return;
            }
        }
    }

    /// Takes a slot for `c`'s next request under its next message ID and
    /// patches `batch[i]` into that request; `None` when all of `c`'s slots
    /// are busy.
    fn prepare(&mut self, c: usize, i: usize, now: Instant, measured: bool) -> Option<Token> {
        let mid = self.clients[c].next_mid;
        let tok = self.slots.acquire(c, mid, now, measured)?;
        self.clients[c].next_mid = mid.wrapping_add(1);
        let buf = &mut self.batch[i];
        let Some(p) = self.oscore.as_mut() else {
            RequestTemplate::patch(buf, mid, tok);
            return Some(tok);
        };
        let n = self.tmpl.len();
        buf[..n].copy_from_slice(&self.tmpl);
        RequestTemplate::patch(buf, mid, tok);
        match p.protect(c, tok, buf, n) {
            Ok(len) => {
                self.lens[i] = len;
                Some(tok)
            }
            Err(_) => {
                // no nonce was used for nothing: the request never leaves
                self.slots.release(c, tok);
                self.tally.counts.io_errors += 1;
                None
            }
        }
    }

    /// How many of `n` datagrams a send's result counts as sent: those sent;
    /// none when the socket buffer was full; all of them after any other
    /// error, which is counted (unanswered, they expire as lost).
    fn went(&mut self, r: io::Result<usize>, n: usize) -> usize {
        match r {
            Ok(s) => s,
            Err(e) if is_transient(&e) => 0,
            Err(_) => {
                self.tally.counts.io_errors += 1;
                n
            }
        }
    }

    /// Closed loop: `c` still owes requests; it is sent again next turn.
    fn requeue(&mut self, c: usize) {
        if !self.clients[c].queued {
            self.clients[c].queued = true;
            self.pending.push(c);
        }
    }

    /// Closed loop, shared socket: sends what every client in `todo` is
    /// owed, clients mixed in batches of up to [`BATCH`], each request from
    /// its client's address; what a full socket buffer refused is sent next
    /// turn.
    fn flush_shared(&mut self, todo: &[usize]) {
        let mut staged = Staged {
            who: [0; BATCH],
            toks: [Token { slot: 0, gen: 0 }; BATCH],
            srcs: [Ipv4Addr::UNSPECIFIED; BATCH],
            n: 0,
        };
        let now = Instant::now();
        let measured = now >= self.timing.measure_start;
        for (k, &c) in todo.iter().enumerate() {
            while self.clients[c].owed > 0 {
                if staged.n == BATCH && !self.send_staged(&mut staged, measured) {
                    for &rest in &todo[k..] {
                        if self.clients[rest].owed > 0 {
                            self.requeue(rest);
                        }
                    }
                    return;
                }
                let i = staged.n;
                let Some(tok) = self.prepare(c, i, now, measured) else {
                    self.clients[c].owed = 0;
                    break;
                };
                self.clients[c].owed -= 1;
                staged.who[i] = c;
                staged.toks[i] = tok;
                staged.srcs[i] = self.clients[c].src;
                staged.n += 1;
            }
        }
        if staged.n > 0 {
            self.send_staged(&mut staged, measured);
        }
    }

    /// Sends the staged requests in one `sendmmsg`; what did not go out is
    /// released and owed again. True when all went.
    fn send_staged(&mut self, st: &mut Staged, measured: bool) -> bool {
        let Some(sh) = &self.shared else {
            return false;
        };
        let n = st.n;
        let r = sys::send_from(sh.fd, sh.target, &self.batch, &self.lens, &st.srcs, n);
        let went = self.went(r, n);
        for i in went..n {
            let c = st.who[i];
            self.slots.release(c, st.toks[i]);
            self.clients[c].owed += 1;
            self.requeue(c);
        }
        if measured {
            self.tally.counts.sent += went as u64;
        }
        st.n = 0;
        went == n
    }

    /// One datagram from client `c`, on its own socket or the shared one.
    fn send_single(&self, c: usize, buf: &[u8]) -> io::Result<usize> {
        let cl = &self.clients[c];
        match (&cl.sock, &self.shared) {
            (Some(sock), _) => sock.send(buf),
            (None, Some(sh)) => {
                sys::send_from(sh.fd, sh.target, &[buf], &[buf.len()], &[cl.src], 1)
            }
            (None, None) => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// Open loop: one scheduled send of `c`; skipped (and counted) when all
    /// of its slots are busy or its socket buffer is full.
    fn send_one(&mut self, c: usize) {
        let now = Instant::now();
        let measured = now >= self.timing.measure_start;
        let Some(tok) = self.prepare(c, 0, now, measured) else {
            self.tally.counts.skipped += measured as u64;
            return;
        };
        let r = self.send_single(c, &self.batch[0][..self.lens[0]]);
        if self.went(r, 1) == 0 {
            // socket buffer full (the shared socket's sendmmsg may also
            // report that as nothing sent)
            self.slots.release(c, tok);
            self.tally.counts.skipped += measured as u64;
        } else {
            self.tally.counts.sent += measured as u64;
        }
    }

    /// Reads everything waiting on `c`'s socket, then (closed loop) sends the
    /// replacements right away.
    fn on_readable(&mut self, c: usize) {
        let Some(fd) = self.clients.get(c).map(|cl| cl.fd) else {
            return;
        };
        self.drain(fd, Owner::Client(c));
        if self.clients[c].owed > 0 && Instant::now() < self.timing.send_end {
            self.flush(c);
        }
    }

    /// Reads everything waiting on the shared socket, each datagram for the
    /// client whose address it was sent to, then (closed loop) sends the
    /// replacements of all of them together.
    fn on_shared_readable(&mut self) {
        let Some(sh) = self.shared.as_ref() else {
            return;
        };
        let (fd, target, first) = (sh.fd, sh.target, sh.first);
        self.drain(fd, Owner::ByAddress { target, first });
        let now = Instant::now();
        if matches!(self.driver, Driver::Closed) && now < self.timing.send_end {
            self.send_due(now);
        }
    }

    /// Reads everything waiting on `fd` and hands each message's datagrams
    /// to the client `owner` names; datagrams of no client count as
    /// unmatched. Edge-triggered: reads until the socket is drained (a short
    /// batch means drained; a datagram arriving later raises a new event).
    fn drain(&mut self, fd: RawFd, owner: Owner) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let clients = self.clients.len();
        let mut errors = 0;
        loop {
            match rx.recv(fd) {
                Ok(n) => {
                    let now = Instant::now();
                    for i in 0..n {
                        let Some(c) = owner.of(&rx, i).filter(|&c| c < clients) else {
                            self.tally.counts.unmatched += rx.datagrams(i).count() as u64;
                            continue;
                        };
                        let mut k = 0;
                        for d in rx.datagrams(i) {
                            self.on_reply(c, d, now);
                            k += 1;
                        }
                        if k > 1 {
                            self.tally.counts.in_trains += k;
                        }
                    }
                    if n < BATCH {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // E.g. ECONNREFUSED from an ICMP port unreachable: reported
                    // once, then the socket reads normally again.
                    self.tally.counts.io_errors += 1;
                    errors += 1;
                    if errors > 3 {
                        break;
                    }
                }
            }
        }
        self.rx = Some(rx);
    }

    fn on_reply(&mut self, c: usize, datagram: &[u8], now: Instant) {
        let done = match classify(datagram) {
            Reply::Response {
                ty,
                mid,
                token,
                code,
            } => {
                if ty == MessageType::Con {
                    // A separate response: acknowledge it (best effort; the
                    // server retransmits if this is lost).
                    let _ = self.send_single(c, &empty_ack(mid));
                }
                let piggybacked = (ty == MessageType::Ack).then_some(mid);
                let done = self.slots.complete(c, token, piggybacked);
                match (done, self.oscore.as_mut()) {
                    (Some(d), Some(p)) => {
                        let inner = p.verify(c, token, datagram);
                        self.tally.counts.undecryptable += u64::from(inner.is_none() && d.measured);
                        Some((d, inner))
                    }
                    (d, None) => d.map(|d| (d, Some(code))),
                    (None, Some(_)) => None,
                }
            }
            Reply::Reset { mid } => self.slots.complete_by_mid(c, mid).map(|d| (d, None)),
            Reply::EmptyAck => return,
            Reply::Other => None,
        };
        match done {
            Some((d, code)) => self.finished(c, d, code, now),
            None => self.tally.counts.unmatched += 1,
        }
    }

    /// Accounts a completed request; `code` is `None` for a Reset (or an
    /// answer that did not verify).
    fn finished(&mut self, c: usize, done: Done, code: Option<Code>, now: Instant) {
        self.tally.finished(done, code, now);
        self.owe(c);
    }
}

/// A worker's side of the event loop that [`run_loop`] drives: the UDP
/// [`Worker`] and the TCP one.
pub trait Load {
    /// The run's phases.
    fn timing(&self) -> Timing;
    /// The outstanding requests.
    fn slots(&mut self) -> &mut Slots;
    /// The counters.
    fn tally(&mut self) -> &mut Tally;
    /// The poll over the worker's sockets.
    fn poll(&mut self) -> &mut Poll;
    /// Client `c` may send one more request (one of its own expired).
    fn owe(&mut self, c: usize);
    /// Sends what is due, before `send_end`.
    fn send_due(&mut self, now: Instant);
    /// Besides phase ends and expiries, when the worker wants to wake.
    fn wake_for_sends(&self, now: Instant) -> Option<Instant>;
    /// One readiness event.
    fn on_event(&mut self, ev: &mio::event::Event);
}

/// Runs `w` until every request is answered or expired after `send_end`:
/// expire requests older than the timeout, send what is due, wait for
/// readiness no longer than the next deadline, handle what is ready.
pub fn run_loop<L: Load>(mut w: L, live: &Live) -> io::Result<Outcome> {
    let mut events = Events::with_capacity(1024);
    let t = w.timing();
    if let Some(d) = t.start.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
    let cpu0 = sys::thread_cpu_time();
    let mut published = t.start;
    loop {
        let now = Instant::now();
        if let Some(cutoff) = now.checked_sub(t.timeout) {
            while let Some((c, done)) = w.slots().expire(cutoff) {
                w.tally().counts.lost += done.measured as u64;
                w.owe(c);
            }
        }
        if now < t.send_end {
            w.send_due(now);
        } else if w.slots().outstanding() == 0 || now >= t.drain_end() {
            break;
        }
        if now.duration_since(published) >= PUBLISH_EVERY {
            w.tally().counts.publish(live);
            published = now;
        }
        // the next phase end, the oldest request's expiry, a send
        let mut wake = if now < t.send_end {
            t.send_end
        } else {
            t.drain_end()
        };
        if let Some(oldest) = w.slots().oldest() {
            wake = wake.min(oldest + t.timeout);
        }
        if now < t.send_end {
            if let Some(s) = w.wake_for_sends(now) {
                wake = wake.min(s);
            }
        }
        match w
            .poll()
            .poll(&mut events, Some(wake.saturating_duration_since(now)))
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            w.on_event(ev);
        }
    }
    w.tally().counts.publish(live);
    let tally = std::mem::replace(w.tally(), Tally::new(t, 0));
    Ok(tally.outcome(cpu0))
}

impl Load for Worker {
    // Accessors as TcpWorker's (tcp.rs): see the note there.
    fn timing(&self) -> Timing {
        self.timing
    }
    fn slots(&mut self) -> &mut Slots {
        &mut self.slots
    }
    fn tally(&mut self) -> &mut Tally {
        &mut self.tally
    }
    fn poll(&mut self) -> &mut Poll {
        &mut self.poll
    }
    fn owe(&mut self, c: usize) {
        Worker::owe(self, c)
    }
    fn send_due(&mut self, now: Instant) {
        Worker::send_due(self, now)
    }
    /// A scheduled send, or a retry of a closed loop's sends.
    fn wake_for_sends(&self, now: Instant) -> Option<Instant> {
        match &self.driver {
            Driver::Open(s) => Some(s.next_due()),
            Driver::Closed if !self.pending.is_empty() => Some(now + RETRY),
            Driver::Closed => None,
        }
    }
    fn on_event(&mut self, ev: &mio::event::Event) {
        match ev.token() {
            SHARED => self.on_shared_readable(),
            t => self.on_readable(t.0),
        }
    }
}

/// What a worker measures: its counters, latency histogram and successes
/// per second.
pub struct Tally {
    pub counts: Counts,
    pub hist: Histogram,
    pub per_second: Vec<u64>,
    timing: Timing,
}

impl Tally {
    /// Nothing counted yet; `bins` seconds of `per_second`.
    pub fn new(timing: Timing, bins: usize) -> Tally {
        Tally {
            counts: Counts::default(),
            hist: Histogram::new(),
            per_second: vec![0; bins],
            timing,
        }
    }

    /// Accounts a completed request answered with `code` at `now`; `None`
    /// for a Reset or an answer that did not verify (an error).
    pub fn finished(&mut self, done: Done, code: Option<Code>, now: Instant) {
        let ok = code.is_some_and(|c| c.class() == 2);
        if done.measured {
            self.counts.received += 1;
            self.counts.errors += !ok as u64;
            let ns = now.saturating_duration_since(done.sent_at).as_nanos();
            self.hist.record(ns.min(u64::MAX as u128) as u64);
        }
        if ok {
            self.counts.ok_total += 1;
            let t = &self.timing;
            if now >= t.measure_start && now < t.send_end {
                self.counts.ok_in_window += 1;
                let bin = now.duration_since(t.measure_start).as_secs() as usize;
                if let Some(b) = self.per_second.get_mut(bin) {
                    *b += 1;
                }
            }
        }
    }

    /// What the worker hands back, its thread's CPU time counted from `cpu0`.
    pub fn outcome(self, cpu0: Duration) -> Outcome {
        Outcome {
            counts: self.counts,
            hist: self.hist,
            per_second: self.per_second,
            cpu: sys::thread_cpu_time().saturating_sub(cpu0),
        }
    }
}

/// Whose datagrams a socket holds.
#[derive(Clone, Copy)]
enum Owner {
    /// A client's own socket.
    Client(usize),
    /// The shared socket: the client whose address a datagram was sent to,
    /// if the target sent it.
    ByAddress { target: SocketAddrV4, first: u32 },
}

impl Owner {
    /// The client message `i` of the last receive into `rx` is for.
    fn of(self, rx: &RecvBatch, i: usize) -> Option<usize> {
        match self {
            Owner::Client(c) => Some(c),
            Owner::ByAddress { target, first } => match rx.addresses(i) {
                Some((from, to)) if from == target => {
                    u32::from(to).checked_sub(first).map(|k| k as usize)
                }
                _ => None,
            },
        }
    }
}

/// Requests staged for one `sendmmsg` on the shared socket: entry `i` is
/// `batch[i]`, of client `who[i]`, from `srcs[i]`.
struct Staged {
    who: [usize; BATCH],
    toks: [Token; BATCH],
    srcs: [Ipv4Addr; BATCH],
    n: usize,
}

/// Errors after which the same send may succeed later: a full socket buffer.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}
