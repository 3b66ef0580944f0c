//! The Network Receiver: datagrams from each listening socket (and coaps
//! records, decrypted) into the endpoint, then into the HTP queue.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_buf::{BlockMut, Layer};
use mintgate_coap::server::Incoming;

use crate::queue::{Job, Shed};
use crate::udp::{self, RecvBatch, SendBatch};

use super::workers::{shed_at_queue, ThreadPolicy};
use super::Shared;

/// The Network Receiver stage for one listener: read a batch, classify,
/// de-duplicate, queue. The dedicated `nr-N` thread runs it blocking; an
/// idle handler thread runs it once without blocking before it sleeps
/// (`pipeline.handler_receives`), which saves the hand-off (a futex wake and
/// a context switch) whenever requests already wait in the socket. Either
/// way the requests go through the HTP queue and are counted the same.
pub(super) struct Receiver {
    li: usize,
    batch: usize,
    rb: RecvBatch,
    blocks: Vec<BlockMut>,
    got: Vec<udp::Received>,
    jobs: Vec<Job>,
    rejected: Vec<(Job, Shed)>,
    sb: SendBatch,
    scratch: Vec<u8>,
    /// coaps: decrypted datagrams of the batch, with sender and identity.
    plain: Vec<(BlockMut, SocketAddr, Option<Arc<str>>)>,
}

impl Receiver {
    pub(super) fn new(sh: &Shared, li: usize, batch: usize) -> Receiver {
        Receiver {
            li,
            batch,
            rb: RecvBatch::new(batch),
            blocks: Vec::with_capacity(batch),
            got: Vec::with_capacity(batch),
            jobs: Vec::with_capacity(batch),
            rejected: Vec::with_capacity(batch),
            sb: SendBatch::new(batch)
                .with_gso(sh.cfg.pipeline.send_gso)
                .with_dtls(sh.dtls[li].clone()),
            plain: Vec::with_capacity(batch),
            // a coaps listener decrypts into it: room for the largest record
            scratch: vec![
                0u8;
                if sh.dtls[li].is_some() {
                    sh.cfg.coap.max_datagram.max(16 * 1024 + 256)
                } else {
                    sh.cfg.coap.max_datagram
                }
            ],
        }
    }

