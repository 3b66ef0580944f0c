//! The publish queue's driver and the [`Publisher`] handle other code feeds.
//!
//! A `Publisher` owns one thread running a single-threaded tokio runtime. It
//! holds the [`PubQueue`] state machine and its [`Store`], keeps one broker
//! connection up (reconnecting with back-off, 50 ms doubling to 2 s), hands
//! the queue's transmissions to rumqttc and reports PUBACKs/PUBCOMPs back.
//!
//! Packet ids are mapped to queue ids by order: on a fresh connection every
//! publish request produces exactly one `Sent(pkid)` event, in request order,
//! so the n-th `Sent` belongs to the n-th message handed over. The window
//! keeps rumqttc from ever running out of packet ids (it cycles 1..=W and at
//! most W consecutive messages are in flight), so there is no collision.
//!
//! Every message gets the next sequence number of its topic (see
//! [`crate::queue`]): a receiver of any one topic sees 1, 2, 3, ...
//!
//! [`Publisher::enqueue`] returns only after the message is durable in the
//! store (when the store is persistent): from then on it reaches the broker
//! at least once and in order, whatever happens to the connection, the
//! broker or this process.
//!
//! This is also the extension point for bridges (CoAP resources, Observe
//! streams, direct-path outputs -> topics): they hold a `Publisher` (it is
//! `Send + Sync`; share it in an `Arc`) and call `enqueue`.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::conn::{check_topic, BrokerUrl, Conn, ConnOptions, LinkEvent, Qos};
use crate::payload::now_ms;
pub use crate::queue::Flags;
use crate::queue::{Limits, PubQueue, QueueStats, QueuedMessage, WhenFull};
use crate::store::{MemStore, RedbStore, Store};

/// How to run a [`Publisher`].
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// The broker.
    pub broker: BrokerUrl,
    /// QoS 1 (the paper's Pub Queue) or 2.
    pub qos: Qos,
    /// Messages in flight at once (1: the paper's rule).
    pub window: usize,
    /// Folder of the persistent store; `None` keeps the queue in memory.
    pub state: Option<PathBuf>,
    /// Publisher id for a new store (default: random, `mg-xxxxxxxx`).
    pub publisher_id: Option<String>,
    /// MQTT client id (default: the publisher id).
    pub client_id: Option<String>,
    /// How often acknowledgements are made durable in the store.
    pub ack_flush: Duration,
    /// The gateway's status topic: a retained `online` on every connection,
    /// a retained `offline` as the last will and on an orderly stop.
    pub status_topic: Option<StatusTopic>,
    /// The queue's bounds and what happens when they are reached.
    pub limits: Limits,
    /// Most payloads held in memory with a persistent store (the others are
    /// read back from it in chunks when their turn comes).
    pub resident: usize,
    /// MQTT 5: the message expiry interval of each PUBLISH, counted from
    /// when the message was enqueued (a message sent after an outage gets
    /// what is left of it, at least 1 s); `None`: none. 3.1.1 has no such
    /// property and ignores it.
    pub message_expiry: Option<Duration>,
    /// Publish through this transport instead of MQTT to `broker` (the
    /// JetStream output); no status topic then.
    pub uplink: Option<Arc<dyn crate::conn::Uplink>>,
}

/// What `{gateway}` in a status topic (and in the gateway's topic
/// templates) stands for: the publisher id.
pub const GATEWAY_PLACEHOLDER: &str = "{gateway}";

/// What is left, in whole seconds (at least 1), of a message expiry
/// interval `expiry` for a message enqueued at `ts_ms` when it is `now_ms`.
fn expiry_left(expiry: Duration, ts_ms: u64, now_ms: u64) -> u32 {
    let age = Duration::from_millis(now_ms.saturating_sub(ts_ms));
    expiry
        .saturating_sub(age)
        .as_secs()
        .clamp(1, u64::from(u32::MAX)) as u32
}

/// The bounds of [`PublisherConfig::new`]: 100,000 messages, 64 MiB,
/// refuse what does not fit (the caller hears it).
pub const DEFAULT_LIMITS: Limits = Limits {
    max_messages: 100_000,
    max_bytes: 64 << 20,
    when_full: WhenFull::RefuseNew,
};

/// Payloads held in memory by default (see [`PublisherConfig::resident`]).
pub const DEFAULT_RESIDENT: usize = 1024;

/// While the store cannot write (disk full), how often a write is tried.
const STORE_RETRY: Duration = Duration::from_secs(1);

/// A status topic and its two payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusTopic {
    /// The topic.
    pub topic: String,
    /// Published (retained, QoS 1) on every connection.
    pub online: Vec<u8>,
    /// The last will (retained, QoS 1), and published on an orderly stop.
    pub offline: Vec<u8>,
}

/// The queue id under which a status message travels (never a message's).
const STATUS_ID: u64 = u64::MAX;

