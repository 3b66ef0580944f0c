//! Device Management and the direct path (the system layer of paper 000's
//! middleware, and paper 001's direct path).
//!
//! - [`driver`]: the [`Driver`] trait every device implements, and the
//!   [`Running`] guard of a driver that produces events.
//! - [`sim`]: simulated sensors (constant, sine, random walk, step, square,
//!   replayed CSV) and a simulated actuator.
//! - [`attr`]: sysfs-style attribute files (one number per file), read and
//!   written either by reopening the file per access or through a file kept
//!   open (`pread`/`pwrite`).
//! - [`gpio`]: Linux GPIO character devices through `gpiocdev` (uAPI v2 edge
//!   events with kernel timestamps; output lines).
//! - [`modbus`]: Modbus TCP and RTU devices, each point a device of its own.
//! - [`opcua`]: OPC UA servers' nodes, read through a subscription, each
//!   node a device of its own.
//! - [`manager`]: the finder/linker: devices declared in the config or added
//!   through the API, started, looked up and removed at run time, each with
//!   its latest value and a bounded history.
//! - [`ticker`]: the one thread that samples every simulated sensor, at
//!   multiples of its period.
//! - [`store`]: histories persisted in a directory of append-only record
//!   files, so that a restart keeps them.
//! - [`directpath`]: the link table, filters, outputs, lock-free ring and
//!   high-priority worker of paper 001.
//!
//! Nothing here knows about CoAP: the gateway turns devices into resources
//! and plugs its Observe notifier into the hooks this crate offers.

// Input comes off the network: no panic may be reachable from it.

pub mod attr;
pub mod clock;
pub mod config;
pub mod directpath;
pub mod driver;
mod field;
pub mod gpio;
pub mod history;
pub mod manager;
pub mod modbus;
pub mod opcua;
pub mod parse;
pub mod sim;
pub mod store;
pub mod ticker;

pub use config::{DeviceKind, DeviceSpec, DevicesConfig};
pub use driver::{DeviceError, Direction, Driver, EventFn, LinkState, Running};
pub use manager::{Device, DeviceManager};
