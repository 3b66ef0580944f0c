//! The receiving side over a broker: a subscription whose messages go
//! through a [`Reorder`] buffer, delivered on a channel.
//!
//! A [`Subscriber`] owns one thread with a single-threaded tokio runtime. It
//! reconnects with back-off after any failure and subscribes again on every
//! connection. With `clean_session = false` and a fixed client id the broker
//! keeps the subscription and queues messages while we are away (and, for a
//! broker with persistence, across its restart), so a reconnection loses
//! nothing; what the broker sends twice the reorder buffer drops.

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::conn::{BrokerUrl, Conn, ConnOptions, LinkEvent, Qos};
use crate::payload::{decode, Envelope};
use crate::reorder::Push;
use crate::reorder::{Delivery, Reorder, ReorderConfig, ReorderStats};

/// How to subscribe.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// The broker.
    pub broker: BrokerUrl,
    /// Topic filter.
    pub topic: String,
    /// Subscription QoS.
    pub qos: Qos,
    /// Client id (default: random `mg-sub-xxxxxxxx`).
    pub client_id: Option<String>,
    /// Ask the broker to keep our session (and queue for us) while we are
    /// disconnected.
    pub persistent_session: bool,
    /// MQTT 5: how long the broker keeps that session after a disconnect
    /// ([`crate::conn::ConnOptions::session_expiry`]).
    pub session_expiry: Duration,
    /// The reorder buffer's settings.
    pub reorder: ReorderConfig,
    /// Also report every arrival before reordering ([`SubEvent::Arrival`]).
    pub report_arrivals: bool,
    /// Subscribe through this transport instead of MQTT to `broker` (a
    /// JetStream consumer); `topic` is its subject filter.
    pub uplink: Option<std::sync::Arc<dyn crate::conn::Uplink>>,
    /// Deliver at most this many messages: those after it are not taken
    /// from the reorder buffer, so a transport that hears when a message
    /// is done ([`LinkEvent::Held`]) keeps them for the next run.
    pub limit: Option<u64>,
}

impl SubscriberConfig {
    /// QoS 1, random client id, clean session, default reordering.
    pub fn new(broker: BrokerUrl, topic: impl Into<String>) -> SubscriberConfig {
        SubscriberConfig {
            broker,
            topic: topic.into(),
            qos: Qos::AtLeastOnce,
            client_id: None,
            persistent_session: false,
            session_expiry: crate::conn::DEFAULT_SESSION_EXPIRY,
            reorder: ReorderConfig::default(),
            report_arrivals: false,
            uplink: None,
            limit: None,
        }
    }
}

/// What a subscriber reports.
#[derive(Clone, Debug)]
pub enum SubEvent {
    /// The broker granted the subscription (after every (re)connection).
    Subscribed,
    /// Connection lost (it reconnects by itself).
    Disconnected(String),
    /// A connection attempt failed before the broker accepted it (one per
    /// attempt; it retries by itself, backing off to every 2 s).
    ConnectFailed(String),
    /// A message, raw, before de-duplication and reordering (only with
    /// `report_arrivals`), and when the subscriber's thread decoded it (so
    /// that a reader polling now and then still knows when it came).
    Arrival(Envelope, Instant),
    /// The next in-order message of its publisher.
    Delivery(Delivery),
    /// A payload that is not an envelope (topic, length, why).
    Undecodable(String, usize, String),
}

/// A running subscription; dropping it disconnects.
pub struct Subscriber {
    events: std_mpsc::Receiver<(Vec<SubEvent>, ReorderStats)>,
    pending: std::collections::VecDeque<SubEvent>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stats: ReorderStats,
}

