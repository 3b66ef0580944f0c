//! mintgate's own lossy network (this machine has no netem).
//!
//! - [`loss`]: loss models (independent and bursty Gilbert-Elliott), seeded
//!   and deterministic, shared by the relay and the simulator to come.
//! - [`relay`]: a real UDP impairment relay that sits in front of any UDP
//!   server and applies loss, delay and jitter independently in each
//!   direction.

pub mod loss;
pub mod relay;