impl PublisherConfig {
    /// QoS 1, window 1, in memory.
    pub fn new(broker: BrokerUrl) -> PublisherConfig {
        PublisherConfig {
            broker,
            qos: Qos::AtLeastOnce,
            window: 1,
            state: None,
            publisher_id: None,
            client_id: None,
            ack_flush: Duration::from_millis(100),
            status_topic: None,
            message_expiry: None,
            limits: DEFAULT_LIMITS,
            resident: DEFAULT_RESIDENT,
            uplink: None,
        }
    }
}

/// A publisher error.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The durable write of this message failed (the publisher stops).
    #[error("the publish queue's store failed: {0}")]
    StoreFailed(String),
    /// Some or all messages of the call were refused: the queue is full
    /// (`mqtt.queue.when_full = "refuse-new"`) or its store cannot write
    /// (disk full). The first `accepted` were queued.
    #[error("{refused} message(s) refused ({accepted} accepted): {why}")]
    Refused {
        /// Messages queued (the first ones of the call).
        accepted: u64,
        /// Messages refused.
        refused: u64,
        /// Why.
        why: Refusal,
    },
    /// Bad argument (topic, QoS).
    #[error("{0}")]
    Invalid(String),
    /// The driver thread is gone.
    #[error("the publisher has stopped")]
    Stopped,
    /// Could not start the driver thread.
    #[error("starting the publisher thread: {0}")]
    Thread(std::io::Error),
}

/// Why messages were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue holds its `max_messages` or `max_bytes`.
    QueueFull,
    /// The store cannot write (disk full).
    DiskFull,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::QueueFull => "the publish queue is full",
            Refusal::DiskFull => "the publish queue's store is out of disk space",
        })
    }
}

/// A snapshot of the publisher.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// Bytes (topics and payloads) of the unacknowledged messages.
    pub bytes: u64,
    /// The store cannot write now (disk full): new messages are refused.
    pub store_full: bool,
    /// The queue id the next message gets (its order over all topics;
    /// [`Publisher::next_seq`] tells a topic's next sequence number).
    pub next_id: u64,
    /// Messages not yet acknowledged.
    pub unacked: usize,
    /// Messages held by the store at start (resumed).
    pub resumed: usize,
    /// Connected to the broker now.
    pub connected: bool,
    /// Successful connections so far.
    pub connects: u64,
    /// Durable writes of new messages to the store so far (each one commit:
    /// everything enqueued while the previous one ran goes in the next).
    pub durable_writes: u64,
    /// The last connection error.
    pub last_error: Option<String>,
    /// Queue counters.
    pub queue: QueueStats,
    /// The driver has stopped (after [`Publisher::close`] or a store failure).
    pub stopped: bool,
}

struct Shared {
    status: Mutex<Status>,
    changed: Condvar,
}

enum Cmd {
    Enqueue {
        topic: String,
        flags: Flags,
        bodies: Vec<String>,
        reply: oneshot::Sender<Result<RangeInclusive<u64>, PublishError>>,
    },
    NextSeq {
        topic: String,
        reply: oneshot::Sender<u64>,
    },
    Close {
        drain: Duration,
        reply: oneshot::Sender<()>,
    },
}

/// Messages handed to the queue by [`Publisher::submit_many_with`], not yet
/// known to be durable.
#[must_use = "wait() says whether the messages were accepted"]
pub struct Submitted(oneshot::Receiver<Result<RangeInclusive<u64>, PublishError>>);

impl Submitted {
    /// Blocks until the messages are durable: their sequences (of their
    /// topic), or why (some) were refused.
    pub fn wait(self) -> Result<RangeInclusive<u64>, PublishError> {
        self.0.blocking_recv().map_err(|_| PublishError::Stopped)?
    }
}

