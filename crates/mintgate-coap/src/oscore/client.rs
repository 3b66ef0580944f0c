//! OSCORE for the client's exchanges ([`crate::client`]): a request is
//! protected before the exchange gives it a message ID and token (neither
//! is protected, RFC 8613 4.2), and the answer verified after.

use bytes::Bytes;

use super::{Context, Error, RequestId};
use crate::client::{Event, Request};
use crate::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};

/// An inner answer: code, options, payload.
pub type Inner = (Code, Vec<(OptionNumber, Vec<u8>)>, Vec<u8>);

fn encode(code: Code, options: &[(OptionNumber, &[u8])], payload: &[u8]) -> Result<Vec<u8>, Error> {
    let mut opts = options.to_vec();
    opts.sort_by_key(|(n, _)| *n);
    let need = 16 + payload.len() + opts.iter().map(|(_, v)| v.len() + 5).sum::<usize>();
    let mut buf = vec![0u8; need];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, 0, &[])
        .map_err(|_| Error::TooLarge)?;
    for (n, v) in &opts {
        w.option(*n, v).map_err(|_| Error::TooLarge)?;
    }
    if !payload.is_empty() {
        w.payload(payload).map_err(|_| Error::TooLarge)?;
    }
    let n = w.finish();
    buf.truncate(n);
    Ok(buf)
}

fn split(msg: &[u8]) -> Result<Inner, Error> {
    let p = Packet::new_checked(msg).map_err(|_| Error::Malformed)?;
    Ok((
        p.code(),
        p.options().map(|o| (o.number, o.value.to_vec())).collect(),
        p.payload().to_vec(),
    ))
}

/// `req` protected: the outer request to send, and what its answer must
/// be verified against.
pub fn protect(ctx: &mut Context, req: &Request) -> Result<(Request, RequestId), Error> {
    let opts: Vec<(OptionNumber, &[u8])> = req.options.iter().map(|(n, v)| (*n, &v[..])).collect();
    let plain = encode(req.code, &opts, &req.payload)?;
    let (outer, id) = ctx.protect_request(&plain)?;
    let (code, options, payload) = split(&outer)?;
    Ok((
        Request {
            confirmable: req.confirmable,
            code,
            options,
            payload,
        },
        id,
    ))
}

/// Verifies an answer (its code, options and payload as received) to the
/// request `id` and returns the inner answer.
pub fn unprotect(
    ctx: &Context,
    code: Code,
    options: &[(OptionNumber, &[u8])],
    payload: &[u8],
    id: &RequestId,
) -> Result<Inner, Error> {
    let outer = encode(code, options, payload)?;
    split(&ctx.unprotect_response(&outer, id)?)
}

/// Why the answer to a protected request was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerError {
    /// It came unprotected: the server refused the request (an unknown
    /// context, a replay, a ciphertext that did not verify), with this code
    /// and diagnostic payload.
    Unprotected {
        /// The answer's code.
        code: Code,
        /// Its payload.
        payload: Bytes,
    },
    /// It did not verify.
    Oscore(Error),
}

/// The event of an exchange whose request was protected as `id`: a
/// response is verified and becomes its inner response (code, options,
/// payload; how and when it came stays); a timeout or a Reset passes as it
/// is.
pub fn open_event(ctx: &Context, id: &RequestId, ev: Event) -> Result<Event, AnswerError> {
    let Event::Response {
        id: exchange,
        code,
        msg_type,
        options,
        payload,
        rtt,
        retransmissions,
    } = ev
    else {
        return Ok(ev);
    };
    if !options.iter().any(|(n, _)| *n == super::OSCORE) {
        return Err(AnswerError::Unprotected { code, payload });
    }
    let opts: Vec<(OptionNumber, &[u8])> = options.iter().map(|(n, v)| (*n, &v[..])).collect();
    let (code, inner, payload) =
        unprotect(ctx, code, &opts, &payload, id).map_err(AnswerError::Oscore)?;
    Ok(Event::Response {
        id: exchange,
        code,
        msg_type,
        options: inner
            .into_iter()
            .map(|(n, v)| (n, Bytes::from(v)))
            .collect(),
        payload: Bytes::from(payload),
        rtt,
        retransmissions,
    })
}

/// OSCORE under a block-wise transfer ([`crate::client::blockwise`]): each
/// request the transfer hands out is protected on its own, with a Partial
/// IV of its own, and each answer verified against the request it answers.
/// The transfer sees only inner messages, so its Block1, Block2, Size and
/// Echo options are inner ones: inner block-wise (RFC 8613 4.1.3.4.1),
/// where every block is protected end to end and no proxy can mix blocks
/// of two bodies.
pub struct Sealer<'a> {
    ctx: &'a mut Context,
    pending: Option<RequestId>,
}

impl<'a> Sealer<'a> {
    /// Requests protected with `ctx`.
    pub fn new(ctx: &'a mut Context) -> Sealer<'a> {
        Sealer { ctx, pending: None }
    }

    /// Protects `req`; its answer is the next one [`Sealer::open`] takes.
    pub fn seal(&mut self, req: &Request) -> Result<Request, Error> {
        let (outer, id) = protect(self.ctx, req)?;
        self.pending = Some(id);
        Ok(outer)
    }

    /// Verifies an answer to the request sealed last and returns the inner
    /// answer. [`Error::Malformed`] when nothing was sealed.
    pub fn open(
        &mut self,
        code: Code,
        options: &[(OptionNumber, &[u8])],
        payload: &[u8],
    ) -> Result<Inner, Error> {
        let id = self.pending.as_ref().ok_or(Error::Malformed)?;
        unprotect(self.ctx, code, options, payload, id)
    }

    /// [`open_event`] for the exchange of the request sealed last.
    pub fn open_event(&mut self, ev: Event) -> Result<Event, AnswerError> {
        let id = self
            .pending
            .as_ref()
            .ok_or(AnswerError::Oscore(Error::Malformed))?;
        open_event(self.ctx, id, ev)
    }
}
