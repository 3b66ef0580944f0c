//! Protecting and verifying messages (RFC 8613 8) with one security
//! context.

use super::cbor;
use super::context::{self, Key, Params, MAX_SEQ, NONCE_LEN};
use super::option::OscoreOption;
use super::replay::ReplayWindow;
use super::{Error, OSCORE};
use crate::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};

/// Where the sender sequence number is made durable before use
/// (RFC 8613 B.1.1): [`Context`] asks for a new limit every `step` numbers
/// and uses no number at or above the last limit the store accepted.
pub trait SeqStore: Send {
    /// Makes it durable (written and synced) that numbers below `limit` may
    /// have been used; after a restart the context starts at `limit`.
    fn persist(&mut self, limit: u64) -> std::io::Result<()>;
}

/// What a response is bound to: the request's kid and Partial IV (the
/// external AAD of 5.4) and its nonce (reused by a response without a
/// Partial IV of its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId {
    /// The request's kid (its sender's Sender ID).
    pub kid: Vec<u8>,
    /// The request's Partial IV.
    pub piv: Vec<u8>,
    /// The request's nonce.
    pub nonce: [u8; NONCE_LEN],
}

/// What a client keeps of one observation to verify its notifications
/// (RFC 8613 4.1.3.5.2, 7.4.1): the Notification Number, the largest
/// Partial IV of the notifications verified so far, and whether any answer
/// came.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Notifications {
    number: Option<u64>,
    answered: bool,
}

impl Notifications {
    /// The Notification Number: the largest Partial IV verified, if any.
    pub fn number(&self) -> Option<u64> {
        self.number
    }
}

/// A verified request.
#[derive(Clone, Debug)]
pub struct Unprotected {
    /// The inner request as a whole CoAP message: the outer header, token
    /// and Uri-Host/Uri-Port/Proxy-Scheme, the inner code, options and
    /// payload.
    pub message: Vec<u8>,
    /// What the response must be bound to.
    pub request: RequestId,
}

/// Options only ever outer (class U of RFC 8613 4.1): Uri-Host, Uri-Port,
/// Proxy-Uri, Proxy-Scheme. The OSCORE option itself is outer too.
fn outer_only(n: OptionNumber) -> bool {
    matches!(n.0, 3 | 7 | 35 | 39) || n == OSCORE
}

/// The Enc_structure of RFC 8613 5.3 with the external AAD of 5.4:
/// `["Encrypt0", h'', bstr .cbor [1, [10], kid, piv, h'']]`.
pub fn aad(kid: &[u8], piv: &[u8]) -> Vec<u8> {
    let mut arr = Vec::with_capacity(8 + kid.len() + piv.len());
    arr.extend_from_slice(&[0x85, 0x01, 0x81, context::AES_CCM_16_64_128]);
    cbor::bstr(&mut arr, kid);
    cbor::bstr(&mut arr, piv);
    cbor::bstr(&mut arr, &[]);
    let mut out = Vec::with_capacity(16 + arr.len());
    out.push(0x83);
    cbor::tstr(&mut out, "Encrypt0");
    cbor::bstr(&mut out, &[]);
    cbor::bstr(&mut out, &arr);
    out
}

/// The plaintext of 5.3: code, the inner options, and the payload behind
/// its marker.
fn plaintext(
    code: Code,
    inner: &[(OptionNumber, &[u8])],
    payload: &[u8],
) -> Result<Vec<u8>, Error> {
    let need = 8 + payload.len() + inner.iter().map(|(_, v)| v.len() + 5).sum::<usize>();
    let mut buf = vec![0u8; need];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, 0, &[])
        .map_err(|_| Error::TooLarge)?;
    for (n, v) in inner {
        w.option(*n, v).map_err(|_| Error::TooLarge)?;
    }
    if !payload.is_empty() {
        w.payload(payload).map_err(|_| Error::TooLarge)?;
    }
    let len = w.finish();
    let mut pt = Vec::with_capacity(len + context::TAG_LEN);
    pt.push(buf[1]);
    pt.extend_from_slice(&buf[4..len]);
    Ok(pt)
}

