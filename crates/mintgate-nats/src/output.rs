//! The publish queue's JetStream transport.
//!
//! One connection attempt of the queue's driver is one NATS client (any
//! server of the list; the cluster's others are learnt from it) and one
//! JetStream context. The queue hands over messages in order; each is
//! published to its subject with `Nats-Msg-Id: PUBLISHER.ID` (the queue's
//! message id: never reused, kept across restarts by the store), and its
//! JetStream acknowledgement (the stream stored it, on a majority of its
//! replicas) is reported as the queue's acknowledgement, in order.
//!
//! Any failure ends the attempt: the client losing its server, an
//! acknowledgement that does not come within the timeout (a node killed,
//! a leader election), or one that refuses the message. The driver then
//! makes a new one and sends everything unacknowledged again, in order,
//! from the oldest; what the stream had stored already it recognises by
//! the message id within its duplicate window and stores once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_nats::jetstream;
use futures_util::stream::{FuturesOrdered, StreamExt};
use mintgate_mqtt::conn::{Backend, Conn, LinkEvent, Uplink};
use mintgate_mqtt::queue::QueuedMessage;
use tokio::sync::mpsc;

use crate::config::Target;
use crate::subject::subject_for;

/// The message id of the queue's message `id` of `publisher`.
pub fn msg_id(publisher: &str, id: u64) -> String {
    format!("{publisher}.{id}")
}

/// Counters of a [`JetStream`] output, over all its connections.
#[derive(Debug, Default)]
pub struct OutputStats {
    /// Acknowledgements that said the stream had the message already
    /// (a resend recognised by its `Nats-Msg-Id`).
    pub duplicates: AtomicU64,
    /// Connections made.
    pub connects: AtomicU64,
    /// The server (its name) of the current or last connection.
    pub server: std::sync::Mutex<String>,
    /// The stream was found (or created) once: later connections publish
    /// at once, without asking the cluster's meta leader again (which a
    /// node failure may be electing).
    pub stream_found: AtomicBool,
    /// Connections in a row that ended without an acknowledgement (reset
    /// by one): each waits longer before it reports its failure (50 ms
    /// doubling to 2 s), since the driver connects again at once after a
    /// connection that was made (a stream without a leader answers every
    /// connection's first publish at once with "no responders").
    pub failing: std::sync::atomic::AtomicU32,
}

