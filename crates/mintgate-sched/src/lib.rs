//! The System Scheduler of paper 000's middleware: thread pools, the
//! Performance Observer and the VTA controller.
//!
//! - [`ThreadPool`]: a named pool whose size can be changed at run time, so
//!   that a controller (VTA) can drive the Handler Thread Pool.
//! - [`ThreadPoolManager`]: the four thread groups (Application Service,
//!   Resource Management, Interaction, Performance Profile); [`priority`]:
//!   the Priority Manager.
//! - [`Vta`]: the Variable Thread Adjustment controller.
//! - [`Observer`]: the Performance Observer. Every stage counts into one
//!   [`PipelineCounters`]; the observer turns the counters into one
//!   [`Sample`] per second and keeps the last ones.
//! - [`BatchSwitch`]: when a Network Receiver or handler thread gives up
//!   wake-up preemption (`SCHED_BATCH`) under heavy load.

mod batch_switch;
mod manager;
mod observer;
mod pool;
pub mod priority;
mod vta;

pub use batch_switch::BatchSwitch;
pub use manager::{Group, GroupStats, QueueFull, ThreadPoolManager};
pub use observer::{Observer, ObserverHandle, PipelineCounters, Sample};
pub use pool::{ThreadPool, Worker};
pub use vta::{Climb, Decision, Trial, Vta, VtaConfig};
