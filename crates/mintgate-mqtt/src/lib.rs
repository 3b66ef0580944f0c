//! Ordered MQTT publishing (paper 004, "Publish Queue based Message
//! Transmission Techniques considering Performance Improvement in MQTT
//! Protocol", Lim, Park and Shon): a persistent publish
//! queue over rumqttc, and a receiver that de-duplicates and restores order.
//!
//! - [`payload`]: the JSON envelope (`pub`, `seq`, `ts`, `msg`) and its pure,
//!   total decoder.
//! - [`queue`]: the publish queue as a sans-IO state machine (window,
//!   acknowledgements, retransmission after a connection loss).
//! - [`store`]: its persistence (`redb`), durable on enqueue.
//! - [`publisher`]: the driver over a broker connection and the
//!   [`Publisher`] handle that the CLI, the lab and the gateway's bridges feed.
//! - [`reorder`]: the receiving side as a sans-IO state machine.
//! - [`subscriber`]: a subscription feeding a [`Reorder`] buffer.
//! - [`listener`]: a subscription handing raw (topic, payload) pairs to a
//!   handler (the bridge's command topics).
//! - [`broker`]: the embedded broker (rumqttd) and a mosquitto launcher.
//! - [`plain`]: plain QoS 1/2 publishing without the queue (the lab's
//!   baselines).
//! - [`conn`]: broker URLs and one rumqttc connection, MQTT 3.1.1 or 5.

// Input comes off the network: no panic may be reachable from it.

pub mod broker;
pub mod conn;
pub mod listener;
pub mod payload;
pub mod plain;
pub mod publisher;
pub mod queue;
pub mod reorder;
pub mod store;
pub mod subscriber;

pub use conn::{Backend, BrokerUrl, Qos, Secret, Security, Uplink, Version, Will};
pub use listener::{Listener, ListenerConfig, ListenerControl};
pub use payload::{decode, Envelope};
pub use publisher::{Publisher, PublisherConfig, StatusTopic};
pub use queue::PubQueue;
pub use reorder::{Reorder, ReorderConfig};
pub use subscriber::{SubEvent, Subscriber, SubscriberConfig};
