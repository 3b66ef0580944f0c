//! The receiving side: a JetStream pull consumer behind
//! [`mintgate_mqtt::Subscriber`] (its reorder buffer de-duplicates and
//! restores each publisher's order).
//!
//! Messages come to the subscriber as [`LinkEvent::Held`]; the subscriber
//! settles one when it has delivered it in order, or dropped it as a
//! duplicate, and only then is it acknowledged to the stream. A durable
//! consumer (`--durable NAME`) therefore resumes, in a later run or after
//! a reconnection, at the first message not delivered: nothing delivered
//! comes again except what was in flight when the process died (the
//! reorder buffer drops those within a run; a new run's buffer starts at
//! whatever comes first). What the stream delivered but nobody settled
//! (a lost connection) it delivers again after `ack_wait`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use mintgate_mqtt::conn::{Backend, Conn, LinkEvent, Uplink};
use mintgate_mqtt::queue::QueuedMessage;
use tokio::sync::mpsc;

use crate::config::Target;
use crate::output::{connect, ensure_stream, Connected};

/// How long the stream waits for a delivered message's acknowledgement
/// before delivering it again.
pub const ACK_WAIT: Duration = Duration::from_secs(3);

/// Most messages delivered and not yet acknowledged (the held ones of the
/// reorder buffer, bounded by it).
pub const MAX_ACK_PENDING: i64 = 20_000;

/// A pull consumer of a stream: a [`Uplink`] for
/// [`mintgate_mqtt::Subscriber`] (with `SubscriberConfig::topic` as its
/// subject filter; empty or `>`: the whole stream).
#[derive(Debug)]
pub struct Consumer {
    target: Target,
    durable: Option<String>,
    /// Tokens are unique over all connections, so that one settled after
    /// its connection ended is not taken for another's.
    tokens: Arc<AtomicU64>,
}

impl Consumer {
    /// A consumer of `target.stream`, durable under `durable` (resuming
    /// where the last one with that name stopped), or ephemeral.
    pub fn new(target: Target, durable: Option<String>) -> Result<Consumer, String> {
        if let Some(d) = &durable {
            crate::config::check_stream_name(d).map_err(|e| format!("durable name: {e}"))?;
        }
        Ok(Consumer {
            target,
            durable,
            tokens: Arc::default(),
        })
    }
}

enum Req {
    Subscribe(String),
    Settle(u64),
    Disconnect,
}

struct Handle {
    tx: mpsc::UnboundedSender<Req>,
}

impl Backend for Handle {
    fn publish(&self, _m: &QueuedMessage) -> Result<(), String> {
        Err("a JetStream consumer does not publish".into())
    }

    fn subscribe(&self, filter: &str) -> Result<(), String> {
        self.tx
            .send(Req::Subscribe(filter.to_owned()))
            .map_err(|_| "the JetStream connection has ended".to_string())
    }

    fn settle(&self, token: u64) {
        let _ = self.tx.send(Req::Settle(token));
    }

    fn disconnect(&self) {
        let _ = self.tx.send(Req::Disconnect);
    }
}

impl Uplink for Consumer {
    fn start(&self, name: &str) -> Conn {
        let (etx, erx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::unbounded_channel();
        let refused = Arc::new(AtomicBool::new(false));
        let (t, durable, tokens, r) = (
            self.target.clone(),
            self.durable.clone(),
            self.tokens.clone(),
            refused.clone(),
        );
        let name = name.to_owned();
        let task = tokio::spawn(async move {
            if let Err(e) = consume(&t, durable, &name, rx, &etx, &r, &tokens).await {
                let _ = etx.send(Err(e));
            }
        });
        Conn::custom(Box::new(Handle { tx }), erx, task, refused)
    }

    fn describe(&self) -> String {
        self.target.describe()
    }
}

async fn consume(
    t: &Target,
    durable: Option<String>,
    name: &str,
    mut rx: mpsc::UnboundedReceiver<Req>,
    events: &mpsc::UnboundedSender<Result<LinkEvent, String>>,
    refused: &AtomicBool,
    tokens: &AtomicU64,
) -> Result<(), String> {
    let Connected { client, mut lost } = connect(t, name, refused).await?;
    let js = t.context(client.clone(), std::time::Duration::from_secs(5));
    let _ = events.send(Ok(LinkEvent::Connected {
        session_present: durable.is_some(),
    }));
    // Wait for the subscription (the subscriber asks on `Connected`).
    let filter = loop {
        tokio::select! {
            why = lost.recv() => return Err(why.unwrap_or_else(|| "connection closed".into())),
            req = rx.recv() => match req {
                Some(Req::Subscribe(f)) => break f,
                Some(Req::Settle(_)) => {}
                Some(Req::Disconnect) | None => return Ok(()),
            }
        }
    };
    let stream = ensure_stream(t, &js).await?;
    let config = jetstream::consumer::pull::Config {
        durable_name: durable.clone(),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        deliver_policy: jetstream::consumer::DeliverPolicy::All,
        ack_wait: ACK_WAIT,
        max_ack_pending: MAX_ACK_PENDING,
        filter_subject: if filter.is_empty() || filter == ">" {
            String::new()
        } else {
            filter
        },
        ..Default::default()
    };
    let consumer = match &durable {
        Some(d) => stream.get_or_create_consumer(d, config).await,
        None => stream.create_consumer(config).await,
    }
    .map_err(|e| format!("consumer of stream {}: {e}", t.stream))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("pulling from stream {}: {e}", t.stream))?;
    let _ = events.send(Ok(LinkEvent::SubAck(true)));
    let mut held: HashMap<u64, jetstream::Message> = HashMap::new();
    loop {
        tokio::select! {
            why = lost.recv() => return Err(why.unwrap_or_else(|| "connection closed".into())),
            req = rx.recv() => match req {
                Some(Req::Settle(tok)) => {
                    if let Some(m) = held.remove(&tok) {
                        m.ack().await.map_err(|e| format!("acknowledging: {e}"))?;
                    }
                }
                Some(Req::Subscribe(_)) => {}
                Some(Req::Disconnect) | None => {
                    let _ = client.flush().await;
                    return Ok(());
                }
            },
            m = messages.next() => match m {
                Some(Ok(m)) => {
                    let token = tokens.fetch_add(1, Ordering::Relaxed);
                    let _ = events.send(Ok(LinkEvent::Held {
                        topic: m.subject.to_string(),
                        payload: m.payload.to_vec(),
                        token,
                    }));
                    held.insert(token, m);
                }
                Some(Err(e)) => return Err(format!("pulling from stream {}: {e}", t.stream)),
                None => return Err(format!("the pull from stream {} ended", t.stream)),
            }
        }
    }
}