impl OutputStats {
    /// The server (its name) of the current or last connection.
    pub fn server(&self) -> String {
        self.server
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

/// The JetStream output: a [`Uplink`] for [`mintgate_mqtt::Publisher`].
#[derive(Debug)]
pub struct JetStream {
    target: Target,
    stats: Arc<OutputStats>,
}

impl JetStream {
    /// An output to `target`.
    pub fn new(target: Target) -> JetStream {
        JetStream {
            target,
            stats: Arc::default(),
        }
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<OutputStats> {
        self.stats.clone()
    }
}

enum Req {
    Publish {
        subject: String,
        id: String,
        payload: Vec<u8>,
    },
    Disconnect,
}

struct Handle {
    tx: mpsc::UnboundedSender<Req>,
    publisher: String,
    template: String,
}

impl Backend for Handle {
    fn publish(&self, m: &QueuedMessage) -> Result<(), String> {
        self.tx
            .send(Req::Publish {
                subject: subject_for(&self.template, &m.topic),
                id: msg_id(&self.publisher, m.id),
                payload: m.payload.clone(),
            })
            .map_err(|_| "the JetStream connection has ended".to_string())
    }

    fn subscribe(&self, _filter: &str) -> Result<(), String> {
        Err("the JetStream output does not subscribe".into())
    }

    fn settle(&self, _token: u64) {}

    fn disconnect(&self) {
        let _ = self.tx.send(Req::Disconnect);
    }
}

impl Uplink for JetStream {
    fn start(&self, publisher: &str) -> Conn {
        let (etx, erx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::unbounded_channel();
        let refused = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run(
            self.target.clone(),
            publisher.to_owned(),
            rx,
            etx,
            refused.clone(),
            self.stats.clone(),
        ));
        Conn::custom(
            Box::new(Handle {
                tx,
                publisher: publisher.to_owned(),
                template: self.target.subject.clone(),
            }),
            erx,
            task,
            refused,
        )
    }

    fn describe(&self) -> String {
        self.target.describe()
    }
}

type Events = mpsc::UnboundedSender<Result<LinkEvent, String>>;

/// A connected client and a receiver of its connection losses.
pub(crate) struct Connected {
    pub client: async_nats::Client,
    pub lost: mpsc::UnboundedReceiver<String>,
}

/// Connects a client named `name`; `refused` is set when the server
/// refused our credentials.
pub(crate) async fn connect(
    t: &Target,
    name: &str,
    refused: &AtomicBool,
) -> Result<Connected, String> {
    let (ltx, lost) = mpsc::unbounded_channel();
    let opts = t.connect_options(name).event_callback(move |ev| {
        let ltx = ltx.clone();
        async move {
            match ev {
                async_nats::Event::Disconnected | async_nats::Event::Closed => {
                    let _ = ltx.send(format!("connection {ev}"));
                }
                async_nats::Event::LameDuckMode => {
                    let _ = ltx.send("the server is going away (lame duck mode)".into());
                }
                _ => {}
            }
        }
    });
    match opts.connect(t.servers.as_slice()).await {
        Ok(client) => Ok(Connected { client, lost }),
        Err(e) => {
            if matches!(
                e.kind(),
                async_nats::ConnectErrorKind::AuthorizationViolation
                    | async_nats::ConnectErrorKind::Authentication
            ) {
                refused.store(true, Ordering::Relaxed);
            }
            Err(format!("connecting to {}: {e}", t.servers.join(",")))
        }
    }
}

/// Finds the stream (creating it when allowed).
pub(crate) async fn ensure_stream(
    t: &Target,
    js: &jetstream::Context,
) -> Result<jetstream::stream::Stream, String> {
    if t.create_stream {
        js.get_or_create_stream(t.stream_config())
            .await
            .map_err(|e| format!("stream {}: {e}", t.stream))
    } else {
        js.get_stream(&t.stream).await.map_err(|e| {
            format!(
                "stream {}: {e} (nats.create_stream = false: it must exist)",
                t.stream
            )
        })
    }
}

async fn run(
    t: Target,
    publisher: String,
    mut rx: mpsc::UnboundedReceiver<Req>,
    events: Events,
    refused: Arc<AtomicBool>,
    stats: Arc<OutputStats>,
) {
    if let Err(e) = publish(&t, &publisher, &mut rx, &events, &refused, &stats).await {
        let n = stats.failing.fetch_add(1, Ordering::Relaxed).min(6);
        let wait = std::time::Duration::from_millis(50 << n).min(std::time::Duration::from_secs(2));
        tokio::time::sleep(wait).await;
        let _ = events.send(Err(e));
    }
}

async fn publish(
    t: &Target,
    publisher: &str,
    rx: &mut mpsc::UnboundedReceiver<Req>,
    events: &Events,
    refused: &AtomicBool,
    stats: &OutputStats,
) -> Result<(), String> {
    let Connected { client, mut lost } = connect(t, publisher, refused).await?;
    let js = t.context(client.clone(), t.ack_timeout);
    if !stats.stream_found.load(Ordering::Relaxed) {
        ensure_stream(t, &js).await?;
        stats.stream_found.store(true, Ordering::Relaxed);
    }
    stats.connects.fetch_add(1, Ordering::Relaxed);
    let name = client.server_info().server_name;
    tracing::debug!("JetStream output connected to {name}");
    match stats.server.lock() {
        Ok(mut s) => *s = name,
        Err(p) => *p.into_inner() = name,
    }
    let _ = events.send(Ok(LinkEvent::Connected {
        session_present: false,
    }));
    let mut acks = FuturesOrdered::new();
    // Tokens of the publishes handed over, for the `Sent` events; the
    // driver holds at most its window (<= 1024) in flight, far below the
    // 65,535 a token cycles through.
    let mut token: u16 = 0;
    loop {
        tokio::select! {
            why = lost.recv() => {
                return Err(why.unwrap_or_else(|| "connection closed".into()));
            }
            req = rx.recv() => match req {
                Some(Req::Publish { subject, id, payload }) => {
                    let ack = js
                        .send_publish(
                            subject,
                            jetstream::message::PublishMessage::build()
                                .payload(payload.into())
                                .message_id(id),
                        )
                        .await
                        .map_err(|e| format!("publishing: {e}"))?;
                    token = token.checked_add(1).unwrap_or(1);
                    let _ = events.send(Ok(LinkEvent::Sent(token)));
                    let tok = token;
                    acks.push_back(async move { (tok, ack.await) });
                }
                Some(Req::Disconnect) | None => {
                    let _ = client.flush().await;
                    return Ok(());
                }
            },
            Some((tok, r)) = acks.next(), if !acks.is_empty() => {
                let ack = r.map_err(|e| format!("no acknowledgement from the stream: {e}"))?;
                if ack.duplicate {
                    stats.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                stats.failing.store(0, Ordering::Relaxed);
                let _ = events.send(Ok(LinkEvent::Acked(tok, Ok(()))));
            }
        }
    }
}