/// The handle; see the module docs. Dropping it stops the driver (what is
/// not acknowledged stays in a persistent store for the next start).
pub struct Publisher {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    publisher_id: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    /// Opens the store (resuming what it holds) and starts the driver.
    ///
    /// `{gateway}` in the status topic stands for the publisher id (so that
    /// a fleet of gateways can share one configuration).
    pub fn start(mut cfg: PublisherConfig) -> Result<Publisher, PublishError> {
        if !matches!(cfg.qos, Qos::AtLeastOnce | Qos::ExactlyOnce) {
            return Err(PublishError::Invalid(
                "the publish queue needs QoS 1 or 2 (an acknowledgement per message)".into(),
            ));
        }
        if cfg.window == 0 || cfg.window > 1024 {
            return Err(PublishError::Invalid(format!(
                "window must be 1..=1024, got {}",
                cfg.window
            )));
        }
        if let Some(st) = &cfg.status_topic {
            check_topic(&st.topic)
                .map_err(|e| PublishError::Invalid(format!("status topic: {e}")))?;
        }
        match &cfg.uplink {
            None => cfg.broker.check().map_err(PublishError::Invalid)?,
            Some(_) if cfg.status_topic.is_some() => {
                return Err(PublishError::Invalid(
                    "a status topic needs an MQTT broker (a last will)".into(),
                ))
            }
            Some(_) => {}
        }
        let target = match &cfg.uplink {
            Some(u) => u.describe(),
            None => cfg.broker.to_string(),
        };
        let mut store_down = None;
        let store: Box<dyn Store> = match &cfg.state {
            Some(dir) => {
                let s = RedbStore::open_or_defer(dir, cfg.publisher_id.as_deref())?;
                if !s.is_open() {
                    // Tried at the first enqueue and then every STORE_RETRY.
                    store_down = Some((Instant::now() - STORE_RETRY, 0));
                }
                Box::new(s)
            }
            None => Box::new(MemStore::new(
                cfg.publisher_id
                    .clone()
                    .unwrap_or_else(crate::store::random_publisher_id),
            )),
        };
        let rec = store.recovered().clone();
        if let Some(st) = &mut cfg.status_topic {
            st.topic = st.topic.replace(GATEWAY_PLACEHOLDER, &rec.publisher);
            check_topic(&st.topic)
                .map_err(|e| PublishError::Invalid(format!("status topic: {e}")))?;
        }
        let queue = new_queue(&cfg, store.as_ref(), rec.clone());
        let shared = Arc::new(Shared {
            status: Mutex::new(Status {
                next_id: queue.next_id(),
                unacked: queue.len(),
                resumed: rec.index.len(),
                store_full: store_down.is_some(),
                ..Status::default()
            }),
            changed: Condvar::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let sh = shared.clone();
        // Started as the subscriber's thread is (subscriber.rs); what each
        // tells its owner when the runtime cannot start differs (status,
        // event).
        let thread = std::thread::Builder::new()
            .name("mqtt-pubqueue".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let mut st = lock(&sh.status);
                        st.last_error = Some(format!("starting the runtime: {e}"));
                        st.stopped = true;
                        sh.changed.notify_all();
                        return;
                    }
                };
                let mut d = Driver {
                    cfg,
                    target,
                    queue,
                    store,
                    shared: sh.clone(),
                    connected: false,
                    pkids: Vec::new(),
                    handed: std::collections::VecDeque::new(),
                    connects: 0,
                    durable_writes: 0,
                    last_error: None,
                    failing: None,
                    last_notify: Instant::now(),
                    staged: Vec::new(),
                    staged_replies: Vec::new(),
                    appending: None,
                    announce: false,
                    store_down,
                    refusals: RefusalLog::default(),
                };
                rt.block_on(d.run(rx));
                let mut st = lock(&sh.status);
                st.stopped = true;
                st.connected = false;
                sh.changed.notify_all();
            })
            .map_err(PublishError::Thread)?;
        Ok(Publisher {
            tx,
            shared,
            publisher_id: rec.publisher,
            thread: Some(thread),
        })
    }

    /// The publisher id the envelopes carry.
    pub fn publisher_id(&self) -> &str {
        &self.publisher_id
    }

    /// The sequence number the next message for `topic` gets.
    pub fn next_seq(&self, topic: &str) -> Result<u64, PublishError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::NextSeq {
                topic: topic.to_owned(),
                reply,
            })
            .map_err(|_| PublishError::Stopped)?;
        rx.blocking_recv().map_err(|_| PublishError::Stopped)
    }

    /// Queues one message; returns its sequence (of its topic) once it is
    /// durable.
    pub fn enqueue(&self, topic: &str, body: &str) -> Result<u64, PublishError> {
        Ok(*self.enqueue_many(topic, vec![body.to_owned()])?.start())
    }

    /// Queues several messages in one durable write; returns their
    /// sequences (consecutive: the topic's next ones).
    pub fn enqueue_many(
        &self,
        topic: &str,
        bodies: Vec<String>,
    ) -> Result<RangeInclusive<u64>, PublishError> {
        self.enqueue_many_with(topic, Flags::default(), bodies)
    }

    /// [`Publisher::enqueue_many`] published as `flags` say: with the retain
    /// flag (the broker keeps the topic's latest for late subscribers),
    /// bare (the body without the envelope).
    pub fn enqueue_many_with(
        &self,
        topic: &str,
        flags: Flags,
        bodies: Vec<String>,
    ) -> Result<RangeInclusive<u64>, PublishError> {
        self.submit_many_with(topic, flags, bodies)?.wait()
    }

    /// [`Publisher::enqueue_many_with`] without waiting: the messages are
    /// handed to the queue and numbered in the order submitted, and
    /// [`Submitted::wait`] says when they are durable. Several submissions
    /// made before waiting on any go into one durable write (the driver
    /// takes every enqueue that is waiting), so a caller with messages for
    /// many topics pays one commit for all of them instead of one each.
    pub fn submit_many_with(
        &self,
        topic: &str,
        flags: Flags,
        bodies: Vec<String>,
    ) -> Result<Submitted, PublishError> {
        check_topic(topic).map_err(PublishError::Invalid)?;
        if bodies.is_empty() {
            return Err(PublishError::Invalid("nothing to enqueue".into()));
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Enqueue {
                topic: topic.to_owned(),
                flags,
                bodies,
                reply,
            })
            .map_err(|_| PublishError::Stopped)?;
        Ok(Submitted(rx))
    }

    /// A snapshot of the state.
    pub fn status(&self) -> Status {
        lock(&self.shared.status).clone()
    }

    /// Waits until `done(status)` holds, the driver stops, or `timeout`
    /// passes; returns the last status.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&Status) -> bool) -> Status {
        let end = Instant::now() + timeout;
        let mut st = lock(&self.shared.status);
        loop {
            if done(&st) || st.stopped {
                return st.clone();
            }
            let now = Instant::now();
            if now >= end {
                return st.clone();
            }
            st = match self.shared.changed.wait_timeout(st, end - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Waits until every queued message is acknowledged (true) or `timeout`.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let st = self.wait_until(timeout, |s| s.unacked == 0);
        st.unacked == 0
    }

    /// Stops the driver: waits up to `drain` for outstanding messages to be
    /// acknowledged, makes acknowledgements durable, disconnects.
    pub fn close(mut self, drain: Duration) -> Status {
        self.stop(drain);
        self.status()
    }

    fn stop(&mut self, drain: Duration) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Close { drain, reply }).is_ok() {
            let _ = rx.blocking_recv();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop(Duration::ZERO);
        }
    }
}

