//! A NATS JetStream output for the persistent publish queue, and the
//! receiving side over a durable pull consumer.
//!
//! - [`config`]: the `[nats]` config section and what it resolves to (a
//!   [`Target`]: servers, credentials, TLS, stream, subject template).
//! - [`subject`]: MQTT-style topics -> NATS subjects, by the template.
//! - [`output`]: the publish queue's JetStream transport ([`JetStream`],
//!   a [`mintgate_mqtt::Uplink`]): every message is published with the
//!   header `Nats-Msg-Id` = publisher id and the queue's message id, so that
//!   a resend after a kill or a lost acknowledgement is stored once (the
//!   stream's duplicate window); the JetStream publish acknowledgement is
//!   the queue's acknowledgement; a window of several in flight.
//! - [`consumer`]: a durable pull consumer behind
//!   [`mintgate_mqtt::Subscriber`]: de-duplicated and in order per publisher
//!   by the same reorder buffer as MQTT; a message is acknowledged to the
//!   stream only once delivered in order (or dropped as a duplicate), so a
//!   durable consumer resumes where it stopped.
//! - [`cluster`]: a private nats-server cluster on loopback (tests, lab).

// Input comes off the network: no panic may be reachable from it.

pub mod cluster;
pub mod config;
pub mod consumer;
pub mod output;
pub mod subject;

pub use async_nats;
pub use config::{NatsSection, Target};
pub use consumer::Consumer;
pub use output::JetStream;
