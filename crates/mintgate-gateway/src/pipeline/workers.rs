//! The handler pool's threads: they take requests from the HTP queue, run
//! the resources' handlers, and send the answers; each thread's scheduling
//! policy follows the datagram rate.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mintgate_coap::oscore::MAX_UNFRAGMENTED_SIZE;
use mintgate_coap::server::block::BlockOpt;
use mintgate_coap::server::{
    finish_response, reply_to_block, Answer, Block1Outcome, Handled, Request, Responded,
    ResponseBuilder, Router,
};
use mintgate_coap::wire::{Code, MessageType, OptionNumber, Packet};
use mintgate_sched::priority::{self, Applied, Priority};
use mintgate_sched::{BatchSwitch, PipelineCounters, Worker};

use crate::queue::{Job, Shed};
use crate::udp::SendBatch;

use super::receive::{Receiver, RECEIVER};
use super::Shared;

/// A pipeline thread's scheduling policy: `SCHED_BATCH` above
/// `pipeline.batch_sched_above` datagrams per second (all listeners
/// together), back to `SCHED_OTHER` at the thread's own nice value below;
/// see [`BatchSwitch`] for why. A thread that did not start at
/// `SCHED_OTHER` (an operator ran it under `chrt`, say) is left alone, and
/// one the kernel refuses batch stops trying. Counted in the
/// `pipeline_batch_threads` gauge only while the kernel has granted it; a
/// thread leaves batch when its loop ends (a pool thread may run the loop
/// again later).
pub(super) struct ThreadPolicy<'a> {
    counters: &'a PipelineCounters,
    switch: BatchSwitch,
    in_batch: bool,
    /// False once refused, or when the thread started at another policy.
    enabled: bool,
    what: &'static str,
}