/// The plaintext of a whole message: its code, class E options, payload.
/// A response's inner Observe is empty (RFC 8613 4.1.3.5.2): its number
/// travels outside, and the notification's order is its Partial IV.
fn plaintext_of(p: &Packet<&[u8]>, response: bool) -> Result<Vec<u8>, Error> {
    let inner: Vec<(OptionNumber, &[u8])> = p
        .options()
        .filter(|o| !outer_only(o.number))
        .map(|o| match o.number {
            OptionNumber::OBSERVE if response => (o.number, &[][..]),
            _ => (o.number, o.value),
        })
        .collect();
    plaintext(p.code(), &inner, p.payload())
}

/// The whole message made of `outer`'s header and token and `opts`
/// (sorted here, stably) with `code` and `payload`.
fn message(
    outer: &Packet<&[u8]>,
    code: Code,
    opts: &mut [(OptionNumber, &[u8])],
    payload: &[u8],
) -> Result<Vec<u8>, Error> {
    opts.sort_by_key(|(n, _)| *n);
    let need = 16 + payload.len() + opts.iter().map(|(_, v)| v.len() + 5).sum::<usize>();
    let mut buf = vec![0u8; need];
    let mut w = MessageWriter::new(
        &mut buf,
        outer.msg_type(),
        code,
        outer.message_id(),
        outer.token(),
    )
    .map_err(|_| Error::TooLarge)?;
    for (n, v) in opts.iter() {
        w.option(*n, v).map_err(|_| Error::TooLarge)?;
    }
    if !payload.is_empty() {
        w.payload(payload).map_err(|_| Error::TooLarge)?;
    }
    let len = w.finish();
    buf.truncate(len);
    Ok(buf)
}

/// The outer message's OSCORE option value, checked to occur once.
fn oscore_value<'a>(p: &'a Packet<&'a [u8]>) -> Result<&'a [u8], Error> {
    match option_of_raw(p) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(e),
        None => Err(Error::Malformed),
    }
}

fn option_of_raw<'a>(p: &'a Packet<&'a [u8]>) -> Option<Result<&'a [u8], Error>> {
    let mut it = p.options().filter(|o| o.number == OSCORE);
    let first = it.next()?;
    if it.next().is_some() {
        return Some(Err(Error::BadOption));
    }
    Some(Ok(first.value))
}

/// Decrypts the outer message's payload and puts the inner message
/// together: outer header, token and class U options, inner code, options
/// and payload.
fn open_inner(
    key: &Key,
    nonce: &[u8; NONCE_LEN],
    aad: &[u8],
    p: &Packet<&[u8]>,
) -> Result<Vec<u8>, Error> {
    let mut pt = p.payload().to_vec();
    key.open(nonce, aad, &mut pt)?;
    let (&code, rest) = pt.split_first().ok_or(Error::Malformed)?;
    // the inner options are read with the message parser behind a dummy
    // header
    let mut inner = Vec::with_capacity(4 + rest.len());
    inner.extend_from_slice(&[0x40, code, 0, 0]);
    inner.extend_from_slice(rest);
    let ip = Packet::new_checked(&inner[..]).map_err(|_| Error::Malformed)?;
    let mut opts: Vec<(OptionNumber, &[u8])> = p
        .options()
        .filter(|o| outer_only(o.number) && o.number != OSCORE)
        .map(|o| (o.number, o.value))
        .collect();
    for o in ip.options() {
        if o.number == OSCORE {
            return Err(Error::Malformed);
        }
        opts.push((o.number, o.value));
    }
    message(p, Code(code), &mut opts, ip.payload())
}