impl Subscriber {
    /// Starts subscribing (returns at once; wait for [`SubEvent::Subscribed`]).
    pub fn start(cfg: SubscriberConfig) -> std::io::Result<Subscriber> {
        if cfg.uplink.is_none() {
            crate::conn::check_filter(&cfg.topic)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        }
        let (tx, events) = std_mpsc::channel();
        let (stop, stop_rx) = oneshot::channel();
        // As the publish queue's thread (publisher.rs): see the note there.
        let thread = std::thread::Builder::new()
            .name("mqtt-subscriber".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send((
                            vec![SubEvent::Disconnected(format!("starting the runtime: {e}"))],
                            ReorderStats::default(),
                        ));
                        return;
                    }
                };
                rt.block_on(run(cfg, tx, stop_rx));
            })?;
        Ok(Subscriber {
            events,
            pending: std::collections::VecDeque::new(),
            stop: Some(stop),
            thread: Some(thread),
            stats: ReorderStats::default(),
        })
    }

    /// The next event, waiting at most `timeout`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Option<SubEvent> {
        if let Some(ev) = self.pending.pop_front() {
            return Some(ev);
        }
        let (evs, stats) = self.events.recv_timeout(timeout).ok()?;
        self.stats = stats;
        self.pending.extend(evs);
        self.pending.pop_front()
    }

    /// Waits (at most `timeout`) for [`SubEvent::Subscribed`]; other events
    /// before it are dropped.
    pub fn wait_subscribed(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.recv_timeout(left) {
                Some(SubEvent::Subscribed) => return true,
                Some(_) => {}
                None => return false,
            }
        }
        false
    }

    /// The reorder buffer's counters as of the last event received.
    pub fn stats(&self) -> ReorderStats {
        self.stats
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn next_event(conn: &mut Option<Conn>) -> Result<LinkEvent, String> {
    match conn {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

async fn run(
    cfg: SubscriberConfig,
    tx: std_mpsc::Sender<(Vec<SubEvent>, ReorderStats)>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut st = SubState {
        cfg: &cfg,
        reorder: Reorder::new(cfg.reorder),
        out: Vec::new(),
        connected: false,
        backoff: Duration::from_millis(50),
        retry_at: tokio::time::Instant::now(),
        tokens: std::collections::HashMap::new(),
        delivered: 0,
    };
    let mut o = ConnOptions::new(
        cfg.client_id
            .clone()
            .unwrap_or_else(|| format!("mg-sub-{:08x}", rand::random::<u32>())),
    );
    o.clean_session = !cfg.persistent_session;
    o.session_expiry = cfg.session_expiry;
    o.inflight = 16;
    let mut conn: Option<Conn> = None;
    loop {
        if conn.is_none() && tokio::time::Instant::now() >= st.retry_at {
            conn = Some(match &cfg.uplink {
                Some(u) => u.start(&o.client_id),
                None => Conn::start(&cfg.broker, &o),
            });
        }
        let gap_at = st
            .reorder
            .next_timeout()
            .map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = &mut stop => break,
            ev = next_event(&mut conn), if conn.is_some() => {
                // Handle the burst that is ready, then hand it over at once
                // (one wake-up of the reader per burst, not per message).
                let mut ev = Some(ev);
                let mut burst = 0;
                while let Some(e) = ev.take() {
                    st.on_event(e, &mut conn);
                    burst += 1;
                    if burst < 256 {
                        ev = conn.as_mut().and_then(Conn::try_next);
                    }
                }
            }
            _ = tokio::time::sleep_until(st.retry_at), if conn.is_none() => {}
            _ = tokio::time::sleep_until(gap_at.unwrap_or_else(tokio::time::Instant::now)), if gap_at.is_some() => {
                st.reorder.poll_timeout(Instant::now());
                st.drain(conn.as_ref());
            }
        }
        if !st.out.is_empty()
            && tx
                .send((std::mem::take(&mut st.out), st.reorder.stats()))
                .is_err()
        {
            break; // the Subscriber is gone
        }
    }
    if let (Some(c), true) = (&conn, st.connected) {
        c.disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(200), async {
            if let Some(c) = conn.as_mut() {
                while c.next().await.is_ok() {}
            }
        })
        .await;
    }
}

struct SubState<'a> {
    cfg: &'a SubscriberConfig,
    reorder: Reorder,
    out: Vec<SubEvent>,
    connected: bool,
    backoff: Duration,
    retry_at: tokio::time::Instant,
    /// Tokens of [`LinkEvent::Held`] messages in the reorder buffer, by
    /// (publisher, topic, seq), settled when that one is delivered (tokens
    /// of a lost connection too: the transport ignores those it no longer
    /// knows).
    tokens: std::collections::HashMap<(String, String, u64), Vec<u64>>,
    delivered: u64,
}

