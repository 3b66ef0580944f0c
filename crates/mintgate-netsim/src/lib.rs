//! mintgate's lossy network (this machine has no netem).
//!
//! - [`loss`]: loss models (independent and bursty Gilbert-Elliott), seeded
//!   and deterministic, shared by the relay and the simulator.
//! - [`sim`]: a network simulator in virtual time (links with delay, jitter,
//!   queueing and loss; hop-by-hop routing) that runs mintgate's real
//!   sans-IO CoAP client and server, with the paper's multi-hop chain ready
//!   to run ([`sim::chain`]).
//! - [`relay`]: a real UDP impairment relay that sits in front of any UDP
//!   server and applies loss, delay and jitter independently in each
//!   direction.
//! - [`tcp_relay`]: a real TCP delay relay that models a network link in
//!   front of any TCP server (an MQTT broker, an HTTP server).

pub mod loss;
pub mod relay;
pub mod sim;
pub mod tcp_relay;