/// One OSCORE security context: its keys, the sender sequence number and
/// the replay window of its recipient.
pub struct Context {
    sender_id: Vec<u8>,
    recipient_id: Vec<u8>,
    id_context: Option<Vec<u8>>,
    common_iv: [u8; NONCE_LEN],
    sender_key: Key,
    recipient_key: Key,
    seq: u64,
    /// Numbers below this are covered by the store.
    limit: u64,
    step: u64,
    store: Option<Box<dyn SeqStore>>,
    window: ReplayWindow,
    /// False after a restart until an Echo round trip (B.1.2).
    window_known: bool,
    echo: Option<[u8; 8]>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("sender_id", &self.sender_id)
            .field("recipient_id", &self.recipient_id)
            .field("id_context", &self.id_context)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context derived from `p`, its sequence number in memory only
    /// (starting at 0): for tests and short-lived use; see
    /// [`Context::with_store`].
    pub fn new(p: &Params) -> Result<Context, Error> {
        let d = context::derive(p)?;
        Ok(Context {
            sender_id: p.sender_id.clone(),
            recipient_id: p.recipient_id.clone(),
            id_context: p.id_context.clone(),
            common_iv: d.common_iv,
            sender_key: Key::new(&d.sender_key),
            recipient_key: Key::new(&d.recipient_key),
            seq: 0,
            limit: MAX_SEQ + 1,
            step: 0,
            store: None,
            window: ReplayWindow::new(),
            window_known: true,
            echo: None,
        })
    }

    /// Keeps the sequence number in `store`: starts at `start` (the limit
    /// the store held, 0 for a new context) and reserves `step` numbers at
    /// a time, each reservation made durable before its first number is
    /// used.
    pub fn with_store(mut self, store: Box<dyn SeqStore>, start: u64, step: u64) -> Context {
        self.seq = start;
        self.limit = start;
        self.step = step.max(1);
        self.store = Some(store);
        self
    }

    /// The sender sequence number to use next.
    pub fn sender_seq(&self) -> u64 {
        self.seq
    }

    /// Sets the next sender sequence number (test vectors).
    pub fn set_sender_seq(&mut self, seq: u64) {
        self.seq = seq;
    }

    /// This endpoint's Sender ID.
    pub fn sender_id(&self) -> &[u8] {
        &self.sender_id
    }

    /// The peer's Sender ID (the kid of its requests).
    pub fn recipient_id(&self) -> &[u8] {
        &self.recipient_id
    }

    /// The ID Context.
    pub fn id_context(&self) -> Option<&[u8]> {
        self.id_context.as_deref()
    }

    /// The replay window is lost (a restart): the next verified request is
    /// answered with an Echo challenge, and the window starts again from
    /// the request that returns the Echo (RFC 8613 B.1.2).
    pub fn forget_replay_window(&mut self) {
        self.window_known = false;
        self.echo = None;
    }

    /// Whether a request with option `o` is for this context: its kid is
    /// the Recipient ID and its kid context, when present, the ID Context.
    pub fn matches(&self, o: &OscoreOption<'_>) -> bool {
        o.kid == Some(&self.recipient_id[..])
            && o.kid_context
                .is_none_or(|c| self.id_context.as_deref() == Some(c))
    }

    /// The next sender sequence number, reserved in the store first when
    /// the reservation ran out.
    fn next_seq(&mut self) -> Result<u64, Error> {
        if self.seq > MAX_SEQ {
            return Err(Error::Exhausted);
        }
        if self.seq >= self.limit {
            let limit = self.seq.saturating_add(self.step).min(MAX_SEQ + 1);
            if let Some(s) = self.store.as_mut() {
                s.persist(limit).map_err(|e| Error::Store(e.to_string()))?;
            }
            self.limit = limit;
        }
        let s = self.seq;
        self.seq += 1;
        Ok(s)
    }

