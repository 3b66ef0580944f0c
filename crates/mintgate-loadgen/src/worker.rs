//! One load-generating thread: its share of the clients, one mio `Poll`
//! over their sockets, its own slot table, histogram and counters.
//!
//! The loop, until the run ends: expire requests older than the timeout,
//! send what is due (closed loop: a replacement for every request that
//! completed or expired; open loop: what the schedule says), then wait for
//! readiness no longer than the next deadline, and read every ready socket
//! in batches. Nothing in the loop allocates.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use mintgate_coap::wire::{Code, MessageType};
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll};

use crate::histogram::Histogram;
use crate::schedule::Schedule;
use crate::slots::{Done, Slots};
use crate::sys::{self, RecvBatch, BATCH};
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
    /// 2.xx responses that arrived during the measured period.
    pub ok_in_window: u64,
    /// 2.xx responses in any phase (for the progress rate).
    pub ok_total: u64,
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
        self.ok_in_window += o.ok_in_window;
        self.ok_total += o.ok_total;
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

struct Client {
    sock: UdpSocket,
    fd: RawFd,
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
    slots: Slots,
    driver: Driver,
    /// Closed loop: clients with `owed > 0` (and `queued`).
    pending: Vec<usize>,
    spare: Vec<usize>,
    /// Copies of the request template, patched per send.
    batch: Vec<Box<[u8]>>,
    req_len: usize,
    gso: bool,
    rx: RecvBatch,
    timing: Timing,
    counts: Counts,
    hist: Histogram,
    per_second: Vec<u64>,
}

impl Worker {
    /// A worker over `socks` (already connected and non-blocking), `cap`
    /// slots per client; closed loop owes each client `cap` requests at start.
    pub fn new(
        socks: Vec<UdpSocket>,
        template: &RequestTemplate,
        cap: usize,
        driver: Driver,
        timing: Timing,
        bins: usize,
        gso: bool,
    ) -> io::Result<Worker> {
        let poll = Poll::new()?;
        let closed = matches!(driver, Driver::Closed);
        let mut clients = Vec::with_capacity(socks.len());
        for (i, mut sock) in socks.into_iter().enumerate() {
            poll.registry()
                .register(&mut sock, mio::Token(i), Interest::READABLE)?;
            clients.push(Client {
                fd: sock.as_raw_fd(),
                sock,
                next_mid: rand::random(),
                owed: if closed { cap as u32 } else { 0 },
                queued: closed,
            });
        }
        let n = clients.len();
        Ok(Worker {
            poll,
            slots: Slots::new(n, cap, timing.start),
            pending: if closed { (0..n).collect() } else { Vec::new() },
            spare: Vec::with_capacity(if closed { n } else { 0 }),
            clients,
            driver,
            batch: (0..BATCH).map(|_| template.bytes().into()).collect(),
            req_len: template.bytes().len(),
            gso,
            rx: RecvBatch::new(),
            timing,
            counts: Counts::default(),
            hist: Histogram::new(),
            per_second: vec![0; bins],
        })
    }

