//! CoAP (RFC 7252) as a sans-IO core.
//!
//! - [`wire`]: the zero-copy message view and emitter.
//!
//! Nothing in this crate touches a socket or a clock: callers pass datagrams
//! and `Instant`s in and take datagrams and deadlines out, so every rule can
//! be tested in virtual time.

pub mod wire;