    /// One receive call and its processing; returns the datagrams read.
    /// Without `blocking`, spare blocks go back to the pool afterwards, so an
    /// idle handler does not sit on receive buffers.
    pub(super) fn receive_once(&mut self, sh: &Shared, blocking: bool) -> usize {
        let sock = &sh.listeners[self.li];
        let c = &sh.counters;
        let max_dgram = sh.cfg.coap.max_datagram;
        // The receiver holds no block while nothing arrives: with none in
        // hand it waits for a datagram (up to 100 ms) before taking any, so
        // an idle gateway has no block outstanding.
        if blocking && self.blocks.is_empty() && !wait_readable(sock, Duration::from_millis(100)) {
            return 0;
        }
        // Blocks are counted (Layer::Receive) when a datagram lands in them.
        while self.blocks.len() < self.batch {
            match sh.pool.alloc_uncounted(max_dgram, 0) {
                Ok(bl) => self.blocks.push(bl),
                Err(_) => break,
            }
        }
        if self.blocks.is_empty() {
            if !blocking {
                return 0;
            }
            // Pool exhausted, even after the pool asked the de-duplication
            // cache to give blocks back: shed one datagram so the socket
            // drains visibly.
            if sock.recv_from(&mut self.scratch).is_ok() {
                c.nr_datagrams.fetch_add(1, Relaxed);
                c.nr_dropped.fetch_add(1, Relaxed);
            }
            return 1;
        }
        self.got.clear();
        let n = match self
            .rb
            .recv(sock, &mut self.blocks, &mut self.got, blocking)
        {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                0
            }
            Err(e) => {
                tracing::warn!(error = %e, "receive failed");
                if blocking {
                    std::thread::sleep(Duration::from_millis(10));
                }
                0
            }
        };
        if n > 0 {
            self.process(sh, n);
        }
        if !blocking || n == 0 {
            self.blocks.clear();
        }
        n
    }

    fn process(&mut self, sh: &Shared, n: usize) {
        let c = &sh.counters;
        let now = Instant::now();
        c.nr_datagrams.fetch_add(n as u64, Relaxed);
        let mut blocks = std::mem::take(&mut self.blocks);
        let mut got = std::mem::take(&mut self.got);
        match sh.dtls[self.li].clone() {
            None => {
                let max_dgram = sh.cfg.coap.max_datagram;
                for (block, info) in blocks.drain(..n).zip(got.drain(..)) {
                    block.count_alloc(Layer::Receive);
                    // cut by the kernel, or longer than the limit although
                    // the block (the smallest that holds the limit) had room
                    if info.truncated || info.len > max_dgram {
                        c.nr_ignored.fetch_add(1, Relaxed);
                        continue;
                    }
                    self.one(sh, now, block, info.peer, None);
                }
            }
            Some(dtls) => {
                // records in, CoAP datagrams out: each decrypted datagram
                // gets a block of its own and goes the same way as a plain one
                let sock = &sh.listeners[self.li];
                let max_dgram = sh.cfg.coap.max_datagram;
                let mut plain = std::mem::take(&mut self.plain);
                for (block, info) in blocks.drain(..n).zip(got.drain(..)) {
                    // a record may exceed the plaintext limit by its own
                    // overhead; the decrypted datagram is held to it below
                    if info.truncated {
                        c.nr_ignored.fetch_add(1, Relaxed);
                        continue;
                    }
                    dtls.handle_datagram(
                        now,
                        info.peer,
                        block.as_slice(),
                        &mut self.scratch,
                        &mut |pt, id| {
                            if pt.len() > max_dgram {
                                c.nr_ignored.fetch_add(1, Relaxed);
                                return;
                            }
                            match sh.pool.alloc_uncounted(max_dgram, 0) {
                                Ok(mut b) => {
                                    b.whole_block_mut()[..pt.len()].copy_from_slice(pt);
                                    b.set_data(0..pt.len());
                                    b.count_alloc(Layer::Receive);
                                    plain.push((b, info.peer, id.cloned()));
                                }
                                Err(_) => {
                                    c.nr_dropped.fetch_add(1, Relaxed);
                                }
                            }
                        },
                        &mut |rec| {
                            if sock.send_to(rec, info.peer).is_ok() {
                                c.sh_sent.fetch_add(1, Relaxed);
                            }
                        },
                    );
                }
                for (block, peer, id) in plain.drain(..) {
                    self.one(sh, now, block, peer, id);
                }
                self.plain = plain;
            }
        }
        self.blocks = blocks;
        self.got = got;
        let sock = &sh.listeners[self.li];
        sh.queue.push_batch(&mut self.jobs, &mut self.rejected);
        for (job, why) in self.rejected.drain(..) {
            shed_at_queue(sh, &mut self.sb, job, why);
        }
        let (sent, failed) = self.sb.flush(sock);
        c.sh_sent.fetch_add(sent as u64, Relaxed);
        c.sh_errors.fetch_add(failed as u64, Relaxed);
    }

    /// Classifies and de-duplicates one CoAP datagram; a new request goes
    /// to `self.jobs`.
    fn one(
        &mut self,
        sh: &Shared,
        now: Instant,
        block: BlockMut,
        peer: SocketAddr,
        identity: Option<Arc<str>>,
    ) {
        let c = &sh.counters;
        let answer = match sh
            .endpoint
            .handle_datagram(now, peer, self.li, block.as_slice())
        {
            Incoming::Request { .. } => {
                self.jobs.push(Job {
                    peer,
                    block,
                    listener: self.li,
                    received: now,
                    identity,
                });
                return;
            }
            Incoming::Duplicate(t) => {
                c.nr_duplicates.fetch_add(1, Relaxed);
                t
            }
            Incoming::Malformed(t) => {
                c.nr_malformed.fetch_add(1, Relaxed);
                t
            }
            Incoming::Ignored(t) => {
                c.nr_ignored.fetch_add(1, Relaxed);
                t
            }
            Incoming::Consumed => None,
        };
        if let Some(t) = answer {
            sh.transmit(&mut self.sb, t);
        }
    }
}

/// Waits up to `timeout` for `sock` to have a datagram; false on timeout.
pub(super) fn wait_readable(sock: &UdpSocket, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(sock),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) > 0 }
}

/// The dedicated Network Receiver thread of listener `li`.
pub(super) fn receive_loop(sh: &Shared, li: usize) {
    let mut r = Receiver::new(sh, li, sh.cfg.pipeline.receive_batch);
    let mut policy = ThreadPolicy::new(sh, RECEIVER);
    while !sh.stop.load(Relaxed) {
        r.receive_once(sh, true);
        policy.update();
        sh.health.beat(li);
    }
}

pub(super) const RECEIVER: &str = "network receiver";
