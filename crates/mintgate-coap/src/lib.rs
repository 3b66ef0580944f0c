//! CoAP (RFC 7252) as a sans-IO core.
//!
//! - [`wire`]: the zero-copy message view and emitter.
//! - [`client`]: the client endpoint (CON/NON exchanges, token matching,
//!   NSTART), driven by explicit `Instant`s.
//! - [`link_format`]: reading RFC 6690 link-format documents.
//! - [`uri`]: `coap://` URIs split into a destination and request options.
//! - [`rto`]: the pluggable retransmission-timeout controllers (RFC 7252
//!   Basic; CoCoA and Adaptive RTO implement the same trait).
//! - [`cache`]: the Max-Age cache of other servers' responses, with ETag
//!   validation (RFC 7252 5.6).
//!
//! Nothing in this crate touches a socket or a clock: callers pass datagrams
//! and `Instant`s in and take datagrams and deadlines out, so every rule can
//! be tested in virtual time.

// Input comes off the network: no panic may be reachable from it.

pub mod oscore;
pub mod server;
pub mod wire;

pub mod cache;
pub mod client;
pub mod link_format;
pub mod rto;
pub mod uri;
