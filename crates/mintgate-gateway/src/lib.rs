//! The mintgate gateway: configuration, the Interaction pipeline over UDP,
//! the built-in resources, devices served as resources, the client side of
//! Observe and the MQTT bridges.

// Input comes off the network: no panic may be reachable from it.

pub mod access;
pub mod bridge;
pub mod bridge_format;
pub mod coap_tcp;
pub mod config;
pub mod dashboard;
pub mod devices;
pub mod dtls;
pub mod exposition;
pub mod health;
pub mod metrics;
pub mod observe;
pub mod observe_client;
pub mod oscore;
pub mod outbound;
pub mod pipeline;
pub mod process_metrics;
pub mod queue;
pub mod resources;
pub mod state;
pub mod udp;

pub use config::Config;
pub use pipeline::{Gateway, GatewayHandle, StartError};
