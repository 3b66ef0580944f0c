//! CoAP over reliable transports (RFC 8323): the framing of CoAP over TCP
//! and TLS (section 3.2) and over WebSockets (section 4.2), zero-copy.
//!
//! ```text
//! TCP/TLS:    Len|TKL  [Extended Length 0/1/2/4]  Code  Token  Options  [0xFF Payload]
//! WebSocket:  0  |TKL                             Code  Token  Options  [0xFF Payload]
//! ```
//!
//! There is no version, type or message ID: the transport is reliable and
//! ordered. Len counts the options and payload: 0-12 as is, 13 with one
//! extension byte (13 + n), 14 with two (269 + n), 15 with four (65805 +
//! n). Over WebSockets Len is 0 and the WebSocket message carries the
//! length. Options and payload are coded as over UDP (RFC 7252 3.1), and
//! checked by the same walk as [`super::Packet`].
//!
//! [`TcpPacket`] is the checked view of one whole frame, [`frame_len`]
//! finds where a frame ends in a byte stream before it is complete,
//! [`TcpRepr`] is the parsed form that [`TcpRepr::emit`] writes back, and
//! [`Signal`] reads and writes the signalling messages of section 5 (7.01
//! CSM, 7.02 Ping, 7.03 Pong, 7.04 Release, 7.05 Abort).

use std::fmt;

use super::option::{ext_len, nibble, write_ext, OptionIter, RawOption};
use super::packet::check_options;
use super::{
    encode_uint, Code, MessageType, OptionNumber, Packet, ParseError, WriteError, MAX_TOKEN_LEN,
    PAYLOAD_MARKER, VERSION,
};

/// The Max-Message-Size a peer is held to until its CSM says otherwise
/// (RFC 8323 5.3.1).
pub const DEFAULT_MAX_MESSAGE_SIZE: u32 = 1152;

/// How frames are delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// CoAP over TCP or TLS: the frame carries its length.
    Stream,
    /// CoAP over WebSockets: one frame per WebSocket message, Len 0.
    WebSocket,
}