impl<'a> ThreadPolicy<'a> {
    pub(super) fn new(sh: &'a Shared, what: &'static str) -> ThreadPolicy<'a> {
        let c = &*sh.counters;
        ThreadPolicy {
            counters: c,
            switch: BatchSwitch::new(
                sh.cfg.pipeline.batch_sched_above,
                Instant::now(),
                c.nr_datagrams.load(Relaxed),
            ),
            in_batch: false,
            enabled: sh.cfg.pipeline.batch_sched_above > 0
                && matches!(priority::current_thread_priority(), Applied::Nice(_)),
            what,
        }
    }

    /// Looks at the datagram rate and switches the calling thread if due.
    pub(super) fn update(&mut self) {
        if !self.enabled {
            return;
        }
        let c = self.counters;
        let Some(on) = self
            .switch
            .update(Instant::now(), c.nr_datagrams.load(Relaxed))
        else {
            return;
        };
        let rate = self.switch.last_rate().round() as u64;
        if on {
            match priority::set_current_thread_priority(Priority::Batch) {
                Applied::Batch(_) => {
                    self.in_batch = true;
                    c.pipeline_batch_threads.fetch_add(1, Relaxed);
                    c.pipeline_batch_switches.fetch_add(1, Relaxed);
                    self.log(rate, "to SCHED_BATCH");
                }
                other => {
                    self.enabled = false;
                    tracing::warn!(
                        thread = self.what,
                        applied = ?other,
                        "SCHED_BATCH refused; the thread stays at its policy"
                    );
                }
            }
        } else {
            self.leave();
            self.log(rate, "back to SCHED_OTHER");
        }
    }

    /// Receivers (one per listener) at info, handlers (up to
    /// [`MAX_HTP_THREADS`], switching together) at debug.
    fn log(&self, rate: u64, what: &str) {
        if self.what == RECEIVER {
            tracing::info!(datagrams_per_s = rate, "network receiver {what}");
        } else {
            tracing::debug!(datagrams_per_s = rate, "{} {what}", self.what);
        }
    }

    fn leave(&mut self) {
        if self.in_batch {
            // whatever the kernel says, the thread is no longer counted
            priority::set_current_thread_priority(Priority::Other);
            self.in_batch = false;
            self.counters.pipeline_batch_threads.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for ThreadPolicy<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The queue is full, in all or for the request's source: a NON is
/// dropped, a CON gets 5.03 with Max-Age.
pub(super) fn shed_at_queue(sh: &Shared, sb: &mut SendBatch, job: Job, why: Shed) {
    let Ok(p) = Packet::new_checked(job.block.as_slice()) else {
        return;
    };
    let con = p.msg_type() == MessageType::Con;
    match (why, con) {
        (Shed::PeerLimit, _) => &sh.counters.nr_peer_limited,
        (Shed::QueueFull, false) => &sh.counters.nr_dropped,
        (Shed::QueueFull, true) => &sh.counters.nr_rejected,
    }
    .fetch_add(1, Relaxed);
    if let Some(t) = sh
        .endpoint
        .shed(job.peer, job.listener, &p, sh.cfg.coap.overload_max_age_s)
    {
        sh.transmit(sb, t);
    }
}

/// One send batch per listener, encrypting on the coaps ones.
pub(super) fn send_batches(sh: &Shared) -> Vec<SendBatch> {
    sh.dtls
        .iter()
        .map(|d| {
            SendBatch::new(sh.cfg.pipeline.send_batch)
                .with_gso(sh.cfg.pipeline.send_gso)
                .with_dtls(d.clone())
        })
        .collect()
}

/// One HTP thread: take a batch, handle each request, send the batch.
pub(super) fn handler_loop(sh: &Shared, w: &Worker) {
    let c = &sh.counters;
    let hb = sh.cfg.pipeline.handler_batch;
    let mut jobs: Vec<Job> = Vec::with_capacity(hb);
    let mut sbs = send_batches(sh);
    let slot = w.index();
    let mut receivers: Vec<Receiver> = (0..sh.listeners.len())
        .map(|li| Receiver::new(sh, li, sh.cfg.pipeline.receive_batch))
        .collect();
    let mut policy = ThreadPolicy::new(sh, "handler");
    while !w.should_stop() {
        policy.update();
        let share = c.htp_threads.load(Relaxed).max(1) as usize;
        if sh.cfg.pipeline.handler_receives && sh.queue.is_empty_hint() {
            for r in receivers.iter_mut() {
                r.receive_once(sh, false);
            }
        }
        sh.queue
            .pop_batch(&mut jobs, hb, share, Duration::from_millis(100));
        if jobs.is_empty() {
            continue;
        }
        let t0 = Instant::now();
        let router = sh.router.read().clone();
        let n = jobs.len() as u64;
        for job in jobs.drain(..) {
            let Ok(p) = Packet::new_checked(job.block.as_slice()) else {
                continue;
            };
            // OSCORE: the router sees the inner request, the answer is
            // protected back; one that does not verify, or an outer block
            // of one, is answered here
            let mut refusal = None;
            let mut outer_block1 = None;
            let verified = match &sh.oscore {
                Some(os) if p.option(crate::oscore::OPTION).is_some() => {
                    let mut rb = sh.endpoint.builder();
                    match open_protected(sh, os, job.received, job.peer, &p, &mut rb) {
                        None => {
                            refusal = Some(rb);
                            None
                        }
                        Some((v, b)) => {
                            outer_block1 = b;
                            Some(v)
                        }
                    }
                }
                _ => None,
            };
            // the receive time stands for "now": block transfers time out
            // in seconds, and no clock is read per request. A request that
            // OSCORE verified counts as from a verified address, as one over
            // DTLS does: it is fresh (its Partial IV passed the replay
            // window) and made with the peer's key, and an Echo challenge
            // of the message layer would make the client repeat the same
            // protected bytes, a replay.
            let ticket = sh.endpoint.begin(
                slot,
                job.received,
                job.peer,
                job.listener,
                &p,
                job.identity.is_some() || sh.dtls[job.listener].is_some() || verified.is_some(),
            );
            let inner = verified
                .as_ref()
                .and_then(|v| Packet::new_checked(&v.message[..]).ok());
            let req = Request {
                peer: job.peer,
                packet: inner.as_ref().unwrap_or(&p),
                identity: verified
                    .as_ref()
                    .map(|v| v.identity.as_str())
                    .or(job.identity.as_deref()),
            };
            // writes are checked against [access]; the identity is the
            // peer's DTLS identity for requests that came over coaps, the
            // OSCORE context's for protected ones. A handler that panics
            // answers 5.00; the thread goes on.
            let oscore_id = verified.as_ref().map(|v| v.identity.as_str());
            let handled = match refusal.take() {
                Some(rb) => Handled::Respond(rb),
                None => handle_guarded(
                    sh,
                    job.received,
                    &router,
                    &req,
                    job.identity.as_deref(),
                    oscore_id,
                ),
            };
            // a protected request's inner Observe registers (or ends) a
            // relation bound to its context, on the plain answer, which is
            // then protected (RFC 8613 4.1.3.5)
            let handled = match (&sh.oscore, &verified, handled) {
                (Some(os), Some(v), Handled::Respond(mut plain)) => {
                    if req.option(OptionNumber::OBSERVE).is_some() {
                        sh.endpoint.observe_sealed(
                            job.received,
                            &router,
                            &req,
                            &ticket,
                            &mut plain,
                            os.relation(v),
                        );
                    }
                    Handled::Respond(seal(sh, os, v, plain, outer_block1))
                }
                (_, _, h) => h,
            };
            // the message layer answers the outer request (its Observe,
            // outside OSCORE, is not acted on)
            let outer = Request { packet: &p, ..req };
            // the time now: a separate response's retransmission timer
            // starts when it is sent, not when the request came
            match sh
                .endpoint
                .respond(Instant::now(), ticket, &router, &outer, handled)
            {
                Responded::Send(t) => sh.transmit(&mut sbs[job.listener], t),
                Responded::Silent => {}
                Responded::Exhausted => {
                    c.htp_shed.fetch_add(1, Relaxed);
                }
            }
        }
        drop(router);
        sh.flush(&mut sbs);
        c.htp_handled.fetch_add(n, Relaxed);
        c.htp_busy_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    }
}

/// Checks a request against `[access]` (`dtls`: the DTLS identity it came
/// with, `oscore`: the OSCORE context that verified it) and runs its
/// handler; a handler that panics answers 5.00 and is counted.
pub(super) fn handle_guarded(
    sh: &Shared,
    now: Instant,
    router: &Router,
    req: &Request<'_>,
    dtls: Option<&str>,
    oscore: Option<&str>,
) -> Handled {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        match sh.access.check_with(req, dtls, oscore) {
            Ok(()) => sh.endpoint.process(now, router, req),
            Err(why) => {
                let mut rb = sh.endpoint.builder();
                sh.access.answer(why, &mut rb);
                Handled::Respond(rb)
            }
        }
    }))
    .unwrap_or_else(|_| {
        sh.handler_panics.fetch_add(1, Relaxed);
        tracing::error!(peer = %req.peer, "a handler panicked; answered 5.00");
        let mut rb = sh.endpoint.builder();
        rb.set_code(Code::INTERNAL_SERVER_ERROR);
        Handled::Respond(rb)
    })
}

