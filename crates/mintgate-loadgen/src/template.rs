//! Preformatted requests and the classification of what comes back.
//!
//! A request is formatted once with [`MessageWriter`]; every send copies
//! nothing but patches the message ID (bytes 2-3) and the 4-byte token
//! (bytes 4-7) in place. The token names the request's slot and the slot's
//! generation, so a response is matched without any lookup structure and a
//! late answer to an expired request (older generation) is recognised.

use mintgate_coap::wire::{
    Code, MessageType, MessageWriter, OptionNumber, Packet, WriteError, HEADER_LEN,
};

/// Token length of every request.
pub const TOKEN_LEN: usize = 4;
/// Largest request the template accepts (header, token, Uri-Path options).
pub const MAX_REQUEST: usize = 1024;

/// What a request's token carries: its slot among the client's slots and
/// the slot's generation at the time of the send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// Slot index, local to the client.
    pub slot: u16,
    /// Generation of the slot (bumped on every reuse).
    pub gen: u16,
}

impl Token {
    /// Wire form: slot then generation, big endian.
    pub fn to_bytes(self) -> [u8; TOKEN_LEN] {
        let s = self.slot.to_be_bytes();
        let g = self.gen.to_be_bytes();
        [s[0], s[1], g[0], g[1]]
    }

    /// Reads a token of exactly [`TOKEN_LEN`] bytes; anything else is not ours.
    pub fn from_bytes(b: &[u8]) -> Option<Token> {
        match *b {
            [s0, s1, g0, g1] => Some(Token {
                slot: u16::from_be_bytes([s0, s1]),
                gen: u16::from_be_bytes([g0, g1]),
            }),
            _ => None,
        }
    }
}

/// A GET request formatted once, patched per send.
///
/// Invariant: `bytes` is a well-formed CoAP GET with a [`TOKEN_LEN`]-byte
/// token, so patching bytes 2..8 keeps it well formed.
#[derive(Clone, Debug)]
pub struct RequestTemplate {
    bytes: Box<[u8]>,
}

impl RequestTemplate {
    /// Formats `GET path` as CON or NON.
    pub fn new(path: &str, confirmable: bool) -> Result<RequestTemplate, WriteError> {
        let ty = if confirmable {
            MessageType::Con
        } else {
            MessageType::Non
        };
        let mut buf = [0u8; MAX_REQUEST];
        let mut w = MessageWriter::new(&mut buf, ty, Code::GET, 0, &[0; TOKEN_LEN])?;
        w.path_options(OptionNumber::URI_PATH, path)?;
        let n = w.finish();
        Ok(RequestTemplate {
            bytes: buf[..n].into(),
        })
    }

    /// The formatted request (message ID 0, token zero).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Writes message ID and token into `buf`, which holds a copy of
    /// [`RequestTemplate::bytes`].
    #[inline]
    pub fn patch(buf: &mut [u8], mid: u16, token: Token) {
        buf[2..HEADER_LEN].copy_from_slice(&mid.to_be_bytes());
        buf[HEADER_LEN..HEADER_LEN + TOKEN_LEN].copy_from_slice(&token.to_bytes());
    }
}

/// What a received datagram means to the load generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A response (2.xx, 4.xx or 5.xx) carrying one of our tokens: piggybacked
    /// in an ACK, or separate in a CON (which must be acknowledged) or NON.
    Response {
        /// Message type.
        ty: MessageType,
        /// Message ID.
        mid: u16,
        /// Our token.
        token: Token,
        /// Response code.
        code: Code,
    },
    /// An empty ACK: the server took a CON and will answer separately.
    EmptyAck,
    /// A Reset: the server rejected the request with this message ID.
    Reset {
        /// Message ID of the rejected request.
        mid: u16,
    },
    /// Malformed, a request, or a token that is not ours.
    Other,
}

