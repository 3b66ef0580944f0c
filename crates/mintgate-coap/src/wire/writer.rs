//! Emitting messages into caller-provided buffers.

use std::fmt;

use super::option::{encode_uint, ext_len, nibble, write_ext};
use super::{Code, MessageType, OptionNumber, HEADER_LEN, MAX_TOKEN_LEN, PAYLOAD_MARKER, VERSION};

/// Why a message could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The buffer is too small.
    NoSpace,
    /// Token longer than 8 bytes.
    TokenTooLong,
    /// Options must be written in ascending number order.
    OptionOrder,
    /// Nothing may follow the payload.
    AfterPayload,
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WriteError::NoSpace => "buffer too small for the message",
            WriteError::TokenTooLong => "token longer than 8 bytes",
            WriteError::OptionOrder => "options written out of order",
            WriteError::AfterPayload => "option written after the payload",
        })
    }
}

impl std::error::Error for WriteError {}

/// Bytes before the payload: header, token, options (given as
/// `(number, value length)` in ascending order) and, when `payload_len > 0`,
/// the payload marker.
pub fn head_len(
    token_len: usize,
    options: impl IntoIterator<Item = (u16, usize)>,
    payload_len: usize,
) -> usize {
    let mut n = HEADER_LEN + token_len;
    let mut prev = 0u32;
    for (num, len) in options {
        let delta = num as u32 - prev;
        n += 1 + ext_len(delta) + ext_len(len as u32) + len;
        prev = num as u32;
    }
    if payload_len > 0 {
        n += 1;
    }
    n
}

/// Writes one message front to back into a borrowed buffer.
///
/// Options must come in ascending order; the payload (or the marker alone,
/// when the payload is placed behind the buffer by the caller) comes last.
pub struct MessageWriter<'b> {
    buf: &'b mut [u8],
    pos: usize,
    last: u32,
    closed: bool,
}

impl<'b> MessageWriter<'b> {
    /// Writes the header and token.
    pub fn new(
        buf: &'b mut [u8],
        ty: MessageType,
        code: Code,
        mid: u16,
        token: &[u8],
    ) -> Result<MessageWriter<'b>, WriteError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(WriteError::TokenTooLong);
        }
        let n = HEADER_LEN + token.len();
        if buf.len() < n {
            return Err(WriteError::NoSpace);
        }
        buf[0] = (VERSION << 6) | ((ty as u8) << 4) | token.len() as u8;
        buf[1] = code.0;
        buf[2..4].copy_from_slice(&mid.to_be_bytes());
        buf[4..n].copy_from_slice(token);
        Ok(MessageWriter {
            buf,
            pos: n,
            last: 0,
            closed: false,
        })
    }

    /// Appends an option.
    pub fn option(&mut self, number: OptionNumber, value: &[u8]) -> Result<&mut Self, WriteError> {
        if self.closed {
            return Err(WriteError::AfterPayload);
        }
        let num = number.0 as u32;
        if num < self.last {
            return Err(WriteError::OptionOrder);
        }
        let delta = num - self.last;
        let len = value.len() as u32;
        let need = 1 + ext_len(delta) + ext_len(len) + value.len();
        if self.buf.len() - self.pos < need {
            return Err(WriteError::NoSpace);
        }
        self.buf[self.pos] = (nibble(delta) << 4) | nibble(len);
        let mut p = write_ext(delta, self.buf, self.pos + 1);
        p = write_ext(len, self.buf, p);
        self.buf[p..p + value.len()].copy_from_slice(value);
        self.pos = p + value.len();
        self.last = num;
        Ok(self)
    }

    /// Appends an option with an unsigned integer value, minimally encoded.
    pub fn option_uint(&mut self, number: OptionNumber, v: u32) -> Result<&mut Self, WriteError> {
        let mut b = [0; 4];
        let enc = encode_uint(v, &mut b);
        self.option(number, enc)
    }

    /// Appends one Uri-Path (or other string option) per `/`-separated
    /// segment of `path`, skipping a leading `/`.
    pub fn path_options(
        &mut self,
        number: OptionNumber,
        path: &str,
    ) -> Result<&mut Self, WriteError> {
        let p = path.strip_prefix('/').unwrap_or(path);
        if p.is_empty() {
            return Ok(self);
        }
        for seg in p.split('/') {
            self.option(number, seg.as_bytes())?;
        }
        Ok(self)
    }

    /// Appends the payload marker and the payload (nothing when empty).
    pub fn payload(&mut self, payload: &[u8]) -> Result<&mut Self, WriteError> {
        if self.closed {
            return Err(WriteError::AfterPayload);
        }
        if payload.is_empty() {
            self.closed = true;
            return Ok(self);
        }
        if self.buf.len() - self.pos < 1 + payload.len() {
            return Err(WriteError::NoSpace);
        }
        self.buf[self.pos] = PAYLOAD_MARKER;
        self.buf[self.pos + 1..self.pos + 1 + payload.len()].copy_from_slice(payload);
        self.pos += 1 + payload.len();
        self.closed = true;
        Ok(self)
    }

    /// Appends only the payload marker: the caller places the payload right
    /// behind this buffer (zero-copy encapsulation).
    pub fn payload_marker(&mut self) -> Result<&mut Self, WriteError> {
        if self.closed {
            return Err(WriteError::AfterPayload);
        }
        if self.pos >= self.buf.len() {
            return Err(WriteError::NoSpace);
        }
        self.buf[self.pos] = PAYLOAD_MARKER;
        self.pos += 1;
        self.closed = true;
        Ok(self)
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.pos
    }

    /// True if nothing was written (never, after `new`).
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// Ends the message; returns its length.
    pub fn finish(self) -> usize {
        self.pos
    }
}

