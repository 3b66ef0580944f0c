//! The load over CoAP over TCP (RFC 8323): one connection per client, a
//! closed loop of `window` requests outstanding on each, matched by token.
//!
//! A connection starts with our CSM (7.01); requests wait for the server's
//! CSM, as RFC 8323 5.3 lets a peer expect, so the load is measured on
//! connections that are fully up. Frames are read with the one framing of
//! `mintgate_coap::wire::tcp` ([`frame_len`] to find a frame's end in the
//! stream, [`TcpPacket`] to check it); Ping is answered with Pong, Release
//! and Abort close the connection (its requests then expire as lost). The
//! request is formatted once and only its token patched per send, as over
//! UDP. A connection's input is held to our Max-Message-Size: a frame
//! announced larger closes it.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mintgate_coap::wire::tcp::{frame_from_udp, frame_len, header_len};
use mintgate_coap::wire::{Framing, Packet, Signal, TcpPacket};
use mio::net::TcpStream;
use mio::{Interest, Poll};

use crate::slots::Slots;
use crate::template::{RequestTemplate, Token, TOKEN_LEN};
use crate::worker::{run_loop, Live, Load, Outcome, Tally, Timing};

/// The Max-Message-Size our CSM announces, and the largest frame taken.
pub const MAX_MESSAGE_SIZE: u32 = 8192;
/// Bytes read per connection at once (a partial frame plus new input).
const READ_BUF: usize = 2 * MAX_MESSAGE_SIZE as usize;

struct Conn {
    /// `None` once closed (or never connected).
    sock: Option<TcpStream>,
    /// The server's CSM came: requests may go.
    ready: bool,
    /// Requests to send as soon as possible.
    owed: u32,
    queued: bool,
    /// Output not yet written, from `out_at`.
    out: Vec<u8>,
    out_at: usize,
    /// Input: `have` bytes read, a partial frame at the start.
    inbuf: Vec<u8>,
    have: usize,
}

/// One load-generating thread over TCP connections.
pub struct TcpWorker {
    poll: Poll,
    conns: Vec<Conn>,
    slots: Slots,
    cap: u32,
    /// The request frame, token zero.
    frame: Vec<u8>,
    token_at: usize,
    pending: Vec<usize>,
    timing: Timing,
    tally: Tally,
}

impl Load for TcpWorker {
    // The accessors repeat Worker's (worker.rs): Load reaches each worker's
    // own fields, and the two workers share no struct.
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
        TcpWorker::owe(self, c, 1)
    }
    fn send_due(&mut self, _now: Instant) {
        let mut todo = std::mem::take(&mut self.pending);
        for &c in &todo {
            self.conns[c].queued = false;
            self.flush(c);
        }
        // keep the allocation; `flush` may have queued some again
        todo.clear();
        todo.append(&mut self.pending);
        self.pending = todo;
    }
    /// Sends go out as answers come: nothing to wake for.
    fn wake_for_sends(&self, _now: Instant) -> Option<Instant> {
        None
    }
    fn on_event(&mut self, ev: &mio::event::Event) {
        let c = ev.token().0;
        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
            self.on_readable(c);
        }
        if ev.is_writable() {
            self.write_out(c);
        }
    }
}

/// Opens one connection per client to `target` (blocking, at most
/// `timeout` each); a connection that fails is `None` and counted by the
/// caller.
pub fn connect(target: SocketAddr, n: usize, timeout: Duration) -> Vec<io::Result<TcpStream>> {
    (0..n)
        .map(|_| {
            let s = std::net::TcpStream::connect_timeout(&target, timeout)?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            Ok(TcpStream::from_std(s))
        })
        .collect()
}