/// Classifies one datagram.
pub fn classify(datagram: &[u8]) -> Reply {
    let Ok(p) = Packet::new_checked(datagram) else {
        return Reply::Other;
    };
    let code = p.code();
    if code.is_empty() {
        return match p.msg_type() {
            MessageType::Ack => Reply::EmptyAck,
            MessageType::Rst => Reply::Reset {
                mid: p.message_id(),
            },
            _ => Reply::Other,
        };
    }
    if !code.is_response() || p.msg_type() == MessageType::Rst {
        return Reply::Other;
    }
    match Token::from_bytes(p.token()) {
        Some(token) => Reply::Response {
            ty: p.msg_type(),
            mid: p.message_id(),
            token,
            code,
        },
        None => Reply::Other,
    }
}

/// The empty ACK that acknowledges a separate CON response with `mid`.
pub fn empty_ack(mid: u16) -> [u8; HEADER_LEN] {
    let m = mid.to_be_bytes();
    [0x40 | ((MessageType::Ack as u8) << 4), 0, m[0], m[1]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(ty: MessageType, code: Code, mid: u16, token: &[u8]) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let mut w = MessageWriter::new(&mut buf, ty, code, mid, token).unwrap();
        w.payload(b"hello world").unwrap();
        let n = w.finish();
        buf[..n].to_vec()
    }

    #[test]
    fn template_patches_mid_and_token_only() {
        let t = RequestTemplate::new("/a/request", true).unwrap();
        let mut buf = t.bytes().to_vec();
        let tok = Token {
            slot: 0x0102,
            gen: 0xBEEF,
        };
        RequestTemplate::patch(&mut buf, 0xA1B2, tok);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.msg_type(), MessageType::Con);
        assert_eq!(p.code(), Code::GET);
        assert_eq!(p.message_id(), 0xA1B2);
        assert_eq!(Token::from_bytes(p.token()), Some(tok));
        let path: Vec<_> = p
            .options()
            .filter(|o| o.number == OptionNumber::URI_PATH)
            .map(|o| o.value.to_vec())
            .collect();
        assert_eq!(path, vec![b"a".to_vec(), b"request".to_vec()]);
        assert_eq!(buf[8..], t.bytes()[8..]);

        let root = RequestTemplate::new("/", false).unwrap();
        let p = Packet::new_checked(root.bytes()).unwrap();
        assert_eq!(p.msg_type(), MessageType::Non);
        assert_eq!(p.options().count(), 0);
    }

    #[test]
    fn overlong_path_is_an_error() {
        let long = format!("/{}", "x".repeat(MAX_REQUEST));
        assert_eq!(
            RequestTemplate::new(&long, false).err(),
            Some(WriteError::NoSpace)
        );
    }

    #[test]
    fn classifies_responses() {
        let tok = Token { slot: 3, gen: 7 };
        let r = response(MessageType::Ack, Code::CONTENT, 9, &tok.to_bytes());
        assert_eq!(
            classify(&r),
            Reply::Response {
                ty: MessageType::Ack,
                mid: 9,
                token: tok,
                code: Code::CONTENT
            }
        );
        let r = response(MessageType::Non, Code::NOT_FOUND, 1, &tok.to_bytes());
        assert!(matches!(
            classify(&r),
            Reply::Response {
                code: Code::NOT_FOUND,
                ..
            }
        ));
        // Wrong token length, a request, garbage: not ours.
        assert_eq!(
            classify(&response(MessageType::Non, Code::CONTENT, 1, b"ab")),
            Reply::Other
        );
        assert_eq!(
            classify(&response(MessageType::Non, Code::GET, 1, &tok.to_bytes())),
            Reply::Other
        );
        assert_eq!(classify(&[0xFF, 0, 0]), Reply::Other);
        assert_eq!(classify(&empty_ack(5)), Reply::EmptyAck);
        assert_eq!(classify(&[0x70, 0, 0, 5]), Reply::Reset { mid: 5 });
        assert_eq!(classify(&[0x40, 0, 0, 5]), Reply::Other); // CoAP ping
    }
}
