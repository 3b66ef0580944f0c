//! The mintgate gateway: configuration, the Interaction pipeline over UDP and
//! the built-in resources.

pub mod config;
pub mod dashboard;
pub mod devices;
pub mod metrics;
pub mod observe;
pub mod pipeline;
pub mod queue;
pub mod resources;
pub mod udp;

pub use config::Config;
pub use pipeline::{Gateway, GatewayHandle, StartError};