/// Why bytes are not a well-formed RFC 8323 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Token length 9-15 (reserved): a message format error.
    TokenLength(u8),
    /// Code class 1, 3 or 6 (reserved).
    ReservedCode(Code),
    /// The options and payload are malformed.
    Options(ParseError),
    /// A WebSocket frame with a Len other than 0.
    WebSocketLength,
    /// The frame is shorter than its header says.
    Truncated,
    /// The bytes go on past the frame's length.
    TrailingBytes,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TokenLength(l) => write!(f, "reserved token length {l}"),
            FrameError::ReservedCode(c) => write!(f, "reserved code class {}", c.class()),
            FrameError::Options(e) => write!(f, "{e}"),
            FrameError::WebSocketLength => f.write_str("WebSocket frame with a nonzero Len"),
            FrameError::Truncated => f.write_str("frame shorter than its length"),
            FrameError::TrailingBytes => f.write_str("bytes after the end of the frame"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Reads the first bytes of a frame: (offset of the code byte, token
/// length, length of options and payload). `Ok(None)` when more bytes are
/// needed to tell.
fn read_head(framing: Framing, b: &[u8]) -> Result<Option<(usize, usize, u64)>, FrameError> {
    let Some(&first) = b.first() else {
        return Ok(None);
    };
    let (len_nibble, tkl) = (first >> 4, first & 0x0f);
    if tkl as usize > MAX_TOKEN_LEN {
        return Err(FrameError::TokenLength(tkl));
    }
    let ext = match len_nibble {
        0..=12 => 0,
        13 => 1,
        14 => 2,
        _ => 4,
    };
    if framing == Framing::WebSocket {
        if len_nibble != 0 {
            return Err(FrameError::WebSocketLength);
        }
        let rest = b.len().saturating_sub(2 + tkl as usize);
        return Ok(Some((1, tkl as usize, rest as u64)));
    }
    let Some(e) = b.get(1..1 + ext) else {
        return Ok(None);
    };
    let n = e.iter().fold(0u64, |a, x| (a << 8) | *x as u64);
    let body = match len_nibble {
        0..=12 => len_nibble as u64,
        13 => n + 13,
        14 => n + 269,
        _ => n + 65805,
    };
    Ok(Some((1 + ext, tkl as usize, body)))
}

/// How long the stream frame at the start of `b` is (header, token,
/// options and payload), once its header is in: `Ok(None)` while more
/// bytes are needed to tell. Lets a reader refuse a frame too large before
/// buffering it.
pub fn frame_len(b: &[u8]) -> Result<Option<u64>, FrameError> {
    Ok(
        read_head(Framing::Stream, b)?
            .map(|(code_at, tkl, body)| (code_at + 1 + tkl) as u64 + body),
    )
}

/// Bytes before the options: length nibble and extension, code, token.
pub fn header_len(framing: Framing, token_len: usize, body_len: usize) -> usize {
    let ext = match framing {
        Framing::WebSocket => 0,
        Framing::Stream => match body_len {
            0..=12 => 0,
            13..=268 => 1,
            269..=65804 => 2,
            _ => 4,
        },
    };
    2 + ext + token_len
}

/// Writes the header of a frame whose options and payload are `body_len`
/// bytes; returns where the options start.
pub fn emit_header(
    framing: Framing,
    code: Code,
    token: &[u8],
    body_len: usize,
    buf: &mut [u8],
) -> Result<usize, WriteError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(WriteError::TokenTooLong);
    }
    let n = header_len(framing, token.len(), body_len);
    if buf.len() < n {
        return Err(WriteError::NoSpace);
    }
    let tkl = token.len() as u8;
    let mut pos = 1;
    let len_nibble = match framing {
        Framing::WebSocket => 0,
        Framing::Stream => match body_len {
            0..=12 => body_len as u8,
            13..=268 => {
                buf[1] = (body_len - 13) as u8;
                pos = 2;
                13
            }
            269..=65804 => {
                buf[1..3].copy_from_slice(&((body_len - 269) as u16).to_be_bytes());
                pos = 3;
                14
            }
            _ => {
                let v = u32::try_from(body_len - 65805).map_err(|_| WriteError::NoSpace)?;
                buf[1..5].copy_from_slice(&v.to_be_bytes());
                pos = 5;
                15
            }
        },
    };
    buf[0] = (len_nibble << 4) | tkl;
    buf[pos] = code.0;
    buf[pos + 1..pos + 1 + token.len()].copy_from_slice(token);
    Ok(n)
}

/// A read-only view of one RFC 8323 frame in `T`.
///
/// Invariant (after [`TcpPacket::new_checked`]): the header, token and
/// options are well formed and `opts_start <= opts_end <= payload_start <=
/// len`.
#[derive(Clone, Copy)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buf: T,
    code_at: u8,
    opts_end: u32,
    payload_start: u32,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Validates `buf` as exactly one frame.
    pub fn new_checked(buf: T, framing: Framing) -> Result<TcpPacket<T>, FrameError> {
        let b = buf.as_ref();
        let Some((code_at, tkl, body)) = read_head(framing, b)? else {
            return Err(FrameError::Truncated);
        };
        let opts_start = code_at + 1 + tkl;
        if b.len() < opts_start {
            return Err(FrameError::Truncated);
        }
        let total = opts_start as u64 + body;
        if (b.len() as u64) < total {
            return Err(FrameError::Truncated);
        }
        if b.len() as u64 > total {
            return Err(FrameError::TrailingBytes);
        }
        if b.len() > u32::MAX as usize {
            return Err(FrameError::Truncated);
        }
        let code = Code(b[code_at]);
        if matches!(code.class(), 1 | 3 | 6) {
            return Err(FrameError::ReservedCode(code));
        }
        let (opts_end, payload_start) =
            check_options(b, opts_start).map_err(FrameError::Options)?;
        Ok(TcpPacket {
            buf,
            code_at: code_at as u8,
            opts_end: opts_end as u32,
            payload_start: payload_start as u32,
        })
    }

    /// The code: a method, a response, 0.00 Empty or a signal (7.xx).
    #[inline]
    pub fn code(&self) -> Code {
        Code(self.buf.as_ref()[self.code_at as usize])
    }

    /// Whether this is a signalling message (RFC 8323 5).
    pub fn is_signal(&self) -> bool {
        self.code().class() == 7
    }

    /// The token (0-8 bytes).
    #[inline]
    pub fn token(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let start = self.code_at as usize + 1;
        &b[start..start + (b[0] & 0x0f) as usize]
    }

    fn opts_start(&self) -> usize {
        self.code_at as usize + 1 + (self.buf.as_ref()[0] & 0x0f) as usize
    }

    /// The options, in order.
    pub fn options(&self) -> OptionIter<'_> {
        OptionIter::new(&self.buf.as_ref()[self.opts_start()..self.opts_end as usize])
    }

    /// The options and payload as coded (what follows the token).
    pub fn body(&self) -> &[u8] {
        &self.buf.as_ref()[self.opts_start()..]
    }

    /// The payload (empty when there is none).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[self.payload_start as usize..]
    }

    /// The whole frame.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// The same message in the RFC 7252 format, with `ty` and `mid`, for
    /// the request layer that routes UDP requests (appended to `out`).
    /// `None` when the message is too large for a UDP message (64 KiB).
    pub fn to_udp(&self, ty: MessageType, mid: u16, out: &mut Vec<u8>) -> Option<()> {
        let body = self.body();
        let token = self.token();
        if 4 + token.len() + body.len() > u16::MAX as usize {
            return None;
        }
        let m = mid.to_be_bytes();
        out.extend_from_slice(&[
            (VERSION << 6) | ((ty as u8) << 4) | token.len() as u8,
            self.code().0,
            m[0],
            m[1],
        ]);
        out.extend_from_slice(token);
        out.extend_from_slice(body);
        Some(())
    }
}