/// Answers a request that came over a reliable transport (CoAP over TCP,
/// TLS or WebSockets) on connection `connection` (its listener index): the
/// same access rules, router and request layer (Block1 included) as over
/// UDP, without the message layer's de-duplication, message IDs and
/// retransmissions. A GET with Observe registers in the endpoint's Observe
/// registry as over UDP; the notifications go to the connection's outbox.
///
/// A request with an OSCORE option is verified first, as over UDP: the
/// handler sees the inner request with the context's identity (the TLS
/// identity, if any, stays the `dtls` one the access rules see), its answer
/// and an Observe relation's notifications go back protected.
pub(super) fn serve_reliable(sh: &Shared, req: &Request<'_>, connection: usize) -> Answer {
    let router = sh.router.read().clone();
    let now = Instant::now();
    let token = req.packet.token();
    let finish = |rb| finish_response(&sh.pool, rb, MessageType::Ack, 0, token);
    let p = req.packet;
    let os = match &sh.oscore {
        Some(os) if p.option(crate::oscore::OPTION).is_some() => os,
        _ => {
            return match handle_guarded(sh, now, &router, req, req.identity, None) {
                Handled::Respond(mut rb) => {
                    sh.endpoint
                        .observe_reliable(now, &router, req, connection, &mut rb, None);
                    finish(rb)
                }
                Handled::Silent => Answer::Silent,
            }
        }
    };
    let mut rb = sh.endpoint.builder();
    let Some((v, outer_block1)) = open_protected(sh, os, now, req.peer, p, &mut rb) else {
        return finish(rb);
    };
    let Ok(inner) = Packet::new_checked(&v.message[..]) else {
        return Answer::Silent;
    };
    let ireq = Request {
        peer: req.peer,
        packet: &inner,
        identity: Some(v.identity.as_str()),
    };
    match handle_guarded(sh, now, &router, &ireq, req.identity, Some(&v.identity)) {
        Handled::Respond(mut plain) => {
            if ireq.option(OptionNumber::OBSERVE).is_some() {
                sh.endpoint.observe_reliable(
                    now,
                    &router,
                    &ireq,
                    connection,
                    &mut plain,
                    Some(os.relation(&v)),
                );
            }
            finish(seal(sh, os, &v, plain, outer_block1))
        }
        Handled::Silent => Answer::Silent,
    }
}