    /// Protects a whole request (RFC 8613 8.1): the outer message keeps
    /// type, message ID, token and the class U options, its code is POST
    /// (FETCH with Observe) and its payload the ciphertext. Returns it with
    /// what its response must be verified against.
    pub fn protect_request(&mut self, msg: &[u8]) -> Result<(Vec<u8>, RequestId), Error> {
        let p = Packet::new_checked(msg).map_err(|_| Error::Malformed)?;
        if p.options().any(|o| o.number.0 == 35) {
            // Proxy-Uri would have to be split into outer and inner parts
            return Err(Error::Malformed);
        }
        let mut pt = plaintext_of(&p, false)?;
        let seq = self.next_seq()?;
        let (piv_buf, n) = context::partial_iv(seq);
        let piv = &piv_buf[..n];
        let nonce = context::nonce(&self.common_iv, &self.sender_id, piv);
        self.sender_key
            .seal(&nonce, &aad(&self.sender_id, piv), &mut pt)?;
        let mut ov = Vec::with_capacity(16);
        OscoreOption {
            partial_iv: Some(piv),
            kid_context: self.id_context.as_deref(),
            kid: Some(&self.sender_id),
        }
        .encode(&mut ov)?;
        let mut opts: Vec<(OptionNumber, &[u8])> = p
            .options()
            .filter(|o| outer_only(o.number) || o.number == OptionNumber::OBSERVE)
            .map(|o| (o.number, o.value))
            .collect();
        opts.push((OSCORE, &ov));
        let observe = p.option(OptionNumber::OBSERVE).is_some();
        let code = if observe { Code::FETCH } else { Code::POST };
        let out = message(&p, code, &mut opts, &pt)?;
        Ok((
            out,
            RequestId {
                kid: self.sender_id.clone(),
                piv: piv.to_vec(),
                nonce,
            },
        ))
    }

    /// Verifies a response to the request `req` (RFC 8613 8.4) and returns
    /// the inner response as a whole message.
    pub fn unprotect_response(&self, msg: &[u8], req: &RequestId) -> Result<Vec<u8>, Error> {
        self.open_response(msg, req).map(|(m, _)| m)
    }

    /// Verifies a notification of the observation registered by the
    /// request `req` (RFC 8613 8.4 with 7.4.1): after it verified, its
    /// Partial IV must be above the observation's Notification Number in
    /// `seen`, which it then becomes; one without a Partial IV (it reuses
    /// the request's nonce) is accepted only as the first answer. Anything
    /// else is [`Error::Replay`] and is not to be delivered.
    pub fn unprotect_notification(
        &self,
        msg: &[u8],
        req: &RequestId,
        seen: &mut Notifications,
    ) -> Result<Vec<u8>, Error> {
        let (m, piv) = self.open_response(msg, req)?;
        match piv {
            Some(n) if seen.number.is_some_and(|last| n <= last) => return Err(Error::Replay),
            Some(n) => seen.number = Some(n),
            None if seen.answered => return Err(Error::Replay),
            None => {}
        }
        seen.answered = true;
        Ok(m)
    }

    /// The inner response and the value of its Partial IV, if it had one.
    fn open_response(&self, msg: &[u8], req: &RequestId) -> Result<(Vec<u8>, Option<u64>), Error> {
        let p = Packet::new_checked(msg).map_err(|_| Error::Malformed)?;
        let v = oscore_value(&p)?;
        let o = OscoreOption::decode(v)?;
        let (nonce, piv) = match o.partial_iv {
            Some(piv) => (
                context::nonce(&self.common_iv, &self.recipient_id, piv),
                Some(context::piv_value(piv).ok_or(Error::BadOption)?),
            ),
            None => (req.nonce, None),
        };
        let m = open_inner(&self.recipient_key, &nonce, &aad(&req.kid, &req.piv), &p)?;
        Ok((m, piv))
    }