impl<T: AsRef<[u8]>> fmt::Debug for TcpPacket<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opts: Vec<_> = self.options().map(|o| (o.number.0, o.value)).collect();
        f.debug_struct("TcpPacket")
            .field("code", &self.code())
            .field("token", &self.token())
            .field("options", &opts)
            .field("payload_len", &self.payload().len())
            .finish()
    }
}

/// Appends `p`, an RFC 7252 message (a response of the request layer), to
/// `out` as a frame: the type and message ID go, the rest stays.
pub fn frame_from_udp(framing: Framing, p: &Packet<&[u8]>, out: &mut Vec<u8>) {
    let token = p.token();
    let body = &p.as_bytes()[4 + token.len()..];
    let at = out.len();
    out.resize(at + header_len(framing, token.len(), body.len()), 0);
    // cannot fail: the space is there and the token is at most 8 bytes
    let _ = emit_header(framing, p.code(), token, body.len(), &mut out[at..]);
    out.extend_from_slice(body);
}

/// A frame in parsed form: what [`TcpRepr::emit`] writes and
/// [`TcpRepr::parse`] reads back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpRepr<'a> {
    /// The code.
    pub code: Code,
    /// The token (0-8 bytes).
    pub token: &'a [u8],
    /// The options, in ascending order.
    pub options: Vec<RawOption<'a>>,
    /// The payload.
    pub payload: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// Reads a checked frame.
    pub fn parse(p: &'a TcpPacket<&'a [u8]>) -> TcpRepr<'a> {
        TcpRepr {
            code: p.code(),
            token: p.token(),
            options: p.options().collect(),
            payload: p.payload(),
        }
    }

    /// Length of the options and payload.
    pub fn body_len(&self) -> usize {
        let mut n = 0;
        let mut prev = 0u32;
        for o in &self.options {
            let delta = (o.number.0 as u32).saturating_sub(prev);
            n += 1 + ext_len(delta) + ext_len(o.value.len() as u32) + o.value.len();
            prev = o.number.0 as u32;
        }
        if !self.payload.is_empty() {
            n += 1 + self.payload.len();
        }
        n
    }

    /// Length of the whole frame.
    pub fn buffer_len(&self, framing: Framing) -> usize {
        let body = self.body_len();
        header_len(framing, self.token.len(), body) + body
    }

    /// Writes the frame into `buf`; returns its length.
    pub fn emit(&self, framing: Framing, buf: &mut [u8]) -> Result<usize, WriteError> {
        let body = self.body_len();
        let mut pos = emit_header(framing, self.code, self.token, body, buf)?;
        if buf.len() < pos + body {
            return Err(WriteError::NoSpace);
        }
        let mut prev = 0u32;
        for o in &self.options {
            let num = o.number.0 as u32;
            if num < prev {
                return Err(WriteError::OptionOrder);
            }
            if o.value.len() > u16::MAX as usize {
                return Err(WriteError::NoSpace);
            }
            let (delta, len) = (num - prev, o.value.len() as u32);
            buf[pos] = (nibble(delta) << 4) | nibble(len);
            pos = write_ext(delta, buf, pos + 1);
            pos = write_ext(len, buf, pos);
            buf[pos..pos + o.value.len()].copy_from_slice(o.value);
            pos += o.value.len();
            prev = num;
        }
        if !self.payload.is_empty() {
            buf[pos] = PAYLOAD_MARKER;
            buf[pos + 1..pos + 1 + self.payload.len()].copy_from_slice(self.payload);
            pos += 1 + self.payload.len();
        }
        Ok(pos)
    }

    /// [`TcpRepr::emit`] appended to a vector.
    pub fn emit_vec(&self, framing: Framing, out: &mut Vec<u8>) -> Result<(), WriteError> {
        let at = out.len();
        out.resize(at + self.buffer_len(framing), 0);
        let n = self.emit(framing, &mut out[at..])?;
        out.truncate(at + n);
        Ok(())
    }
}