/// A request with an OSCORE option from `peer`: its outer blocks put
/// together first (RFC 8613 4.1.3.4.2: a proxy may cut an OSCORE message
/// into blocks; the Block1 store bounds them as any upload), then
/// verified. Inner blocks are inside the protection: the router's Block1
/// store puts those together after verification, each block a request
/// verified on its own (4.1.3.4.1).
///
/// Verified: the request, and the outer Block1 its answer carries when it
/// came in outer blocks. `None`: answer `rb`, unprotected: a block of an
/// outer transfer taken (2.31) or refused, or a request that did not
/// verify (4.01, 4.00, 4.02, or the Echo challenge of RFC 8613 B.1.2).
fn open_protected(
    sh: &Shared,
    os: &crate::oscore::OscoreServer,
    now: Instant,
    peer: std::net::SocketAddr,
    p: &Packet<&[u8]>,
    rb: &mut ResponseBuilder,
) -> Option<(crate::oscore::Verified, Option<BlockOpt>)> {
    let pool = sh.endpoint.pool();
    if let Some(o) = p.option(OptionNumber::BLOCK1) {
        // outer blocks are stored only for a context this gateway has (one
        // it does not know is refused by `unprotect`, below), and only up
        // to MAX_UNFRAGMENTED_SIZE (RFC 8613 4.1.3.4.2): beyond it the
        // message is discarded, answered 4.13 with that size
        let end = mintgate_coap::wire::decode_uint(o.value)
            .and_then(BlockOpt::decode)
            .map(|b| b.num as usize * b.size() + p.payload().len());
        if !os.knows(p) {
            return os.unprotect(pool, p, rb).map(|v| (v, None));
        }
        if end.is_some_and(|e| e > MAX_UNFRAGMENTED_SIZE) {
            rb.set_code(Code::REQUEST_ENTITY_TOO_LARGE)
                .option_uint(OptionNumber::SIZE1, MAX_UNFRAGMENTED_SIZE as u32);
            return None;
        }
    }
    match sh.endpoint.outer_block1(now, peer, p) {
        None => os.unprotect(pool, p, rb).map(|v| (v, None)),
        Some(Block1Outcome::Whole { block1 }) => {
            os.unprotect(pool, p, rb).map(|v| (v, Some(block1)))
        }
        Some(Block1Outcome::Complete { datagram, block1 }) => {
            match Packet::new_checked(&datagram[..]) {
                Ok(whole) => os.unprotect(pool, &whole, rb).map(|v| (v, Some(block1))),
                Err(_) => {
                    rb.set_code(Code::BAD_REQUEST);
                    None
                }
            }
        }
        Some(reply) => {
            if let Some(r) = reply_to_block(pool, &reply) {
                *rb = r;
            }
            None
        }
    }
}

/// The protected form of `plain`, the answer to `v`, in a builder whose
/// payload may be longer than a plain answer's by the protection's
/// overhead; with `outer_block1` when the request came in outer blocks.
fn seal(
    sh: &Shared,
    os: &crate::oscore::OscoreServer,
    v: &crate::oscore::Verified,
    plain: ResponseBuilder,
    outer_block1: Option<BlockOpt>,
) -> ResponseBuilder {
    let mut rb = sh.endpoint.sealed_builder();
    os.protect(v, plain, &mut rb);
    if let Some(b) = outer_block1 {
        rb.option_uint(OptionNumber::BLOCK1, b.encode());
    }
    rb
}
