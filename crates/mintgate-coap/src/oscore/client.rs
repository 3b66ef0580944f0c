//! OSCORE for the client's exchanges ([`crate::client`]): a request is
//! protected before the exchange gives it a message ID and token (neither
//! is protected, RFC 8613 4.2), and the answer verified after.

use super::{Context, Error, RequestId};
use crate::client::Request;
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