    /// Verifies a request (RFC 8613 8.2) for this context (see
    /// [`Context::matches`]): the replay window, then the AEAD; the window
    /// records the Partial IV only once the request verified.
    pub fn unprotect_request(&mut self, msg: &[u8]) -> Result<Unprotected, Error> {
        let p = Packet::new_checked(msg).map_err(|_| Error::Malformed)?;
        let v = oscore_value(&p)?;
        let o = OscoreOption::decode(v)?;
        if !self.matches(&o) {
            return Err(Error::UnknownContext);
        }
        let piv = o.partial_iv.ok_or(Error::Malformed)?;
        let seq = context::piv_value(piv).ok_or(Error::BadOption)?;
        if self.window_known && !self.window.check(seq) {
            return Err(Error::Replay);
        }
        let nonce = context::nonce(&self.common_iv, &self.recipient_id, piv);
        let message = open_inner(
            &self.recipient_key,
            &nonce,
            &aad(&self.recipient_id, piv),
            &p,
        )?;
        let request = RequestId {
            kid: self.recipient_id.clone(),
            piv: piv.to_vec(),
            nonce,
        };
        if !self.window_known {
            let ip = Packet::new_checked(&message[..]).map_err(|_| Error::Malformed)?;
            let echoed = ip.option(OptionNumber::ECHO).map(|e| e.value);
            match (self.echo, echoed) {
                (Some(want), Some(got)) if got == want => {
                    self.window = ReplayWindow::starting_after(seq);
                    self.window_known = true;
                    self.echo = None;
                }
                _ => return Err(Error::EchoRequired(request)),
            }
        }
        self.window.accept(seq);
        Ok(Unprotected { message, request })
    }

    /// The Echo value to send in a protected 4.01 when
    /// [`Error::EchoRequired`] came back; a fresh one for each challenge.
    pub fn echo_challenge(&mut self) -> [u8; 8] {
        let e: [u8; 8] = rand::random();
        self.echo = Some(e);
        e
    }

    /// Protects a whole response to `req` (RFC 8613 8.3). With `fresh` the
    /// response carries a Partial IV of its own (and uses a sender sequence
    /// number; needed for an Echo challenge and notifications), otherwise
    /// it reuses the request's nonce.
    pub fn protect_response(
        &mut self,
        msg: &[u8],
        req: &RequestId,
        fresh: bool,
    ) -> Result<Vec<u8>, Error> {
        let p = Packet::new_checked(msg).map_err(|_| Error::Malformed)?;
        let mut pt = plaintext_of(&p, true)?;
        let mut ov = Vec::with_capacity(8);
        let nonce = if fresh {
            let seq = self.next_seq()?;
            let (piv_buf, n) = context::partial_iv(seq);
            OscoreOption {
                partial_iv: Some(&piv_buf[..n]),
                ..OscoreOption::default()
            }
            .encode(&mut ov)?;
            context::nonce(&self.common_iv, &self.sender_id, &piv_buf[..n])
        } else {
            req.nonce
        };
        self.sender_key
            .seal(&nonce, &aad(&req.kid, &req.piv), &mut pt)?;
        let mut opts: Vec<(OptionNumber, &[u8])> = p
            .options()
            .filter(|o| {
                (outer_only(o.number) && o.number != OSCORE) || o.number == OptionNumber::OBSERVE
            })
            .map(|o| (o.number, o.value))
            .collect();
        opts.push((OSCORE, &ov));
        let observe = p.option(OptionNumber::OBSERVE).is_some();
        let code = if observe {
            Code::CONTENT
        } else {
            Code::CHANGED
        };
        message(&p, code, &mut opts, &pt)
    }
}

/// The OSCORE option of a message, if it has one; an error when it has
/// more than one or its value does not decode.
pub fn option_of<'a>(p: &'a Packet<&'a [u8]>) -> Option<Result<OscoreOption<'a>, Error>> {
    option_of_raw(p).map(|r| r.and_then(OscoreOption::decode))
}
