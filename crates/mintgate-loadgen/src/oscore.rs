//! OSCORE (RFC 8613) for the load: each request is protected on its way
//! out and each answer verified and decrypted on its way in.
//!
//! A worker holds its own security contexts (never shared with another
//! thread) and gives each of its clients one of them, round robin. Clients
//! that share a context share its sender sequence number, so their requests
//! leave in sequence-number order; the server's replay window (RFC 8613
//! 7.4; mintgate's is 1,024 wide, other servers' as little as 32) accepts
//! them as long as it sees them no further out of order than its width. One context per client keeps every client's requests in
//! a window of their own.
//!
//! What a request must be verified against ([`RequestId`]) is kept per slot,
//! so an answer is matched by its token first (as a plain one) and then
//! decrypted with the request of that slot.

use mintgate_coap::oscore::{Context, Error, RequestId};
use mintgate_coap::wire::{Code, Packet};

use crate::template::Token;

/// The contexts of one worker and the requests in flight under them.
pub struct Protector {
    ctxs: Vec<Context>,
    /// Slots per client.
    cap: usize,
    /// Per slot (`client * cap + slot`): the request it carries.
    ids: Vec<Option<RequestId>>,
}

impl Protector {
    /// `ctxs` (at least one) for `clients` clients of `cap` slots each.
    pub fn new(ctxs: Vec<Context>, clients: usize, cap: usize) -> Protector {
        debug_assert!(!ctxs.is_empty());
        Protector {
            ctxs,
            cap,
            ids: vec![None; clients * cap],
        }
    }

    /// Protects the request `buf[..len]` (message ID and token already in
    /// place) of client `c` in slot `tok`, in place; returns its new length.
    /// An error when the context refuses (its sequence numbers are used up,
    /// its store failed) or the request grows past `buf`.
    pub fn protect(
        &mut self,
        c: usize,
        tok: Token,
        buf: &mut [u8],
        len: usize,
    ) -> Result<usize, Error> {
        let k = c % self.ctxs.len();
        let (out, id) = self.ctxs[k].protect_request(&buf[..len])?;
        let dst = buf.get_mut(..out.len()).ok_or(Error::TooLarge)?;
        dst.copy_from_slice(&out);
        if let Some(s) = self.ids.get_mut(c * self.cap + tok.slot as usize) {
            *s = Some(id);
        }
        Ok(out.len())
    }

    /// Verifies and decrypts `datagram`, the answer of client `c` in slot
    /// `tok` (already matched by its token): the inner response's code, or
    /// `None` when it does not verify (or is not protected at all).
    pub fn verify(&mut self, c: usize, tok: Token, datagram: &[u8]) -> Option<Code> {
        let id = self.ids.get_mut(c * self.cap + tok.slot as usize)?.take()?;
        let inner = self.ctxs[c % self.ctxs.len()]
            .unprotect_response(datagram, &id)
            .ok()?;
        Packet::new_checked(&inner[..]).ok().map(|p| p.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mintgate_coap::oscore::Params;
    use mintgate_coap::wire::{MessageType, MessageWriter};

    fn params(sender: u8, recipient: u8) -> Params {
        Params {
            master_secret: (1..=16).collect(),
            master_salt: vec![0x9e, 0x7c, 0xa9, 0x22, 0x23, 0x78, 0x63, 0x40],
            sender_id: vec![sender],
            recipient_id: vec![recipient],
            id_context: None,
        }
    }

    #[test]
    fn a_protected_request_is_answered_and_verified_by_slot() {
        let clients = 3;
        let mut p = Protector::new(
            vec![
                Context::new(&params(1, 0)).unwrap(),
                Context::new(&params(2, 0)).unwrap(),
            ],
            clients,
            4,
        );
        // the server's side of client 2's context (client 2 % 2 = context 0)
        let mut server = Context::new(&params(0, 1)).unwrap();
        let tmpl = crate::template::RequestTemplate::new("/request", false).unwrap();
        let mut buf = vec![0u8; 256];
        let n = tmpl.bytes().len();
        buf[..n].copy_from_slice(tmpl.bytes());
        let tok = Token { slot: 3, gen: 9 };
        crate::template::RequestTemplate::patch(&mut buf, 7, tok);
        let len = p.protect(2, tok, &mut buf, n).unwrap();
        let got = Packet::new_checked(&buf[..len]).unwrap();
        assert_eq!(got.code(), Code::POST, "the outer code of a protected GET");
        assert_eq!(got.token(), tok.to_bytes());
        let u = server.unprotect_request(&buf[..len]).unwrap();
        assert_eq!(
            Packet::new_checked(&u.message[..]).unwrap().code(),
            Code::GET
        );

        let mut plain = [0u8; 64];
        let mut w = MessageWriter::new(
            &mut plain,
            MessageType::Non,
            Code::CONTENT,
            7,
            &tok.to_bytes(),
        )
        .unwrap();
        w.payload(b"hello world").unwrap();
        let m = w.finish();
        let answer = server
            .protect_response(&plain[..m], &u.request, false)
            .unwrap();
        // the wrong client's slot does not verify, the right one does once
        assert_eq!(p.verify(1, tok, &answer), None);
        assert_eq!(p.verify(2, tok, &answer), Some(Code::CONTENT));
        assert_eq!(p.verify(2, tok, &answer), None, "the slot is used up");
        // an unprotected answer does not verify
        buf[..n].copy_from_slice(tmpl.bytes());
        crate::template::RequestTemplate::patch(&mut buf, 8, tok);
        let len = p.protect(2, tok, &mut buf, n).unwrap();
        assert!(len > n);
        assert_eq!(p.verify(2, tok, &plain[..m]), None);
    }
}