impl TcpWorker {
    /// A worker over `socks` (from [`connect`]) with `cap` requests
    /// outstanding per connection.
    pub fn new(
        socks: Vec<io::Result<TcpStream>>,
        template: &RequestTemplate,
        cap: usize,
        timing: Timing,
        bins: usize,
    ) -> io::Result<TcpWorker> {
        let poll = Poll::new()?;
        let mut tally = Tally::new(timing, bins);
        let mut csm = Vec::new();
        Signal::Csm {
            max_message_size: Some(MAX_MESSAGE_SIZE),
            block_wise: false,
        }
        .emit_vec(Framing::Stream, &[], &mut csm);
        let mut conns = Vec::with_capacity(socks.len());
        let mut pending = Vec::with_capacity(socks.len());
        for (i, s) in socks.into_iter().enumerate() {
            let sock = match s {
                Ok(mut s) => {
                    poll.registry().register(
                        &mut s,
                        mio::Token(i),
                        Interest::READABLE | Interest::WRITABLE,
                    )?;
                    pending.push(i);
                    Some(s)
                }
                Err(_) => {
                    tally.counts.io_errors += 1;
                    None
                }
            };
            conns.push(Conn {
                sock,
                ready: false,
                owed: 0,
                queued: true,
                out: csm.clone(),
                out_at: 0,
                inbuf: vec![0; READ_BUF],
                have: 0,
            });
        }
        // the UDP template's request (token of TOKEN_LEN zero bytes) as a frame
        let p = Packet::new_checked(template.bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad request template"))?;
        let mut frame = Vec::new();
        frame_from_udp(Framing::Stream, &p, &mut frame);
        let body = template.bytes().len() - 4 - TOKEN_LEN;
        let token_at = header_len(Framing::Stream, TOKEN_LEN, body) - TOKEN_LEN;
        let n = conns.len();
        Ok(TcpWorker {
            poll,
            conns,
            slots: Slots::new(n, cap, timing.start),
            cap: cap as u32,
            frame,
            token_at,
            pending,
            timing,
            tally,
        })
    }

    /// Runs until every request is answered or expired after `send_end`.
    pub fn run(self, live: &Live) -> io::Result<Outcome> {
        run_loop(self, live)
    }

    /// `c` may send `n` more requests (once the server's CSM came).
    fn owe(&mut self, c: usize, n: u32) {
        let conn = &mut self.conns[c];
        if conn.sock.is_none() {
            return;
        }
        conn.owed += n;
        if !conn.queued {
            conn.queued = true;
            self.pending.push(c);
        }
    }

    /// Queues what `c` owes (if its server is ready) and writes its output.
    fn flush(&mut self, c: usize) {
        let now = Instant::now();
        let measured = now >= self.timing.measure_start;
        if self.conns[c].ready && now < self.timing.send_end {
            while self.conns[c].owed > 0 {
                let Some(tok) = self.slots.acquire(c, 0, now, measured) else {
                    self.conns[c].owed = 0;
                    break;
                };
                let conn = &mut self.conns[c];
                conn.owed -= 1;
                let at = conn.out.len();
                conn.out.extend_from_slice(&self.frame);
                conn.out[at + self.token_at..at + self.token_at + TOKEN_LEN]
                    .copy_from_slice(&tok.to_bytes());
                // over TCP a request written is a request sent
                self.tally.counts.sent += measured as u64;
            }
        }
        self.write_out(c);
    }

    /// Writes as much of `c`'s output as the socket takes.
    fn write_out(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        let Some(sock) = conn.sock.as_mut() else {
            return;
        };
        while conn.out_at < conn.out.len() {
            match sock.write(&conn.out[conn.out_at..]) {
                Ok(0) => return self.close(c),
                Ok(n) => conn.out_at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(c),
            }
        }
        conn.out.clear();
        conn.out_at = 0;
    }

    /// The connection is gone: its outstanding requests will expire.
    fn close(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        if conn.sock.take().is_some() {
            self.tally.counts.io_errors += 1;
        }
        conn.owed = 0;
        conn.ready = false;
    }

    /// Reads everything waiting on `c`, handles each whole frame, then
    /// sends the replacements of the answered requests in one write.
    fn on_readable(&mut self, c: usize) {
        let Some(conn) = self.conns.get_mut(c) else {
            return;
        };
        let mut buf = std::mem::take(&mut conn.inbuf);
        let mut have = conn.have;
        while let Some(sock) = self.conns[c].sock.as_mut() {
            match sock.read(&mut buf[have..]) {
                Ok(0) => {
                    self.close(c);
                    break;
                }
                Ok(n) => {
                    have += n;
                    let now = Instant::now();
                    let mut at = 0;
                    let mut bad = false;
                    loop {
                        let end = match frame_len(&buf[at..have]) {
                            Ok(Some(len)) if len <= MAX_MESSAGE_SIZE as u64 => at + len as usize,
                            Ok(None) => break,
                            _ => {
                                bad = true;
                                break;
                            }
                        };
                        if end > have {
                            break;
                        }
                        bad |= !self.on_frame(c, &buf[at..end], now);
                        at = end;
                    }
                    if bad {
                        self.close(c);
                        break;
                    }
                    buf.copy_within(at..have, 0);
                    have -= at;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(c);
                    break;
                }
            }
        }
        let conn = &mut self.conns[c];
        conn.inbuf = buf;
        conn.have = have;
        if conn.sock.is_some() && (conn.owed > 0 || conn.out_at < conn.out.len()) {
            self.flush(c);
        }
    }

    /// One whole frame from `c`; false when the connection must close (a
    /// malformed frame, Release or Abort).
    fn on_frame(&mut self, c: usize, frame: &[u8], now: Instant) -> bool {
        let Ok(p) = TcpPacket::new_checked(frame, Framing::Stream) else {
            return false;
        };
        if p.is_signal() {
            return match Signal::parse(&p) {
                Ok(Signal::Csm { .. }) => {
                    if !self.conns[c].ready {
                        self.conns[c].ready = true;
                        self.owe(c, self.cap);
                    }
                    true
                }
                Ok(Signal::Ping { custody }) => {
                    Signal::Pong { custody }.emit_vec(
                        Framing::Stream,
                        p.token(),
                        &mut self.conns[c].out,
                    );
                    true
                }
                Ok(Signal::Pong { .. }) => true,
                Ok(Signal::Release { .. } | Signal::Abort { .. }) | Err(_) => false,
            };
        }
        let code = p.code();
        let done = Token::from_bytes(p.token())
            .filter(|_| code.is_response())
            .and_then(|t| self.slots.complete(c, t, None));
        match done {
            Some(d) => {
                self.tally.finished(d, Some(code), now);
                self.owe(c, 1);
            }
            None => self.tally.counts.unmatched += 1,
        }
        true
    }
}
