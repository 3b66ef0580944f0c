//! The timer and notifier threads: the endpoint's timeouts and
//! retransmissions, the coaps sweeps, and Observe notifications.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::workers::send_batches;
use super::Shared;

/// Drives the endpoint's timeouts (empty ACKs for slow handlers, CON
/// retransmissions, expiry) and the coaps sessions' sweeps.
pub(super) fn timer_loop(sh: &Shared) {
    let tick = (Duration::from_millis(sh.cfg.coap.separate_response_after_ms) / 4)
        .clamp(Duration::from_millis(5), Duration::from_millis(250));
    let mut sbs = send_batches(sh);
    while !sh.stop.load(Relaxed) {
        sh.health.beat(sh.listeners.len() + 1);
        std::thread::sleep(tick);
        let now = Instant::now();
        sh.endpoint.handle_timeout(now);
        while let Some(t) = sh.endpoint.poll_transmit() {
            sh.send(&mut sbs, t);
        }
        sh.flush(&mut sbs);
        // coaps: handshake retransmissions, idle and stalled sessions
        for (li, d) in sh.dtls.iter().enumerate() {
            if let Some(d) = d {
                let sock = &sh.listeners[li];
                d.sweep(now, &mut |peer, rec| {
                    let _ = sock.send_to(rec, peer);
                });
            }
        }
    }
}

/// The `coap-notify` thread: has the endpoint render and send the
/// notifications of the resources marked changed (those to CoAP-over-TCP
/// and -WebSocket observers go to their connections' outboxes).
pub(super) fn notify_loop(sh: &Shared) {
    let mut sbs = send_batches(sh);
    let mut out = Vec::new();
    while !sh.stop.load(Relaxed) {
        sh.health.beat(sh.listeners.len());
        let paths = sh.observe.take_dirty(Duration::from_millis(100));
        if paths.is_empty() {
            continue;
        }
        let router = sh.router.read().clone();
        let now = Instant::now();
        for p in &paths {
            sh.endpoint.notify(now, &router, p, &mut out);
            for t in out.drain(..) {
                sh.send(&mut sbs, t);
            }
        }
        sh.flush(&mut sbs);
    }
}