impl Code {
    /// 7.01 CSM (RFC 8323 5.3)
    pub const CSM: Code = Code::new(7, 1);
    /// 7.02 Ping (RFC 8323 5.4)
    pub const PING: Code = Code::new(7, 2);
    /// 7.03 Pong (RFC 8323 5.4)
    pub const PONG: Code = Code::new(7, 3);
    /// 7.04 Release (RFC 8323 5.5)
    pub const RELEASE: Code = Code::new(7, 4);
    /// 7.05 Abort (RFC 8323 5.6)
    pub const ABORT: Code = Code::new(7, 5);
}

/// Signalling option numbers (RFC 8323 11.2); each is defined for one
/// signalling code.
pub mod signal_option {
    use super::OptionNumber;
    /// CSM: Max-Message-Size (uint, 0-4 bytes).
    pub const MAX_MESSAGE_SIZE: OptionNumber = OptionNumber(2);
    /// CSM: Block-Wise-Transfer (empty): BERT is understood.
    pub const BLOCK_WISE_TRANSFER: OptionNumber = OptionNumber(4);
    /// Ping and Pong: Custody (empty).
    pub const CUSTODY: OptionNumber = OptionNumber(2);
    /// Release: Alternative-Address (string, 1-255 bytes).
    pub const ALTERNATIVE_ADDRESS: OptionNumber = OptionNumber(2);
    /// Release: Hold-Off (uint, 0-3 bytes), in seconds.
    pub const HOLD_OFF: OptionNumber = OptionNumber(4);
    /// Abort: Bad-CSM-Option (uint, 0-2 bytes).
    pub const BAD_CSM_OPTION: OptionNumber = OptionNumber(2);
}

/// A signalling message (RFC 8323 5), read or to be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal<'a> {
    /// 7.01 Capabilities and Settings Message.
    Csm {
        /// Largest message the sender takes.
        max_message_size: Option<u32>,
        /// The sender understands BERT (RFC 8323 6).
        block_wise: bool,
    },
    /// 7.02 Ping.
    Ping {
        /// The Pong should wait until earlier messages are processed.
        custody: bool,
    },
    /// 7.03 Pong.
    Pong {
        /// Custody given.
        custody: bool,
    },
    /// 7.04 Release: the sender will close the connection.
    Release {
        /// Where to reconnect.
        alternative_address: Option<&'a [u8]>,
        /// Seconds to wait before reconnecting.
        hold_off: Option<u32>,
    },
    /// 7.05 Abort: the sender closes the connection at once.
    Abort {
        /// The CSM option that made it abort.
        bad_csm_option: Option<u16>,
        /// Why, as diagnostic text (the payload).
        diagnostic: &'a [u8],
    },
}

