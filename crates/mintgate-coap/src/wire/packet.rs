//! A checked, zero-copy view of a CoAP message.

use std::fmt;

use super::option::{read_ext, OptionIter, RawOption};
use super::{Code, MessageType, HEADER_LEN, MAX_TOKEN_LEN, PAYLOAD_MARKER, VERSION};

/// Why a datagram is not a well-formed CoAP message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Fewer than four bytes: not even a header.
    TooShort,
    /// A version other than 1: to be silently ignored (RFC 7252 3).
    UnknownVersion(u8),
    /// Token length 9-15 (reserved).
    TokenLength(u8),
    /// Code class 1, 3, 6 or 7 (reserved).
    ReservedCode(Code),
    /// An Empty message (0.00) with a token, options or payload.
    EmptyWithContent,
    /// Option delta or length nibble 15 that is not the payload marker.
    ReservedNibble,
    /// An option header, extension or value runs past the datagram.
    Truncated,
    /// Option number past 65535.
    OptionNumberOverflow,
    /// A payload marker followed by no payload.
    EmptyPayload,
}

impl ParseError {
    /// Whether the header is readable, so the sender's message ID and type
    /// can be used to answer with a Reset (all but short and unknown version).
    pub fn has_header(self) -> bool {
        !matches!(self, ParseError::TooShort | ParseError::UnknownVersion(_))
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::TooShort => write!(f, "shorter than the 4-byte header"),
            ParseError::UnknownVersion(v) => write!(f, "unknown version {v}"),
            ParseError::TokenLength(l) => write!(f, "reserved token length {l}"),
            ParseError::ReservedCode(c) => write!(f, "reserved code class {}", c.class()),
            ParseError::EmptyWithContent => {
                write!(f, "empty message with token, options or payload")
            }
            ParseError::ReservedNibble => write!(f, "reserved option nibble 15"),
            ParseError::Truncated => write!(f, "option runs past the end of the datagram"),
            ParseError::OptionNumberOverflow => write!(f, "option number past 65535"),
            ParseError::EmptyPayload => write!(f, "payload marker followed by no payload"),
        }
    }
}

impl std::error::Error for ParseError {}

/// A read-only view of a CoAP message in `T`.
///
/// Invariant (after [`Packet::new_checked`]): the header, token and option
/// region are well formed and `opts_end <= payload_start <= len`.
#[derive(Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
    opts_end: u16,
    payload_start: u16,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates `buf` as a CoAP message (every rule of RFC 7252 section 3)
    /// in one pass over the options.
    pub fn new_checked(buf: T) -> Result<Packet<T>, ParseError> {
        let (opts_end, payload_start) = check(buf.as_ref())?;
        Ok(Packet {
            buf,
            opts_end: opts_end as u16,
            payload_start: payload_start as u16,
        })
    }

    /// Reads version, type, code and message ID without validating the
    /// rest: enough to answer a malformed CON with a Reset.
    pub fn peek_header(buf: &[u8]) -> Option<(u8, MessageType, Code, u16)> {
        if buf.len() < HEADER_LEN {
            return None;
        }
        Some((
            buf[0] >> 6,
            MessageType::from_bits(buf[0] >> 4),
            Code(buf[1]),
            u16::from_be_bytes([buf[2], buf[3]]),
        ))
    }

    /// The message type.
    #[inline]
    pub fn msg_type(&self) -> MessageType {
        MessageType::from_bits(self.buf.as_ref()[0] >> 4)
    }

    /// The code.
    #[inline]
    pub fn code(&self) -> Code {
        Code(self.buf.as_ref()[1])
    }

    /// The message ID.
    #[inline]
    pub fn message_id(&self) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[2], b[3]])
    }

    /// The token (0-8 bytes).
    #[inline]
    pub fn token(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let tkl = (b[0] & 0x0f) as usize;
        &b[HEADER_LEN..HEADER_LEN + tkl]
    }

    /// The options, in order.
    #[inline]
    pub fn options(&self) -> OptionIter<'_> {
        let b = self.buf.as_ref();
        let start = HEADER_LEN + (b[0] & 0x0f) as usize;
        OptionIter::new(&b[start..self.opts_end as usize])
    }

    /// The first option with `number`.
    pub fn option(&self, number: super::OptionNumber) -> Option<RawOption<'_>> {
        self.options().find(|o| o.number == number)
    }

    /// The payload (empty when there is none).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[self.payload_start as usize..]
    }

    /// Byte offset of the payload inside the buffer.
    pub fn payload_offset(&self) -> usize {
        self.payload_start as usize
    }

    /// The whole message.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: AsRef<[u8]>> fmt::Debug for Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Packet");
        d.field("type", &self.msg_type())
            .field("code", &self.code())
            .field("mid", &self.message_id())
            .field("token", &self.token());
        let opts: Vec<_> = self.options().map(|o| (o.number.0, o.value)).collect();
        d.field("options", &opts)
            .field("payload_len", &self.payload().len())
            .finish()
    }
}

/// Walks the message; returns (end of options, start of payload).
fn check(b: &[u8]) -> Result<(usize, usize), ParseError> {
    if b.len() < HEADER_LEN {
        return Err(ParseError::TooShort);
    }
    if b.len() > u16::MAX as usize {
        return Err(ParseError::Truncated);
    }
    let version = b[0] >> 6;
    if version != VERSION {
        return Err(ParseError::UnknownVersion(version));
    }
    let tkl = b[0] & 0x0f;
    if tkl as usize > MAX_TOKEN_LEN {
        return Err(ParseError::TokenLength(tkl));
    }
    let code = Code(b[1]);
    if code.is_empty() {
        // RFC 7252 4.1: token length 0 and nothing after the message ID
        return if b.len() == HEADER_LEN && tkl == 0 {
            Ok((HEADER_LEN, HEADER_LEN))
        } else {
            Err(ParseError::EmptyWithContent)
        };
    }
    if code.is_reserved() {
        return Err(ParseError::ReservedCode(code));
    }
    check_options(b, HEADER_LEN + tkl as usize)
}

/// Walks the options and payload of `b` from `pos` (just after the token):
/// returns (end of options, start of payload). Shared with the RFC 8323
/// framing ([`super::tcp`]), whose options and payload are coded alike.
pub(crate) fn check_options(b: &[u8], mut pos: usize) -> Result<(usize, usize), ParseError> {
    if pos > b.len() {
        return Err(ParseError::Truncated);
    }
    let mut number: u32 = 0;
    while pos < b.len() {
        let h = b[pos];
        if h == PAYLOAD_MARKER {
            if pos + 1 == b.len() {
                return Err(ParseError::EmptyPayload);
            }
            return Ok((pos, pos + 1));
        }
        pos += 1;
        let delta = read_ext(h >> 4, b, &mut pos).map_err(|_| nibble_err(h >> 4))?;
        let len = read_ext(h & 0x0f, b, &mut pos).map_err(|_| nibble_err(h & 0x0f))? as usize;
        number += delta;
        if number > u16::MAX as u32 {
            return Err(ParseError::OptionNumberOverflow);
        }
        pos += len;
        if pos > b.len() {
            return Err(ParseError::Truncated);
        }
    }
    Ok((b.len(), b.len()))
}

fn nibble_err(n: u8) -> ParseError {
    if n == 15 {
        ParseError::ReservedNibble
    } else {
        ParseError::Truncated
    }
}