    /// Runs until every request is answered or expired after `send_end`.
    pub fn run(mut self, live: &Live) -> io::Result<Outcome> {
        let mut events = Events::with_capacity(1024);
        let t = self.timing;
        if let Some(d) = t.start.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let cpu0 = sys::thread_cpu_time();
        let mut published = t.start;
        loop {
            let now = Instant::now();
            self.expire(now);
            if now < t.send_end {
                self.send_due(now);
            } else if self.slots.outstanding() == 0 || now >= t.drain_end() {
                break;
            }
            if now.duration_since(published) >= PUBLISH_EVERY {
                self.publish(live);
                published = now;
            }
            let wake = self.next_wake(now);
            match self
                .poll
                .poll(&mut events, Some(wake.saturating_duration_since(now)))
            {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for ev in events.iter() {
                self.on_readable(ev.token().0);
            }
        }
        self.publish(live);
        Ok(Outcome {
            counts: self.counts,
            hist: self.hist,
            per_second: self.per_second,
            cpu: sys::thread_cpu_time().saturating_sub(cpu0),
        })
    }

    fn publish(&self, live: &Live) {
        let c = &self.counts;
        live.sent.store(c.sent, Relaxed);
        live.received.store(c.received, Relaxed);
        live.lost.store(c.lost, Relaxed);
        live.errors.store(c.errors, Relaxed);
        live.ok_total.store(c.ok_total, Relaxed);
    }

    /// The next moment something is due: a phase end, the oldest request's
    /// expiry, a scheduled send or a retry.
    fn next_wake(&self, now: Instant) -> Instant {
        let t = &self.timing;
        let mut wake = if now < t.send_end {
            t.send_end
        } else {
            t.drain_end()
        };
        if let Some(oldest) = self.slots.oldest() {
            wake = wake.min(oldest + t.timeout);
        }
        if now < t.send_end {
            match &self.driver {
                Driver::Open(s) => wake = wake.min(s.next_due()),
                Driver::Closed if !self.pending.is_empty() => wake = wake.min(now + RETRY),
                Driver::Closed => {}
            }
        }
        wake
    }

    /// Counts every request older than the timeout as lost.
    fn expire(&mut self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.timing.timeout) else {
            return;
        };
        while let Some((c, done)) = self.slots.expire(cutoff) {
            if done.measured {
                self.counts.lost += 1;
            }
            self.owe(c);
        }
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
                    self.flush(c);
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
                let mid = self.clients[c].next_mid;
                let Some(tok) = self.slots.acquire(c, mid, now, measured) else {
                    break;
                };
                self.clients[c].next_mid = mid.wrapping_add(1);
                RequestTemplate::patch(&mut self.batch[n], mid, tok);
                toks[n] = tok;
                n += 1;
            }
            if n == 0 {
                self.clients[c].owed = 0;
                return;
            }
            let went = match sys::send_batch(
                self.clients[c].fd,
                &mut self.batch,
                self.req_len,
                n,
                self.gso,
            ) {
                Ok(s) => s,
                Err(e) if is_transient(&e) => 0,
                Err(_) => {
                    // Counted as sent: unanswered, it expires as lost.
                    self.counts.io_errors += 1;
                    n
                }
            };
            for &tok in &toks[went..n] {
                self.slots.release(c, tok);
            }
            if measured {
                self.counts.sent += went as u64;
            }
            self.clients[c].owed -= went as u32;
            if went < n {
                if !self.clients[c].queued {
                    self.clients[c].queued = true;
                    self.pending.push(c);
                }
                return;
            }
        }
    }

    /// Open loop: one scheduled send of `c`; skipped (and counted) when all
    /// of its slots are busy or its socket buffer is full.
    fn send_one(&mut self, c: usize) {
        let now = Instant::now();
        let measured = now >= self.timing.measure_start;
        let mid = self.clients[c].next_mid;
        let Some(tok) = self.slots.acquire(c, mid, now, measured) else {
            self.counts.skipped += measured as u64;
            return;
        };
        self.clients[c].next_mid = mid.wrapping_add(1);
        let buf = &mut self.batch[0];
        RequestTemplate::patch(buf, mid, tok);
        match self.clients[c].sock.send(&buf[..self.req_len]) {
            Ok(_) => self.counts.sent += measured as u64,
            Err(e) if is_transient(&e) => {
                self.slots.release(c, tok);
                self.counts.skipped += measured as u64;
            }
            Err(_) => {
                self.counts.io_errors += 1;
                self.counts.sent += measured as u64;
            }
        }
    }

    /// Reads everything waiting on `c`'s socket, then (closed loop) sends the
    /// replacements right away.
    fn on_readable(&mut self, c: usize) {
        let Some(fd) = self.clients.get(c).map(|cl| cl.fd) else {
            return;
        };
        // Edge-triggered: read until the socket is drained. A short batch
        // means drained; a datagram arriving later raises a new event.
        let mut errors = 0;
        loop {
            match self.rx.recv(fd) {
                Ok(n) => {
                    let now = Instant::now();
                    for i in 0..n {
                        let reply = classify(self.rx.get(i));
                        self.on_reply(c, reply, now);
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
                    self.counts.io_errors += 1;
                    errors += 1;
                    if errors > 3 {
                        break;
                    }
                }
            }
        }
        if self.clients[c].owed > 0 && Instant::now() < self.timing.send_end {
            self.flush(c);
        }
    }

    fn on_reply(&mut self, c: usize, reply: Reply, now: Instant) {
        let done = match reply {
            Reply::Response {
                ty,
                mid,
                token,
                code,
            } => {
                if ty == MessageType::Con {
                    // A separate response: acknowledge it (best effort; the
                    // server retransmits if this is lost).
                    let _ = self.clients[c].sock.send(&empty_ack(mid));
                }
                let piggybacked = (ty == MessageType::Ack).then_some(mid);
                self.slots
                    .complete(c, token, piggybacked)
                    .map(|d| (d, Some(code)))
            }
            Reply::Reset { mid } => self.slots.complete_by_mid(c, mid).map(|d| (d, None)),
            Reply::EmptyAck => return,
            Reply::Other => None,
        };
        match done {
            Some((d, code)) => self.finished(c, d, code, now),
            None => self.counts.unmatched += 1,
        }
    }

    /// Accounts a completed request; `code` is `None` for a Reset.
    fn finished(&mut self, c: usize, done: Done, code: Option<Code>, now: Instant) {
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
        self.owe(c);
    }
}

/// Errors after which the same send may succeed later: a full socket buffer.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}