/// The queue over what `store` recovered, with `cfg`'s bounds; messages
/// the bounds drop at once are forgotten by the store.
fn new_queue(cfg: &PublisherConfig, store: &dyn Store, rec: crate::store::Recovered) -> PubQueue {
    let mut q = PubQueue::restore_index(rec.publisher, cfg.window, rec.numbering, &rec.index);
    if store.can_load() {
        q.set_resident(cfg.resident);
    }
    q.set_limits(cfg.limits);
    let dropped = q.stats().dropped_full;
    if dropped > 0 {
        tracing::warn!(
            "publish queue: {dropped} stored message(s) dropped at start to fit the queue's bounds"
        );
    }
    q
}

/// Refusing PUBACKs, said at most every 10 s.
#[derive(Default)]
struct RefusalLog {
    last: Option<Instant>,
    since: u64,
}

fn join_error(e: tokio::task::JoinError) -> crate::store::StoreError {
    crate::store::StoreError::other("flushing acknowledgements", e.to_string())
}

async fn next_event(conn: &mut Option<Conn>) -> Result<LinkEvent, String> {
    match conn {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Driver {
    cfg: PublisherConfig,
    /// Where the messages go, for logs.
    target: String,
    queue: PubQueue,
    store: Box<dyn Store>,
    shared: Arc<Shared>,
    connected: bool,
    /// In-flight packet id -> queue id, on the current connection.
    pkids: Vec<(u16, u64)>,
    /// Queue ids handed to rumqttc whose `Sent` event has not come yet.
    handed: std::collections::VecDeque<u64>,
    connects: u64,
    durable_writes: u64,
    last_error: Option<String>,
    /// Since when connection attempts fail (none has succeeded since), and
    /// when that was last logged as a warning.
    failing: Option<(Instant, Option<Instant>)>,
    last_notify: Instant,
    /// Numbered messages waiting for the next durable write, and the
    /// callers to answer when it is done.
    staged: Vec<QueuedMessage>,
    staged_replies: Vec<Pending>,
    /// The durable write running on the blocking pool: its job, the last id
    /// it covers and the callers it answers.
    appending: Option<Appending>,
    /// The status topic's `online` is due on this connection.
    announce: bool,
    /// The store cannot write (disk full): when it was last tried, and the
    /// messages refused since it failed.
    store_down: Option<(Instant, u64)>,
    refusals: RefusalLog,
}

type EnqueueReply = oneshot::Sender<Result<RangeInclusive<u64>, PublishError>>;

/// A caller to answer once its messages are durable: with `Ok(range)`, or
/// with the refusal of some of them.
struct Pending {
    reply: EnqueueReply,
    outcome: Result<RangeInclusive<u64>, PublishError>,
    /// Messages of the call that were staged.
    staged: u64,
}

struct Appending {
    job: tokio::task::JoinHandle<Result<(), crate::store::StoreError>>,
    upto: u64,
    replies: Vec<Pending>,
    /// What the write holds: (id, topic, seq), to take back if it fails.
    msgs: Vec<(u64, String, u64)>,
}

async fn appended(a: &mut Option<Appending>) -> Result<(), crate::store::StoreError> {
    match a {
        Some(a) => (&mut a.job).await.unwrap_or_else(|e| Err(join_error(e))),
        None => std::future::pending().await,
    }
}

use crate::conn::next_backoff;

impl Driver {
    async fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let opts = {
            let mut o = ConnOptions::new(
                self.cfg
                    .client_id
                    .clone()
                    .unwrap_or_else(|| self.queue.publisher().to_owned()),
            );
            // The status message may be in flight beside a full window.
            o.inflight = self.cfg.window as u16 + u16::from(self.cfg.status_topic.is_some());
            o.will = self.cfg.status_topic.as_ref().map(|st| crate::conn::Will {
                topic: st.topic.clone(),
                payload: st.offline.clone(),
                qos: Qos::AtLeastOnce,
                retain: true,
            });
            o
        };
        let mut conn: Option<Conn> = None;
        let mut retry_at = tokio::time::Instant::now();
        let mut backoff = crate::conn::FIRST_BACKOFF;
        let mut flush = tokio::time::interval(self.cfg.ack_flush.max(Duration::from_millis(1)));
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing: Option<(tokio::time::Instant, oneshot::Sender<()>)> = None;
        let mut flushing: Option<tokio::task::JoinHandle<Result<(), crate::store::StoreError>>> =
            None;
        loop {
            if conn.is_none() && tokio::time::Instant::now() >= retry_at {
                conn = Some(match &self.cfg.uplink {
                    Some(u) => u.start(self.queue.publisher()),
                    None => Conn::start(&self.cfg.broker, &opts),
                });
            }
            if let (Some(c), true) = (&conn, self.connected) {
                if let Err(e) = self.pump(c) {
                    let refused = self.lost(&mut conn, e);
                    let (wait, next) = next_backoff(backoff, refused);
                    retry_at = tokio::time::Instant::now() + wait;
                    backoff = next;
                    continue;
                }
            }
            self.publish_status();
            if let Some((deadline, _)) = &closing {
                if self.queue.is_empty() || tokio::time::Instant::now() >= *deadline {
                    break;
                }
            }
            let close_at = closing.as_ref().map(|(d, _)| *d);
            tokio::select! {
                cmd = rx.recv(), if closing.is_none() => match cmd {
                    Some(Cmd::Enqueue { topic, flags, bodies, reply }) => {
                        // Take every enqueue that is waiting too: one
                        // durable write for all of them (group commit).
                        let mut next = Some(Cmd::Enqueue { topic, flags, bodies, reply });
                        while let Some(cmd) = next.take() {
                            match cmd {
                                Cmd::Enqueue { topic, flags, bodies, reply } => {
                                    self.stage(&topic, flags, &bodies, reply);
                                    next = rx.try_recv().ok();
                                }
                                other => {
                                    self.unstash(other, &mut closing);
                                }
                            }
                        }
                        if let Err(e) = self.start_append() {
                            tracing::error!("{e}");
                            self.last_error = Some(e.to_string());
                            break;
                        }
                    }
                    Some(Cmd::NextSeq { topic, reply }) => {
                        let _ = reply.send(self.queue.next_seq(&topic));
                    }
                    Some(other) => self.unstash(other, &mut closing),
                    None => break,
                },
                r = appended(&mut self.appending) => {
                    // The store failed: stop rather than run with a queue
                    // the store no longer matches.
                    if let Err(e) = self.appended(r) {
                        tracing::error!("{e}");
                        self.last_error = Some(e.to_string());
                        break;
                    }
                }
                ev = next_event(&mut conn), if conn.is_some() => {
                    // Handle the whole burst that is ready before pumping.
                    let mut ev = Some(ev);
                    let mut burst = 0;
                    while let Some(e) = ev.take() {
                        match e.and_then(|e| self.on_event(e)) {
                            Ok(()) => {
                                if self.connected {
                                    backoff = crate::conn::FIRST_BACKOFF;
                                }
                            }
                            Err(e) => {
                                let refused = self.lost(&mut conn, e);
                                let (wait, next) = next_backoff(backoff, refused);
                                retry_at = tokio::time::Instant::now() + wait;
                                backoff = next;
                                break;
                            }
                        }
                        burst += 1;
                        if burst < 256 {
                            ev = conn.as_mut().and_then(Conn::try_next);
                        }
                    }
                }
                _ = tokio::time::sleep_until(retry_at), if conn.is_none() => {}
                _ = flush.tick() => {
                    // Syncs run on the blocking pool, one at a time, so the
                    // connection never waits for the disk.
                    if let Some(h) = flushing.take_if(|h| h.is_finished()) {
                        match h.await.unwrap_or_else(|e| Err(join_error(e))) {
                            Ok(()) => {}
                            Err(e) if e.is_disk_full() => self.store_full(&e),
                            Err(e) => {
                                tracing::error!("{e}");
                                self.last_error = Some(e.to_string());
                                break;
                            }
                        }
                    }
                    // A full disk is tried again without waiting for an
                    // enqueue, so that sending what is stored resumes.
                    if self.store_down.is_some() && flushing.is_none() && self.appending.is_none()
                        && self.store_ready()
                    {
                        if let Some((_, refused)) = self.store_down.take() {
                            tracing::info!(
                                "publish queue: its store opened again; {refused} message(s) were refused meanwhile"
                            );
                        }
                    }
                    if flushing.is_none() && self.store_down.is_none() {
                        if let Some(job) = self.store.take_flush_job() {
                            flushing = Some(tokio::task::spawn_blocking(job));
                        }
                    }
                }
                _ = tokio::time::sleep_until(close_at.unwrap_or_else(tokio::time::Instant::now)),
                    if close_at.is_some() => {}
            }
        }
        // What was accepted for writing is written before we go (and its
        // callers answered), even when closing or after a store error.
        if self.appending.is_some() {
            let r = appended(&mut self.appending).await;
            if let Err(e) = self.appended(r) {
                tracing::error!("{e}");
            }
        }
        if !self.staged.is_empty() {
            let msgs = std::mem::take(&mut self.staged);
            let r = self
                .store
                .append(&msgs, self.queue.next_id())
                .map(|()| self.queue.next_id() - 1);
            for p in std::mem::take(&mut self.staged_replies) {
                let _ = p.reply.send(match &r {
                    Ok(_) => p.outcome,
                    Err(e) => Err(PublishError::StoreFailed(e.to_string())),
                });
            }
            if let Ok(upto) = r {
                self.queue.mark_durable(upto);
            }
        }
        if let Some(h) = flushing.take() {
            if let Err(e) = h.await.unwrap_or_else(|e| Err(join_error(e))) {
                tracing::error!("{e}");
            }
        }
        if let Err(e) = self.store.flush() {
            tracing::error!("{e}");
        }
        if let Some(c) = &conn {
            if self.connected {
                // An orderly stop says so itself: the will is only for a
                // connection that ends without DISCONNECT.
                if let Some(st) = &self.cfg.status_topic {
                    if let Err(e) =
                        c.publish_retained(&st.topic, Qos::AtLeastOnce, true, st.offline.clone())
                    {
                        tracing::warn!("publish queue: status `offline` not sent: {e}");
                    }
                }
                c.disconnect();
                // Give the DISCONNECT a moment to leave.
                let _ = tokio::time::timeout(Duration::from_millis(200), async {
                    if let Some(c) = conn.as_mut() {
                        while c.next().await.is_ok() {}
                    }
                })
                .await;
            }
        }
        self.connected = false;
        self.publish_status();
        if let Some((_, reply)) = closing {
            let _ = reply.send(());
        }
    }

    /// Handles a command other than an enqueue (met while taking a batch of
    /// enqueues).
    fn unstash(
        &mut self,
        cmd: Cmd,
        closing: &mut Option<(tokio::time::Instant, oneshot::Sender<()>)>,
    ) {
        match cmd {
            Cmd::Enqueue {
                topic,
                flags,
                bodies,
                reply,
            } => self.stage(&topic, flags, &bodies, reply),
            Cmd::NextSeq { topic, reply } => {
                let _ = reply.send(self.queue.next_seq(&topic));
            }
            Cmd::Close { drain, reply } => {
                *closing = Some((tokio::time::Instant::now() + drain, reply));
            }
        }
    }

    /// Numbers `bodies` and stages them for the next durable write (those
    /// the queue's bounds let in); the caller is answered when it is done.
    /// While the store cannot write, everything is refused at once, and the
    /// store is tried again at most every [`STORE_RETRY`].
    fn stage(&mut self, topic: &str, flags: Flags, bodies: &[String], reply: EnqueueReply) {
        let n = bodies.len() as u64;
        if !self.store_ready() {
            self.refuse_disk(n);
            let _ = reply.send(Err(PublishError::Refused {
                accepted: 0,
                refused: n,
                why: Refusal::DiskFull,
            }));
            return;
        }
        let ts = now_ms();
        let first = self.queue.next_seq(topic);
        let mut accepted = 0;
        for b in bodies {
            // Refused ones take no number: the rest are refused too (with
            // refuse-new, nothing frees room meanwhile).
            if let Some(m) = self.queue.offer_with(topic, b, ts, flags) {
                self.staged.push(m);
                accepted += 1;
            }
        }
        let dropped = self.queue.take_dropped();
        if !dropped.is_empty() {
            let _ = self.store.ack(&dropped);
        }
        let outcome = if accepted == n {
            Ok(first..=first + n - 1)
        } else {
            Err(PublishError::Refused {
                accepted,
                refused: n - accepted,
                why: Refusal::QueueFull,
            })
        };
        if accepted == 0 {
            let _ = reply.send(outcome);
        } else {
            self.staged_replies.push(Pending {
                reply,
                outcome,
                staged: accepted,
            });
        }
    }

    /// Whether the store may be written: true unless it failed for want of
    /// space and trying it again (at most every [`STORE_RETRY`]) fails.
    fn store_ready(&mut self) -> bool {
        let Some((at, refused)) = self.store_down else {
            return true;
        };
        if at.elapsed() < STORE_RETRY {
            return false;
        }
        self.store_down = Some((Instant::now(), refused));
        match self.store.revive() {
            Ok(None) => true,
            Ok(Some(rec)) => {
                // Opened for the first time: nothing was accepted meanwhile,
                // so the queue is what the store holds.
                tracing::info!(
                    "publish queue: its store opened ({} message(s) held)",
                    rec.index.len()
                );
                self.queue = new_queue(&self.cfg, self.store.as_ref(), rec);
                let dropped = self.queue.take_dropped();
                let _ = self.store.ack(&dropped);
                true
            }
            Err(e) => {
                tracing::debug!("publish queue: store still not writable: {e}");
                false
            }
        }
    }

    /// `n` messages refused because the store cannot write.
    fn refuse_disk(&mut self, n: u64) {
        self.queue.count_refused_disk(n);
        if let Some((_, refused)) = &mut self.store_down {
            *refused += n;
        }
    }

    /// The store failed for want of space: said once (until it works again).
    fn store_full(&mut self, e: &crate::store::StoreError) {
        if self.store_down.is_none() {
            tracing::warn!(
                "{e}; the MQTT publish queue refuses new messages until there is space again \
                 ({} message(s) queued are kept and still sent)",
                self.queue.len()
            );
            self.store_down = Some((Instant::now(), 0));
        }
    }

    /// Starts the durable write of what is staged, unless one is running
    /// (the next starts when it is done, with everything staged meanwhile).
    fn start_append(&mut self) -> Result<(), crate::store::StoreError> {
        if self.appending.is_some() || self.staged.is_empty() {
            return Ok(());
        }
        let msgs = std::mem::take(&mut self.staged);
        let replies = std::mem::take(&mut self.staged_replies);
        let upto = self.queue.next_id() - 1;
        let taken: Vec<(u64, String, u64)> = msgs
            .iter()
            .map(|m| (m.id, m.topic.clone(), m.seq))
            .collect();
        match self.store.append_job(msgs, self.queue.next_id()) {
            Ok(Some(job)) => {
                self.durable_writes += 1;
                self.appending = Some(Appending {
                    job: tokio::task::spawn_blocking(job),
                    upto,
                    replies,
                    msgs: taken,
                });
            }
            Ok(None) => self.durable(upto, replies),
            Err(e) if e.is_disk_full() => self.append_failed(&e, taken, replies),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// The running durable write ended with `r`.
    fn appended(
        &mut self,
        r: Result<(), crate::store::StoreError>,
    ) -> Result<(), crate::store::StoreError> {
        let Some(a) = self.appending.take() else {
            return Ok(());
        };
        match r {
            Ok(()) => {
                self.durable(a.upto, a.replies);
                self.start_append()
            }
            Err(e) if e.is_disk_full() => {
                self.append_failed(&e, a.msgs, a.replies);
                Ok(())
            }
            Err(e) => {
                for p in a.replies {
                    let _ = p.reply.send(Err(PublishError::StoreFailed(e.to_string())));
                }
                Err(e)
            }
        }
    }

    /// A durable write failed for want of space: its messages and all
    /// staged after them are taken back (their numbers given out again)
    /// and refused.
    fn append_failed(
        &mut self,
        e: &crate::store::StoreError,
        mut msgs: Vec<(u64, String, u64)>,
        mut replies: Vec<Pending>,
    ) {
        self.store_full(e);
        msgs.extend(
            std::mem::take(&mut self.staged)
                .into_iter()
                .map(|m| (m.id, m.topic, m.seq)),
        );
        replies.append(&mut self.staged_replies);
        self.queue.unstage(&msgs);
        for p in replies {
            self.refuse_disk(p.staged);
            let (accepted, refused) = match p.outcome {
                Ok(r) => (0, r.count() as u64),
                Err(PublishError::Refused {
                    accepted, refused, ..
                }) => (0, accepted + refused),
                Err(_) => (0, p.staged),
            };
            let _ = p.reply.send(Err(PublishError::Refused {
                accepted,
                refused,
                why: Refusal::DiskFull,
            }));
        }
        self.publish_status();
    }

    /// Messages up to `upto` are durable: they may leave, and their callers
    /// hear they were accepted (after the status shows them).
    fn durable(&mut self, upto: u64, replies: Vec<Pending>) {
        if let Some((_, refused)) = self.store_down.take() {
            tracing::info!(
                "publish queue: its store writes again; {refused} message(s) were refused meanwhile"
            );
        }
        self.queue.mark_durable(upto);
        self.publish_status();
        for p in replies {
            let _ = p.reply.send(p.outcome);
        }
    }

    /// Reads the payloads the queue wants from the store (in chunks).
    fn load(&mut self) {
        let mut last = None;
        while let Some((from, n)) = self.queue.wants_load() {
            if last == Some(from) {
                break; // the store does not have it (yet)
            }
            last = Some(from);
            match self.store.load(from, n.min(4096)) {
                Ok(msgs) if !msgs.is_empty() => self.queue.fill(msgs),
                Ok(_) => break,
                Err(e) => {
                    if e.is_disk_full() {
                        self.store_full(&e);
                    } else {
                        tracing::error!("{e}");
                        self.last_error = Some(e.to_string());
                    }
                    break;
                }
            }
        }
    }

    /// Hands every message the window allows to rumqttc.
    fn pump(&mut self, c: &Conn) -> Result<(), String> {
        if self.announce {
            self.announce = false;
            if let Some(st) = &self.cfg.status_topic {
                c.publish_retained(&st.topic, Qos::AtLeastOnce, true, st.online.clone())?;
                self.handed.push_back(STATUS_ID);
            }
        }
        loop {
            while let Some(m) = self.queue.poll_transmit() {
                let meta = crate::conn::PublishMeta {
                    publisher: self.queue.publisher(),
                    seq: m.seq,
                    expiry_s: self
                        .cfg
                        .message_expiry
                        .map(|e| expiry_left(e, m.ts, now_ms())),
                };
                let id = m.id;
                c.publish_queued(m, self.cfg.qos, &meta)?;
                self.handed.push_back(id);
            }
            match self.queue.wants_load() {
                Some(_) => {
                    let before = self.queue.resident();
                    self.load();
                    if self.queue.resident() == before {
                        return Ok(());
                    }
                }
                None => return Ok(()),
            }
        }
    }

    fn on_event(&mut self, ev: LinkEvent) -> Result<(), String> {
        match ev {
            LinkEvent::Connected { .. } => {
                self.connected = true;
                self.connects += 1;
                self.announce = self.cfg.status_topic.is_some();
                if let Some((since, Some(_))) = self.failing.take() {
                    tracing::info!(
                        "publish queue: connected to {} after {:.0?} of failed attempts",
                        self.target,
                        since.elapsed()
                    );
                }
                tracing::debug!(
                    "publish queue connected to {} (resending from message {:?})",
                    self.target,
                    self.queue.base()
                );
            }
            LinkEvent::Sent(pkid) => {
                let id = self.handed.pop_front().ok_or_else(|| {
                    format!("PUBLISH {pkid} sent that the queue did not hand over")
                })?;
                if self.pkids.iter().any(|&(p, _)| p == pkid) {
                    return Err(format!("packet id {pkid} reused while in flight"));
                }
                self.pkids.push((pkid, id));
            }
            LinkEvent::Acked(pkid, result) => {
                let i = self
                    .pkids
                    .iter()
                    .position(|&(p, _)| p == pkid)
                    .ok_or_else(|| format!("ack for unknown packet id {pkid}"))?;
                let (_, id) = self.pkids.swap_remove(i);
                if id == STATUS_ID {
                    if let Err(reason) = result {
                        tracing::warn!("publish queue: the broker refused the status: {reason}");
                    }
                    return Ok(());
                }
                if let Err(reason) = result {
                    // The broker refused it (MQTT 5 reason code >= 0x80, e.g.
                    // its ACL forbids the topic): sending it again would be
                    // refused again and hold up everything behind it, so it
                    // is dropped, logged and counted.
                    if self.queue.on_refused(id) {
                        self.store.ack(&[id]).map_err(|e| e.to_string())?;
                        let log = &mut self.refusals;
                        log.since += 1;
                        if log
                            .last
                            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
                        {
                            tracing::warn!(
                                "publish queue: the broker refused {} message(s), dropped (the last: id {id}: {reason})",
                                log.since
                            );
                            log.last = Some(Instant::now());
                            log.since = 0;
                        }
                    }
                    return Ok(());
                }
                if self.queue.on_ack(id) {
                    self.store.ack(&[id]).map_err(|e| e.to_string())?;
                }
            }
            LinkEvent::Message { .. }
            | LinkEvent::Held { .. }
            | LinkEvent::SubAck(_)
            | LinkEvent::Other => {}
        }
        Ok(())
    }

    /// The connection ended with `e`; true when the broker refused the
    /// CONNECT.
    fn lost(&mut self, conn: &mut Option<Conn>, e: String) -> bool {
        let refused = conn.as_ref().is_some_and(Conn::refused);
        if refused {
            // Said every time, but attempts are at least a second apart and
            // slow down to one every 30 s.
            tracing::warn!(
                "publish queue: {} refused the connection: {e}; retrying, {} message(s) waiting",
                self.target,
                self.queue.len()
            );
        } else if self.connected {
            tracing::warn!("publish queue: connection to {} lost: {e}", self.target);
        } else {
            // Attempts that keep failing are said as a warning once they have
            // gone on for 2 s (a broker starting beside us is up by then),
            // then once a minute; each one at debug.
            let now = Instant::now();
            let (since, said) = self.failing.get_or_insert((now, None));
            let due = now.duration_since(*since) >= Duration::from_secs(2)
                && said.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60));
            if due {
                *said = Some(now);
                tracing::warn!(
                    "publish queue: cannot connect to {} for {:.0?}: {e}; retrying, {} message(s) waiting",
                    self.target,
                    now.duration_since(*since),
                    self.queue.len()
                );
            } else {
                tracing::debug!("publish queue: connecting to {}: {e}", self.target);
            }
        }
        *conn = None;
        self.connected = false;
        self.pkids.clear();
        self.handed.clear();
        self.queue.on_disconnect();
        self.last_error = Some(e);
        refused
    }

    /// Updates the shared status; wakes waiters when something they may wait
    /// for happened (queue empty, connection change, enqueue, stop) or every
    /// 20 ms while it progresses, not on every packet.
    fn publish_status(&mut self) {
        let mut st = lock(&self.shared.status);
        let wake = (self.queue.is_empty() && st.unacked != 0)
            || st.next_id != self.queue.next_id()
            || st.connected != self.connected
            || self.last_notify.elapsed() >= Duration::from_millis(20);
        st.next_id = self.queue.next_id();
        st.unacked = self.queue.len();
        st.bytes = self.queue.bytes();
        st.store_full = self.store_down.is_some();
        st.connected = self.connected;
        st.connects = self.connects;
        st.durable_writes = self.durable_writes;
        st.last_error.clone_from(&self.last_error);
        st.queue = self.queue.stats();
        drop(st);
        if wake {
            self.last_notify = Instant::now();
            self.shared.changed.notify_all();
        }
    }
}