/// Why a signalling message cannot be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalError {
    /// Not a signalling code, or 7.00 or 7.06 and above.
    UnknownCode(Code),
    /// A critical option this implementation does not know (section 5.3:
    /// for a CSM the answer is an Abort naming it).
    UnknownCritical(OptionNumber),
    /// A known option with a value of the wrong length.
    BadValue(OptionNumber),
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalError::UnknownCode(c) => write!(f, "unknown signalling code {c}"),
            SignalError::UnknownCritical(n) => {
                write!(f, "unknown critical signalling option {}", n.0)
            }
            SignalError::BadValue(n) => write!(f, "bad value of signalling option {}", n.0),
        }
    }
}

impl std::error::Error for SignalError {}

impl<'a> Signal<'a> {
    /// Reads a signalling message. Unknown elective options are ignored.
    pub fn parse(p: &'a TcpPacket<&'a [u8]>) -> Result<Signal<'a>, SignalError> {
        use signal_option::*;
        let code = p.code();
        let uint = |v: &[u8], max: usize, n: OptionNumber| {
            if v.len() > max {
                Err(SignalError::BadValue(n))
            } else {
                Ok(v.iter().fold(0u32, |a, b| (a << 8) | *b as u32))
            }
        };
        let empty = |v: &[u8], n: OptionNumber| {
            if v.is_empty() {
                Ok(true)
            } else {
                Err(SignalError::BadValue(n))
            }
        };
        let mut sig = match code {
            Code::CSM => Signal::Csm {
                max_message_size: None,
                block_wise: false,
            },
            Code::PING => Signal::Ping { custody: false },
            Code::PONG => Signal::Pong { custody: false },
            Code::RELEASE => Signal::Release {
                alternative_address: None,
                hold_off: None,
            },
            Code::ABORT => Signal::Abort {
                bad_csm_option: None,
                diagnostic: p.payload(),
            },
            c => return Err(SignalError::UnknownCode(c)),
        };
        for o in p.options() {
            let (n, v) = (o.number, o.value);
            match (&mut sig, n) {
                (
                    Signal::Csm {
                        max_message_size, ..
                    },
                    MAX_MESSAGE_SIZE,
                ) => *max_message_size = Some(uint(v, 4, n)?),
                (Signal::Csm { block_wise, .. }, BLOCK_WISE_TRANSFER) => *block_wise = empty(v, n)?,
                (Signal::Ping { custody } | Signal::Pong { custody }, CUSTODY) => {
                    *custody = empty(v, n)?
                }
                (
                    Signal::Release {
                        alternative_address,
                        ..
                    },
                    ALTERNATIVE_ADDRESS,
                ) => {
                    if v.is_empty() || v.len() > 255 {
                        return Err(SignalError::BadValue(n));
                    }
                    *alternative_address = Some(v)
                }
                (Signal::Release { hold_off, .. }, HOLD_OFF) => *hold_off = Some(uint(v, 3, n)?),
                (Signal::Abort { bad_csm_option, .. }, BAD_CSM_OPTION) => {
                    *bad_csm_option = Some(uint(v, 2, n)? as u16)
                }
                _ if n.is_critical() => return Err(SignalError::UnknownCritical(n)),
                _ => {}
            }
        }
        Ok(sig)
    }

    /// Appends the message as a frame with `token` to `out` (a Pong takes
    /// its Ping's token; the other signals usually have none).
    pub fn emit_vec(&self, framing: Framing, token: &[u8], out: &mut Vec<u8>) {
        use signal_option::*;
        let mut b = [0u8; 4];
        let mut options = Vec::new();
        let mut payload: &[u8] = &[];
        let code = match *self {
            Signal::Csm {
                max_message_size,
                block_wise,
            } => {
                if let Some(m) = max_message_size {
                    options.push(RawOption {
                        number: MAX_MESSAGE_SIZE,
                        value: encode_uint(m, &mut b),
                    });
                }
                if block_wise {
                    options.push(RawOption {
                        number: BLOCK_WISE_TRANSFER,
                        value: &[],
                    });
                }
                Code::CSM
            }
            Signal::Ping { custody } | Signal::Pong { custody } => {
                if custody {
                    options.push(RawOption {
                        number: CUSTODY,
                        value: &[],
                    });
                }
                if matches!(self, Signal::Ping { .. }) {
                    Code::PING
                } else {
                    Code::PONG
                }
            }
            Signal::Release {
                alternative_address,
                hold_off,
            } => {
                if let Some(a) = alternative_address {
                    options.push(RawOption {
                        number: ALTERNATIVE_ADDRESS,
                        value: a,
                    });
                }
                if let Some(h) = hold_off {
                    options.push(RawOption {
                        number: HOLD_OFF,
                        value: encode_uint(h, &mut b),
                    });
                }
                Code::RELEASE
            }
            Signal::Abort {
                bad_csm_option,
                diagnostic,
            } => {
                if let Some(o) = bad_csm_option {
                    options.push(RawOption {
                        number: BAD_CSM_OPTION,
                        value: encode_uint(o.into(), &mut b),
                    });
                }
                payload = diagnostic;
                Code::ABORT
            }
        };
        let repr = TcpRepr {
            code,
            token,
            options,
            payload,
        };
        // fails only for a token over 8 bytes: nothing is written then
        let _ = repr.emit_vec(framing, out);
    }
}

