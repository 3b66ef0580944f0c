//! The CoAP message format (RFC 7252 section 3), zero-copy.
//!
//! [`Packet`] is a checked view over a received datagram: constructing it
//! with [`Packet::new_checked`] walks the header, token and options once and
//! rejects every message-format error, after which all accessors are
//! infallible and borrow from the datagram. [`MessageWriter`] emits a message
//! into a caller-provided buffer with no allocation, and [`head_len`] tells in
//! advance how long the part before the payload will be, so a payload written
//! first can have its header prepended in place.
//!
//! [`tcp`] is the framing of CoAP over TCP, TLS and WebSockets (RFC 8323):
//! its own header, the same options and payload.

mod code;
mod option;
mod packet;
pub mod tcp;
mod writer;

pub use code::{Code, MessageType};
pub(crate) use option::first_option;
pub use option::{
    decode_uint, encode_uint, ContentFormat, OptionDef, OptionFormat, OptionIter, OptionNumber,
    RawOption,
};
pub use packet::{Packet, ParseError};
pub use tcp::{Framing, Signal, TcpPacket, TcpRepr};
pub use writer::{empty_message, head_len, MessageWriter, WriteError};

/// Version number carried in every CoAP message.
pub const VERSION: u8 = 1;
/// Fixed header length.
pub const HEADER_LEN: usize = 4;
/// Largest token length.
pub const MAX_TOKEN_LEN: usize = 8;
/// The byte that separates options from the payload.
pub const PAYLOAD_MARKER: u8 = 0xFF;
