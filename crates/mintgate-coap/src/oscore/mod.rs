//! OSCORE, Object Security for Constrained RESTful Environments (RFC 8613),
//! as a sans-IO layer between CoAP's message layer and its requests.
//!
//! - [`context`]: key derivation with HKDF-SHA-256, nonces, and the AEAD
//!   (AES-CCM-16-64-128, COSE algorithm 10) from RustCrypto's `ccm` and `aes`;
//! - [`option`]: the OSCORE option's value (6.1);
//! - [`replay`]: the replay window (7.4);
//! - [`Context`]: protecting and verifying requests and responses (8), with
//!   the option classes of section 4, the external AAD of 5.4, the sender
//!   sequence number reserved ahead of use through a [`SeqStore`]
//!   (Appendix B.1.1) and, when the replay window was lost, the Echo round
//!   trip of Appendix B.1.2.
//!
//! Observe (4.1.3.5): a request's Observe is inner and outer; a response's
//! inner Observe is empty and its outer one carries the number; a server
//! protects each notification after the first with a Partial IV of its own
//! ([`Context::protect_response`] with `fresh`), and a client verifies them
//! in order with [`Context::unprotect_notification`] (7.4.1).
//!
//! Block-wise (4.1.3.4): inner Block options pass as any inner option, so
//! a client's block-wise layer above [`client::Sealer`] makes inner
//! blocks; outer Block options are dropped here. Outer blocks are put
//! together before verification by the server's Block1 store
//! ([`crate::server::endpoint::Endpoint::outer_block1`]).

pub mod client;
pub mod context;
pub mod option;
pub mod replay;

mod cbor;
mod protect;

#[cfg(test)]
mod tests;

use std::fmt;

pub use context::{derive, nonce, partial_iv, Derived, Params};
pub use option::OscoreOption;
pub use protect::{aad, option_of, Context, Notifications, RequestId, SeqStore, Unprotected};
pub use replay::ReplayWindow;

use crate::wire::OptionNumber;

/// Largest OSCORE message put together from outer blocks, bytes: the
/// MAX_UNFRAGMENTED_SIZE of RFC 8613 4.1.3.4.2 (4096, as Californium
/// uses); a longer one is discarded.
pub const MAX_UNFRAGMENTED_SIZE: usize = 4096;

/// The OSCORE option (RFC 8613 2): critical, unsafe, not repeatable.
pub const OSCORE: OptionNumber = OptionNumber(9);

/// Why a message could not be protected or verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The OSCORE option's value is malformed (answer 4.02 Bad Option).
    BadOption,
    /// No context for the kid and kid context (answer 4.01).
    UnknownContext,
    /// The Partial IV was seen before or is below the window (answer 4.01).
    Replay,
    /// The ciphertext does not verify (answer 4.00 Bad Request).
    Decrypt,
    /// The message is not what OSCORE expects (no OSCORE option, no
    /// Partial IV in a request, a plaintext that is no inner message).
    Malformed,
    /// The message or its protected form does not fit.
    TooLarge,
    /// The sender sequence number is used up (2^40); the context must be
    /// renewed.
    Exhausted,
    /// The sequence number store failed: nothing is sent, so no nonce is
    /// used that a restart could use again.
    Store(String),
    /// The replay window is unknown since a restart: answer with the
    /// protected 4.01 and Echo that [`Context::echo_challenge`] makes
    /// (RFC 8613 B.1.2).
    EchoRequired(RequestId),
    /// An invalid context parameter.
    Config(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadOption => f.write_str("malformed OSCORE option"),
            Error::UnknownContext => f.write_str("security context not found"),
            Error::Replay => f.write_str("replay detected"),
            Error::Decrypt => f.write_str("decryption failed"),
            Error::Malformed => f.write_str("not an OSCORE message"),
            Error::TooLarge => f.write_str("message too large"),
            Error::Exhausted => f.write_str("sender sequence numbers used up"),
            Error::Store(e) => write!(f, "sequence number store: {e}"),
            Error::EchoRequired(_) => f.write_str("replay window unknown: Echo required"),
            Error::Config(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for Error {}