impl SubState<'_> {
    fn drain(&mut self, conn: Option<&Conn>) {
        while self.cfg.limit.is_none_or(|n| self.delivered < n) {
            let Some(d) = self.reorder.poll_deliver() else {
                break;
            };
            self.delivered += 1;
            if !self.tokens.is_empty() {
                let key = (d.env.publisher.clone(), d.topic.clone(), d.env.seq);
                for t in self.tokens.remove(&key).unwrap_or_default() {
                    if let Some(c) = conn {
                        c.settle(t);
                    }
                }
            }
            self.out.push(SubEvent::Delivery(d));
        }
    }

    /// A message arrived (`token`: settle it once done with it).
    fn arrived(
        &mut self,
        topic: String,
        payload: &[u8],
        token: Option<u64>,
        origin: Option<(String, u64)>,
        conn: Option<&Conn>,
    ) {
        let settle = |t: Option<u64>| {
            if let (Some(t), Some(c)) = (t, conn) {
                c.settle(t);
            }
        };
        match decode(payload).or_else(|e| bare(payload, origin).ok_or(e)) {
            Ok(env) => {
                let now = Instant::now();
                if self.cfg.report_arrivals {
                    self.out.push(SubEvent::Arrival(env.clone(), now));
                }
                let key = token.map(|_| (env.publisher.clone(), topic.clone(), env.seq));
                match (self.reorder.push(&topic, env, now), key, token) {
                    // Held and not yet delivered (a redelivery, maybe over
                    // a new connection): settled with the one held.
                    (Push::Duplicate, Some(k), Some(t)) if self.tokens.contains_key(&k) => {
                        self.tokens.entry(k).or_default().push(t)
                    }
                    (Push::InOrder | Push::Buffered, Some(k), Some(t)) => {
                        self.tokens.entry(k).or_default().push(t)
                    }
                    _ => settle(token),
                }
                self.drain(conn);
            }
            Err(e) => {
                settle(token);
                self.out
                    .push(SubEvent::Undecodable(topic, payload.len(), e.to_string()))
            }
        }
    }

    fn on_event(&mut self, ev: Result<LinkEvent, String>, conn: &mut Option<Conn>) {
        match ev {
            Ok(LinkEvent::Connected { .. }) => {
                self.connected = true;
                self.backoff = Duration::from_millis(50);
                if let Some(c) = conn.as_ref() {
                    if let Err(e) = c.subscribe(&self.cfg.topic, self.cfg.qos) {
                        self.lose(conn, e, Duration::ZERO);
                    }
                }
            }
            Ok(LinkEvent::SubAck(true)) => self.out.push(SubEvent::Subscribed),
            Ok(LinkEvent::SubAck(false)) => {
                let e = format!(
                    "the broker refused the subscription to {:?}",
                    self.cfg.topic
                );
                tracing::error!("{e}");
                self.lose(conn, e, Duration::from_secs(2));
            }
            Ok(LinkEvent::Message {
                topic,
                payload,
                origin,
            }) => self.arrived(topic, &payload, None, origin, conn.as_ref()),
            Ok(LinkEvent::Held {
                topic,
                payload,
                token,
            }) => self.arrived(topic, &payload, Some(token), None, conn.as_ref()),
            Ok(_) => {}
            Err(e) => self.lose(conn, e, Duration::ZERO),
        }
    }

    /// Drops the connection; the next attempt after the back-off (at least
    /// `min_wait`).
    fn lose(&mut self, conn: &mut Option<Conn>, e: String, min_wait: Duration) {
        let refused = conn.as_ref().is_some_and(Conn::refused);
        *conn = None;
        let (wait, next) = crate::conn::next_backoff(self.backoff, refused);
        self.retry_at = tokio::time::Instant::now() + wait.max(min_wait);
        self.backoff = next;
        if std::mem::take(&mut self.connected) || !min_wait.is_zero() {
            self.out.push(SubEvent::Disconnected(e));
        } else {
            self.out.push(SubEvent::ConnectFailed(e));
        }
    }
}

/// A bare payload (not an envelope) as an envelope, from the publisher and
/// seq its MQTT 5 user properties carry; `ts` is unknown (0).
fn bare(payload: &[u8], origin: Option<(String, u64)>) -> Option<Envelope> {
    let (publisher, seq) = origin?;
    Some(Envelope {
        publisher,
        seq,
        ts: 0,
        msg: String::from_utf8_lossy(payload).into_owned(),
    })
}
