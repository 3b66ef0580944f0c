//! Subscriptions whose messages are handed over raw, as (topic, payload):
//! for payloads that are not publish-queue envelopes, such as the commands
//! the MQTT bridge turns into actuator writes (`on`, `off`, `21.5`).
//!
//! [`Listener::run`] blocks the calling thread (so that the caller decides
//! which thread group it belongs to) on a single-threaded tokio runtime,
//! keeps one connection up (reconnecting with back-off, 50 ms doubling to
//! 2 s), subscribes to every filter on each connection and calls the
//! handler for each message, in arrival order, until
//! [`ListenerControl::stop`]. The handler runs on that thread: it may block
//! briefly (a device write), never for long.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::conn::{BrokerUrl, Conn, ConnOptions, LinkEvent, Qos};

/// What to subscribe to.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    /// The broker.
    pub broker: BrokerUrl,
    /// Topic filters (wildcards allowed).
    pub filters: Vec<String>,
    /// Subscription QoS.
    pub qos: Qos,
    /// Client id.
    pub client_id: String,
    /// Ask the broker to keep the session (and queue messages) while we are
    /// away.
    pub persistent_session: bool,
    /// MQTT 5: for how long after a disconnect
    /// ([`crate::conn::ConnOptions::session_expiry`]).
    pub session_expiry: Duration,
}

/// The listener's state, for waiting and reporting.
#[derive(Clone, Debug, Default)]
pub struct ListenerStatus {
    /// Every filter is granted on the current connection.
    pub subscribed: bool,
    /// Successful subscriptions so far (one per connection).
    pub subscriptions: u64,
    /// Messages handed to the handler.
    pub messages: u64,
    /// The last connection or subscription error.
    pub last_error: Option<String>,
    /// [`Listener::run`] has returned.
    pub stopped: bool,
}

struct Shared {
    stop: AtomicBool,
    wake: Notify,
    status: Mutex<ListenerStatus>,
    changed: Condvar,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut ListenerStatus)) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut st);
        drop(st);
        self.changed.notify_all();
    }
}

/// Runs the subscription; see the module docs.
pub struct Listener {
    cfg: ListenerConfig,
    shared: Arc<Shared>,
}

/// Stops a [`Listener`] and reports on it; cloneable, usable from any thread.
#[derive(Clone)]
pub struct ListenerControl {
    shared: Arc<Shared>,
}

impl Listener {
    /// A listener and its control.
    pub fn new(cfg: ListenerConfig) -> (Listener, ListenerControl) {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            status: Mutex::new(ListenerStatus::default()),
            changed: Condvar::new(),
        });
        (
            Listener {
                cfg,
                shared: shared.clone(),
            },
            ListenerControl { shared },
        )
    }

    /// Subscribes and calls `on_message(topic, payload)` for each message
    /// until stopped. Blocks the calling thread.
    pub fn run(self, mut on_message: impl FnMut(&str, &[u8])) {
        let sh = self.shared.clone();
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(self.run_async(&mut on_message)),
            Err(e) => sh.update(|s| s.last_error = Some(format!("starting the runtime: {e}"))),
        }
        sh.update(|s| {
            s.stopped = true;
            s.subscribed = false;
        });
    }

    async fn run_async(self, on_message: &mut impl FnMut(&str, &[u8])) {
        let cfg = &self.cfg;
        let sh = &self.shared;
        let mut o = ConnOptions::new(cfg.client_id.clone());
        o.clean_session = !cfg.persistent_session;
        o.session_expiry = cfg.session_expiry;
        o.inflight = 16;
        let mut conn: Option<Conn> = None;
        let mut connected = false;
        let mut retry_at = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        while !sh.stop.load(Ordering::Acquire) {
            if conn.is_none() && tokio::time::Instant::now() >= retry_at {
                conn = Some(Conn::start(&cfg.broker, &o));
            }
            let ev = tokio::select! {
                _ = sh.wake.notified() => continue,
                _ = tokio::time::sleep_until(retry_at), if conn.is_none() => continue,
                ev = next_event(&mut conn), if conn.is_some() => ev,
            };
            let failure = match ev {
                Ok(LinkEvent::Connected { .. }) => {
                    connected = true;
                    backoff = Duration::from_millis(50);
                    conn.as_ref().and_then(|c| {
                        cfg.filters
                            .iter()
                            .try_for_each(|f| c.subscribe(f, cfg.qos))
                            .err()
                    })
                }
                Ok(LinkEvent::SubAck(true)) => {
                    tracing::debug!(broker = %cfg.broker, filters = ?cfg.filters, "subscribed");
                    sh.update(|s| {
                        s.subscribed = true;
                        s.subscriptions += 1;
                    });
                    None
                }
                Ok(LinkEvent::SubAck(false)) => Some(format!(
                    "the broker refused the subscription to {:?}",
                    cfg.filters
                )),
                Ok(LinkEvent::Message { topic, payload, .. }) => {
                    on_message(&topic, &payload);
                    sh.update(|s| s.messages += 1);
                    None
                }
                Ok(_) => None,
                Err(e) => Some(e),
            };
            if let Some(e) = failure {
                let refused = conn.as_ref().is_some_and(Conn::refused);
                if refused {
                    tracing::warn!(broker = %cfg.broker, "MQTT listener: {e}; retrying");
                } else if connected {
                    tracing::warn!(broker = %cfg.broker, "MQTT listener: {e}; reconnecting");
                } else {
                    tracing::debug!(broker = %cfg.broker, "MQTT listener: {e}");
                }
                conn = None;
                connected = false;
                let (wait, next) = crate::conn::next_backoff(backoff, refused);
                retry_at = tokio::time::Instant::now() + wait;
                backoff = next;
                sh.update(|s| {
                    s.subscribed = false;
                    s.last_error = Some(e);
                });
            }
        }
        if let (Some(c), true) = (&conn, connected) {
            c.disconnect();
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                if let Some(c) = conn.as_mut() {
                    while c.next().await.is_ok() {}
                }
            })
            .await;
        }
    }
}

async fn next_event(conn: &mut Option<Conn>) -> Result<LinkEvent, String> {
    match conn {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

impl ListenerControl {
    /// Asks [`Listener::run`] to disconnect and return.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }

    /// A snapshot of the state.
    pub fn status(&self) -> ListenerStatus {
        self.shared
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits (at most `timeout`) until every filter is granted; returns
    /// whether it is.
    pub fn wait_subscribed(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if st.subscribed {
                return true;
            }
            if st.stopped {
                return false;
            }
            let Some(left) = end.checked_duration_since(Instant::now()) else {
                return false;
            };
            st = match self.shared.changed.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}