/// Frames waiting to be written, with where each ends: over a stream they
/// go out as one run of bytes, over WebSockets one message each (their
/// framing has no length field, so the boundaries are kept beside the
/// bytes).
///
/// Invariant: `ends` is increasing, each within `bytes`, and the last one
/// is `bytes.len()` once [`Outbox::end_message`] has been called after the
/// last frame was appended.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Where to append the next frame; call [`Outbox::end_message`] after.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Marks the end of a frame appended to [`Outbox::buf`].
    pub fn end_message(&mut self) {
        let at = self.bytes.len();
        if at > 0 && self.ends.last() != Some(&at) {
            self.ends.push(at);
        }
    }

    /// Every byte waiting, in order.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Drops what was appended after `at` (a frame that did not fit).
    pub fn truncate(&mut self, at: usize) {
        self.bytes.truncate(at);
        self.ends.retain(|&e| e <= at);
    }

    /// The first whole frame (over WebSockets, one binary message).
    pub fn next_message(&self) -> Option<&[u8]> {
        self.ends.first().and_then(|&e| self.bytes.get(..e))
    }

    /// Drops the first `n` bytes, written.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.bytes.len());
        self.bytes.drain(..n);
        self.ends.retain_mut(|e| {
            *e = e.saturating_sub(n);
            *e > 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_keeps_message_boundaries() {
        let mut o = Outbox::new();
        assert!(o.is_empty() && o.next_message().is_none());
        o.buf().extend_from_slice(b"abc");
        o.end_message();
        o.buf().extend_from_slice(b"de");
        o.end_message();
        o.end_message(); // twice: one boundary
        assert_eq!(o.bytes(), b"abcde");
        assert_eq!(o.next_message(), Some(&b"abc"[..]));
        // a frame that did not fit is taken back whole
        let at = o.len();
        o.buf().extend_from_slice(b"toolong");
        o.truncate(at);
        o.consume(3);
        assert_eq!(o.next_message(), Some(&b"de"[..]));
        // a stream writer may write part of a message
        o.consume(1);
        assert_eq!(o.next_message(), Some(&b"e"[..]));
        o.consume(10);
        assert!(o.is_empty() && o.next_message().is_none());
    }

    #[test]
    fn length_extensions_at_their_thresholds() {
        for (payload_len, first_nibble, head) in [
            (0usize, 0u8, 2usize),
            (11, 12, 2),
            (12, 13, 3),
            (267, 13, 3),
            (268, 14, 4),
            (65803, 14, 4),
            (65804, 15, 6),
        ] {
            let payload = vec![7u8; payload_len];
            let r = TcpRepr {
                code: Code::CONTENT,
                token: &[],
                options: vec![],
                payload: &payload,
            };
            let mut v = Vec::new();
            r.emit_vec(Framing::Stream, &mut v).unwrap();
            assert_eq!(v[0] >> 4, first_nibble, "payload {payload_len}");
            assert_eq!(v.len(), head + r.body_len());
            if head > 2 {
                assert_eq!(frame_len(&v[..head - 2]).unwrap(), None);
            }
            assert_eq!(frame_len(&v).unwrap(), Some(v.len() as u64));
            let p = TcpPacket::new_checked(&v[..], Framing::Stream).unwrap();
            assert_eq!(p.payload().len(), payload_len);
        }
    }

    #[test]
    fn rfc8323_example_get() {
        // Len 5 (Uri-Path "a" in 2 bytes, the marker, 2 payload bytes), TKL 1
        let frame = [0x51, 0x01, 0xAA, 0xB1, b'a', 0xFF, b'h', b'i'];
        let p = TcpPacket::new_checked(&frame[..], Framing::Stream).unwrap();
        assert_eq!(p.code(), Code::GET);
        assert_eq!(p.token(), &[0xAA]);
        assert_eq!(p.payload(), b"hi");
        assert_eq!(p.options().next().unwrap().value, b"a");
        let mut udp = Vec::new();
        p.to_udp(MessageType::Con, 9, &mut udp).unwrap();
        let u = Packet::new_checked(&udp[..]).unwrap();
        assert_eq!(
            (u.code(), u.token(), u.payload()),
            (Code::GET, &[0xAA][..], &b"hi"[..])
        );
        let mut back = Vec::new();
        frame_from_udp(Framing::Stream, &u, &mut back);
        assert_eq!(back, frame);
        // the same message over WebSockets
        let ws = [0x01, 0x01, 0xAA, 0xB1, b'a', 0xFF, b'h', b'i'];
        let w = TcpPacket::new_checked(&ws[..], Framing::WebSocket).unwrap();
        assert_eq!(w.payload(), b"hi");
        assert_eq!(
            TcpPacket::new_checked(&frame[..], Framing::WebSocket).err(),
            Some(FrameError::WebSocketLength)
        );
    }

    #[test]
    fn rejects_malformed_frames() {
        for (b, e) in [
            (&[0x09u8, 0x01][..], FrameError::TokenLength(9)),
            (&[0x30, 0x45, 0x00], FrameError::Truncated),
            (&[0x10, 0x45, 0x00, 0x00], FrameError::TrailingBytes),
            (&[0x00, 0x20], FrameError::ReservedCode(Code(0x20))),
            (
                &[0x10, 0x45, 0xFF],
                FrameError::Options(ParseError::EmptyPayload),
            ),
            (
                &[0x10, 0x45, 0xF0],
                FrameError::Options(ParseError::ReservedNibble),
            ),
            (&[0xD0], FrameError::Truncated),
        ] {
            assert_eq!(
                TcpPacket::new_checked(b, Framing::Stream).err(),
                Some(e),
                "{b:?}"
            );
        }
    }

    #[test]
    fn signals_round_trip_and_unknown_critical_options_refused() {
        for s in [
            Signal::Csm {
                max_message_size: Some(8192),
                block_wise: true,
            },
            Signal::Csm {
                max_message_size: None,
                block_wise: false,
            },
            Signal::Ping { custody: true },
            Signal::Pong { custody: false },
            Signal::Release {
                alternative_address: Some(b"coap+tcp://[::1]:9/"),
                hold_off: Some(30),
            },
            Signal::Abort {
                bad_csm_option: Some(9),
                diagnostic: b"bad CSM",
            },
        ] {
            for f in [Framing::Stream, Framing::WebSocket] {
                let mut v = Vec::new();
                s.emit_vec(f, b"tk", &mut v);
                let p = TcpPacket::new_checked(&v[..], f).unwrap();
                assert!(p.is_signal());
                assert_eq!(p.token(), b"tk");
                assert_eq!(Signal::parse(&p), Ok(s));
            }
        }
        // a CSM with the unknown critical option 9, and one with elective 10
        let bad = [0x20, Code::CSM.0, 0x90, 0x10];
        let p = TcpPacket::new_checked(&bad[..], Framing::Stream).unwrap();
        assert_eq!(
            Signal::parse(&p),
            Err(SignalError::UnknownCritical(OptionNumber(9)))
        );
        let ok = [0x10, Code::CSM.0, 0xA0];
        let p = TcpPacket::new_checked(&ok[..], Framing::Stream).unwrap();
        assert!(Signal::parse(&p).is_ok());
        let long = [0x60, Code::CSM.0, 0x25, 1, 2, 3, 4, 5];
        let p = TcpPacket::new_checked(&long[..], Framing::Stream).unwrap();
        assert_eq!(
            Signal::parse(&p),
            Err(SignalError::BadValue(OptionNumber(2)))
        );
    }
}
