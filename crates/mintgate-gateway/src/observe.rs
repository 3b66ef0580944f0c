//! Observe (RFC 7641) in the gateway: the set of resources changed since
//! the notifier thread last ran, and the [`Notifier`] handle that devices
//! and the direct path use to say "this resource changed". The relations
//! themselves (who observes what, CON cadence, how they end) belong to the
//! CoAP server endpoint ([`mintgate_coap::server::Endpoint`]).
//!
//! [`Notifier::notify`] never sends: it marks the path and wakes the
//! `coap-notify` thread, so it is cheap enough for a driver thread or the
//! direct path's worker. That thread has the endpoint render each changed
//! resource once per observer through its GET handler and sends the
//! notifications (see `pipeline::notify_loop`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use mintgate_coap::server::observe::Ended;
use mintgate_coap::server::{Endpoint, EndpointStats};
use parking_lot::{Condvar, Mutex};

/// What the pipeline shares about Observe.
pub struct ObserveState {
    endpoint: Arc<Endpoint>,
    dirty: Mutex<BTreeSet<String>>,
    wake: Condvar,
}

impl ObserveState {
    /// No resource changed yet.
    pub fn new(endpoint: Arc<Endpoint>) -> ObserveState {
        ObserveState {
            endpoint,
            dirty: Mutex::new(BTreeSet::new()),
            wake: Condvar::new(),
        }
    }

    /// Marks `path` (without leading `/`) changed and wakes the notifier.
    pub fn mark(&self, path: &str) {
        let path = path.trim_start_matches('/');
        let mut d = self.dirty.lock();
        if !d.contains(path) {
            d.insert(path.to_string());
        }
        drop(d);
        self.wake.notify_one();
    }

    /// Waits at most `limit` for changed paths; returns and clears them.
    pub fn take_dirty(&self, limit: Duration) -> Vec<String> {
        let mut d = self.dirty.lock();
        if d.is_empty() {
            self.wake.wait_for(&mut d, limit);
        }
        std::mem::take(&mut *d).into_iter().collect()
    }

    /// Observers registered now.
    pub fn observers(&self) -> usize {
        self.endpoint.observers()
    }
}

/// A cloneable handle that tells the gateway a resource changed, so that
/// its observers are notified.
#[derive(Clone)]
pub struct Notifier {
    pub(crate) state: Arc<ObserveState>,
}

impl Notifier {
    /// `path` (e.g. `sensors/temp0`, leading `/` optional) has a new
    /// representation. Cheap and non-blocking apart from a short lock.
    pub fn notify(&self, path: &str) {
        self.state.mark(path);
    }

    /// Observers registered now, in all.
    pub fn observers(&self) -> usize {
        self.state.observers()
    }

    /// The endpoint's counters (Observe's among them).
    pub fn counters(&self) -> &EndpointStats {
        self.state.endpoint.stats()
    }

    /// Relations ended so far, for every reason.
    pub fn removed(&self) -> u64 {
        Ended::ALL.iter().map(|e| self.counters().ended(*e)).sum()
    }
}

/// The Observe counters.
pub(crate) fn collect(o: &ObserveState, m: &mut crate::exposition::Exposition) {
    let c = o.endpoint.stats();
    let ended: u64 = Ended::ALL.iter().map(|e| c.ended(*e)).sum();
    // Rows of one shape (name, help, value) here and in collect_endpoint:
    // data, written out so that each exported name stands as it is sent.
    m.families(&[
        (
            "mintgate_observe_observers",
            "Observe registrations now (RFC 7641).",
            o.observers() as u64,
        ),
        (
            "mintgate_observe_registered_total",
            "Observe registrations accepted.",
            c.observe_registered.load(Relaxed),
        ),
        (
            "mintgate_observe_refused_total",
            "Observe registrations refused (registry full, the source at observe_max_per_source, or the token held by a relation of another owner).",
            c.observe_refused_total.load(Relaxed)
                + c.observe_refused_source.load(Relaxed)
                + c.observe_refused_taken.load(Relaxed),
        ),
        (
            "mintgate_observe_refused_source_total",
            "Observe registrations refused because the source (IPv4 address or IPv6 /64) had its share.",
            c.observe_refused_source.load(Relaxed),
        ),
        (
            "mintgate_observe_refused_taken_total",
            "Observe registrations refused because the peer and token named a relation of another owner (plain against OSCORE, or another OSCORE context).",
            c.observe_refused_taken.load(Relaxed),
        ),
        (
            "mintgate_observe_removed_total",
            "Observers removed (Observe: 1, Reset, unacknowledged CON, error, its TCP or WebSocket connection closed, a notification that could not be protected); by reason in mintgate_observe_ended_total.",
            ended,
        ),
        (
            "mintgate_observe_notifications_total",
            "Notifications sent (first transmissions).",
            c.notifications.load(Relaxed),
        ),
        (
            "mintgate_observe_confirmable_total",
            "Confirmable notifications sent.",
            c.notifications_con.load(Relaxed),
        ),
        (
            "mintgate_observe_replaced_total",
            "Notifications that replaced an unacknowledged CON notification (RFC 7641 4.5.2).",
            c.notifications_replaced.load(Relaxed),
        ),
    ]);
    m.counters(
        "mintgate_observe_ended_total",
        "Observe relations ended, by reason.",
        "reason",
        Ended::ALL.iter().map(|e| (e.name(), c.ended(*e))),
    );
}

/// The rest of the endpoint's counters: the message layer's CONs and
/// address validation.
pub(crate) fn collect_endpoint(ep: &Endpoint, m: &mut crate::exposition::Exposition) {
    let c = ep.stats();
    m.families(&[
        (
            "mintgate_coap_pending_con",
            "CON messages (separate responses, notifications) waiting for an ACK.",
            ep.pending() as u64,
        ),
        (
            "mintgate_coap_empty_acks_total",
            "Empty ACKs sent for requests whose handler was slow.",
            c.empty_acks.load(Relaxed),
        ),
        (
            "mintgate_coap_retransmissions_total",
            "CON retransmissions (separate responses and notifications).",
            c.retransmissions.load(Relaxed),
        ),
        (
            "mintgate_coap_con_given_up_total",
            "CON messages given up unacknowledged.",
            c.gave_up.load(Relaxed),
        ),
        (
            "mintgate_coap_verified_addresses",
            "Addresses verified by an Echo round trip (RFC 9175), trusted now.",
            ep.verified_addresses() as u64,
        ),
        (
            "mintgate_coap_amplification_blocks_total",
            "Answers to unverified sources cut to one Block2 block within coap.amplification_factor.",
            c.amplification_blocks.load(Relaxed),
        ),
        (
            "mintgate_coap_amplification_challenges_total",
            "Answers to unverified sources replaced by a 4.01 Echo challenge.",
            c.amplification_challenges.load(Relaxed),
        ),
        (
            "mintgate_coap_amplification_dropped_total",
            "Answers to unverified sources not sent: nothing small enough could be said.",
            c.amplification_dropped.load(Relaxed),
        ),
        (
            "mintgate_coap_echo_verified_total",
            "Requests whose Echo option verified their address.",
            c.echo_verified.load(Relaxed),
        ),
        (
            "mintgate_coap_echo_invalid_total",
            "Requests carrying an Echo option that was not valid (forged, stale, another address's).",
            c.echo_invalid.load(Relaxed),
        ),
    ]);
}