/// Writes an empty message (ACK or RST) with `mid`: always 4 bytes.
pub fn empty_message(ty: MessageType, mid: u16) -> [u8; 4] {
    let m = mid.to_be_bytes();
    [(VERSION << 6) | ((ty as u8) << 4), 0, m[0], m[1]]
}

#[cfg(test)]
mod tests {
    use super::super::Packet;
    use super::*;

    #[test]
    fn writes_extended_deltas_and_lengths() {
        let mut buf = [0u8; 2048];
        let long = vec![b'x'; 300];
        let mut w =
            MessageWriter::new(&mut buf, MessageType::Con, Code::GET, 0x1234, b"tok").unwrap();
        w.option(OptionNumber::URI_PATH, b"a").unwrap();
        w.option(OptionNumber(11 + 13), &long[..13]).unwrap();
        w.option(OptionNumber(2000), &long).unwrap();
        w.payload(b"body").unwrap();
        let n = w.finish();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        let opts: Vec<_> = p.options().map(|o| (o.number.0, o.value.len())).collect();
        assert_eq!(opts, vec![(11, 1), (24, 13), (2000, 300)]);
        assert_eq!(p.payload(), b"body");
        assert_eq!(p.token(), b"tok");
        assert_eq!(n, head_len(3, [(11, 1), (24, 13), (2000, 300)], 4) + 4);
    }

    #[test]
    fn rejects_out_of_order_and_after_payload() {
        let mut buf = [0u8; 64];
        let mut w = MessageWriter::new(&mut buf, MessageType::Non, Code::GET, 1, &[]).unwrap();
        w.option(OptionNumber::URI_PATH, b"a").unwrap();
        assert_eq!(
            w.option(OptionNumber::ETAG, b"1").err(),
            Some(WriteError::OptionOrder)
        );
        w.payload(b"p").unwrap();
        assert_eq!(
            w.option(OptionNumber::URI_QUERY, b"q").err(),
            Some(WriteError::AfterPayload)
        );
        let mut tiny = [0u8; 3];
        assert!(MessageWriter::new(&mut tiny, MessageType::Non, Code::GET, 1, &[]).is_err());
        assert_eq!(
            MessageWriter::new(&mut buf, MessageType::Non, Code::GET, 1, &[0; 9]).err(),
            Some(WriteError::TokenTooLong)
        );
    }

    #[test]
    fn empty_messages() {
        let m = empty_message(MessageType::Rst, 0xBEEF);
        let p = Packet::new_checked(&m[..]).unwrap();
        assert_eq!(p.msg_type(), MessageType::Rst);
        assert_eq!(p.message_id(), 0xBEEF);
        assert!(p.code().is_empty());
    }
}
