//! OSCORE for the client's exchanges ([`crate::client`]): a request is
//! protected before the exchange gives it a message ID and token (neither
//! is protected, RFC 8613 4.2), and the answer verified after.

use bytes::Bytes;

use super::{Context, Error, RequestId};
use crate::client::{Event, Request};
use crate::server::block::BlockOpt;
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
pub fn open_event(ctx: &Context, id: &RequestId, mut ev: Event) -> Result<Event, AnswerError> {
    let Event::Response {
        code,
        options,
        payload,
        ..
    } = &mut ev
    else {
        return Ok(ev);
    };
    if !options.iter().any(|(n, _)| *n == super::OSCORE) {
        return Err(AnswerError::Unprotected {
            code: *code,
            payload: std::mem::take(payload),
        });
    }
    let opts: Vec<(OptionNumber, &[u8])> = options.iter().map(|(n, v)| (*n, &v[..])).collect();
    let (inner_code, inner, inner_payload) =
        unprotect(ctx, *code, &opts, payload, id).map_err(AnswerError::Oscore)?;
    *code = inner_code;
    *options = inner
        .into_iter()
        .map(|(n, v)| (n, Bytes::from(v)))
        .collect();
    *payload = Bytes::from(inner_payload);
    Ok(ev)
}

pub use super::MAX_UNFRAGMENTED_SIZE;

/// What to do with an answer to a protected request.
#[derive(Debug)]
pub enum Outer {
    /// The answer is whole (it came in one message, or its outer blocks
    /// are all in): verify it.
    Whole(Event),
    /// It is a block of an answer that a proxy cut into outer Block2 blocks
    /// (RFC 8613 4.1.3.4.2): send this, the protected request again (the
    /// same message: no new Partial IV) with the outer Block2 of the next
    /// block.
    Next(Request),
}

/// An answer cut into outer Block2 blocks, put back together before it is
/// verified (RFC 8613 4.1.3.4.2: the blocks are outside the protection, so
/// nothing about them can be checked until the whole answer verifies).
/// Bounded by [`MAX_UNFRAGMENTED_SIZE`].
#[derive(Debug, Default)]
pub struct OuterBlocks {
    body: Vec<u8>,
}

impl OuterBlocks {
    /// Takes the answer `ev` to the protected request `sent`.
    pub fn on_event(&mut self, sent: &Request, mut ev: Event) -> Result<Outer, AnswerError> {
        let Event::Response {
            options, payload, ..
        } = &mut ev
        else {
            return Ok(Outer::Whole(ev));
        };
        let block2 = options
            .iter()
            .find(|(n, _)| *n == OptionNumber::BLOCK2)
            .map(|(_, v)| crate::wire::decode_uint(v).and_then(BlockOpt::decode));
        let b = match block2 {
            None if self.body.is_empty() => return Ok(Outer::Whole(ev)),
            Some(Some(b)) => b,
            // a later block without Block2, or a malformed one
            _ => return Err(AnswerError::Oscore(Error::Malformed)),
        };
        if b.num as usize * b.size() != self.body.len() {
            // not the block that continues the answer
            self.body.clear();
            return Err(AnswerError::Oscore(Error::Malformed));
        }
        if self.body.len() + payload.len() > MAX_UNFRAGMENTED_SIZE {
            self.body.clear();
            return Err(AnswerError::Oscore(Error::TooLarge));
        }
        self.body.extend_from_slice(payload);
        if b.more {
            let mut next = sent.clone();
            next.options.retain(|(n, _)| *n != OptionNumber::BLOCK2);
            let mut v = [0u8; 4];
            let next_num = BlockOpt {
                num: b.num + 1,
                more: false,
                szx: b.szx,
            };
            next.options.push((
                OptionNumber::BLOCK2,
                crate::wire::encode_uint(next_num.encode(), &mut v).to_vec(),
            ));
            return Ok(Outer::Next(next));
        }
        options.retain(|(n, _)| *n != OptionNumber::BLOCK2 && *n != OptionNumber::SIZE2);
        *payload = Bytes::from(std::mem::take(&mut self.body));
        Ok(Outer::Whole(ev))
    }
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
    /// The protected request sent last (asked again for outer blocks).
    sent: Option<Request>,
    outer: OuterBlocks,
}

impl<'a> Sealer<'a> {
    /// Requests protected with `ctx`.
    pub fn new(ctx: &'a mut Context) -> Sealer<'a> {
        Sealer {
            ctx,
            pending: None,
            sent: None,
            outer: OuterBlocks::default(),
        }
    }

    /// Protects `req`; its answer is the next one [`Sealer::open`] takes.
    pub fn seal(&mut self, req: &Request) -> Result<Request, Error> {
        let (outer, id) = protect(self.ctx, req)?;
        self.pending = Some(id);
        self.sent = Some(outer.clone());
        self.outer = OuterBlocks::default();
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

    /// The answer to the request sealed last: [`Outer::Next`] while a
    /// proxy's outer blocks come in ([`OuterBlocks`]), then the whole
    /// answer verified ([`open_event`]) as [`Outer::Whole`].
    pub fn open_event(&mut self, ev: Event) -> Result<Outer, AnswerError> {
        let (Some(id), Some(sent)) = (&self.pending, &self.sent) else {
            return Err(AnswerError::Oscore(Error::Malformed));
        };
        match self.outer.on_event(sent, ev)? {
            Outer::Whole(ev) => open_event(self.ctx, id, ev).map(Outer::Whole),
            next => Ok(next),
        }
    }
}
