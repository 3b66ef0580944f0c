//! Building a response in one pooled block, payload first, header prepended.

use std::fmt;

use mintgate_buf::{Block, BlockMut, Layer, Pool};

use crate::wire::{
    encode_uint, head_len, Code, ContentFormat, MessageType, MessageWriter, OptionNumber,
};

/// Headroom reserved in front of a response payload: header (4), token (8)
/// and the usual options fit; a larger head goes into a block of its own and
/// is sent by scatter-gather.
pub const RESPONSE_HEADROOM: usize = 64;

/// Bytes of option values a response may carry (outside the payload).
pub const OPTION_SPACE: usize = 320;

/// How much longer than its plain answer's payload limit the payload of a
/// protected answer (OSCORE, RFC 8613) may be: the plain code, options (at
/// most [`OPTION_SPACE`] bytes of values, each of at most `MAX_OPTIONS`
/// with a header of up to 5 bytes) and payload marker go inside it, and an
/// 8-byte tag (AES-CCM-16-64-128) after.
pub const SEALED_EXTRA: usize = 1 + OPTION_SPACE + 5 * MAX_OPTIONS + 1 + 8;

const MAX_OPTIONS: usize = 16;

/// Why a response could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildError {
    /// More than 16 options or 320 bytes of option values.
    TooManyOptions,
    /// The payload does not fit the block; the response becomes 5.00.
    PayloadTooLarge,
    /// No pool block was free for the payload or the head: the response is
    /// shed.
    Exhausted,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::TooManyOptions => write!(
                f,
                "response options exceed {MAX_OPTIONS} or {OPTION_SPACE} bytes"
            ),
            BuildError::PayloadTooLarge => write!(f, "response payload exceeds the block"),
            BuildError::Exhausted => write!(f, "no pool block free for the response"),
        }
    }
}

impl std::error::Error for BuildError {}

/// Where the payload lives.
enum Body {
    /// Written into the response block behind the headroom.
    Inline,
    /// A static slice, sent by reference (0 bytes copied).
    Static(&'static [u8]),
    /// A pooled shared block, sent by reference (0 bytes copied).
    Shared(Block),
}

/// A response under construction, handed to resource handlers.
///
/// The payload is produced once, straight into a pooled block (or given by
/// reference as a static or shared buffer); options are kept aside in a small
/// fixed array and encoded, sorted, at the end.
///
/// Invariants that keep a response at n + c bytes allocated and n copied:
/// - No block is taken before the first payload byte is written: the block
///   is then sized for that write (at least the hint) plus the headroom, so
///   a payload written in one go lives in one right-sized block. A payload
///   that outgrows it moves once into a larger block (counted as a copy).
/// - The head (header, token, options, marker) is encoded in place into the
///   block's headroom, or into a head block of its own sized to it exactly
///   when the payload is sent by reference or the head does not fit; it is
///   never encoded elsewhere and copied.
pub struct ResponseBuilder {
    pool: Pool,
    block: Option<BlockMut>,
    hint: usize,
    code: Code,
    opts: [(u16, u16, u16); MAX_OPTIONS],
    nopts: usize,
    optbuf: [u8; OPTION_SPACE],
    optlen: usize,
    body: Body,
    overflow: bool,
    exhausted: bool,
    limit: usize,
}

impl ResponseBuilder {
    /// A 2.05 Content response with an empty payload whose first block,
    /// taken at the first payload byte, holds at least `payload_hint` bytes.
    pub fn in_pool(pool: &Pool, payload_hint: usize) -> ResponseBuilder {
        ResponseBuilder {
            pool: pool.clone(),
            block: None,
            hint: payload_hint,
            code: Code::CONTENT,
            opts: [(0, 0, 0); MAX_OPTIONS],
            nopts: 0,
            optbuf: [0; OPTION_SPACE],
            optlen: 0,
            body: Body::Inline,
            overflow: false,
            exhausted: false,
            limit: usize::MAX,
        }
    }

    /// Caps the payload at `max_payload` bytes (writes past it overflow).
    pub fn with_limit(mut self, max_payload: usize) -> ResponseBuilder {
        self.limit = max_payload;
        self
    }

    fn len(&self) -> usize {
        self.block.as_ref().map_or(0, |b| b.len())
    }

    /// Makes sure the block has room for `extra` more payload bytes: takes
    /// the first block, or moves the bytes written so far into a larger one
    /// (copied once, and counted).
    fn room_for(&mut self, extra: usize) -> bool {
        let have = self.len();
        if self.block.as_ref().is_some_and(|b| b.tailroom() >= extra) {
            return true;
        }
        let need = have + extra;
        if need > self.limit {
            return false;
        }
        let size = need.max(self.hint).min(self.limit);
        let Ok(mut nb) = self
            .pool
            .alloc(Layer::Coap, RESPONSE_HEADROOM + size, RESPONSE_HEADROOM)
        else {
            self.exhausted = true;
            return false;
        };
        if let Some(old) = &self.block {
            if !nb.append(Layer::Handler, old.as_slice()) {
                return false;
            }
        }
        self.block = Some(nb);
        true
    }

    /// Sets the response code (default 2.05 Content).
    pub fn set_code(&mut self, code: Code) -> &mut Self {
        self.code = code;
        self
    }

    /// The response code set so far.
    pub fn code(&self) -> Code {
        self.code
    }

    /// Adds an option. Options may be added in any order; repeated options
    /// keep the order in which they were added.
    pub fn option(&mut self, number: OptionNumber, value: &[u8]) -> &mut Self {
        if self.nopts == MAX_OPTIONS || self.optlen + value.len() > OPTION_SPACE {
            self.overflow = true;
            return self;
        }
        let start = self.optlen;
        self.optbuf[start..start + value.len()].copy_from_slice(value);
        self.optlen += value.len();
        self.opts[self.nopts] = (number.0, start as u16, value.len() as u16);
        self.nopts += 1;
        self
    }

    /// Adds an unsigned-integer option, minimally encoded.
    pub fn option_uint(&mut self, number: OptionNumber, v: u32) -> &mut Self {
        let mut b = [0; 4];
        let len = encode_uint(v, &mut b).len();
        self.option(number, &b[4 - len..])
    }

    /// Sets Content-Format.
    pub fn content_format(&mut self, cf: ContentFormat) -> &mut Self {
        self.option_uint(OptionNumber::CONTENT_FORMAT, cf.0 as u32)
    }

    /// Sets Max-Age in seconds.
    pub fn max_age(&mut self, secs: u32) -> &mut Self {
        self.option_uint(OptionNumber::MAX_AGE, secs)
    }

    /// Appends payload bytes into the block (counted as the handler's copy).
    /// On overflow the response turns into 5.00 when finished.
    pub fn write(&mut self, bytes: &[u8]) -> &mut Self {
        if bytes.is_empty() {
            return self;
        }
        if !matches!(self.body, Body::Inline) || self.len() + bytes.len() > self.limit {
            self.overflow = true;
            return self;
        }
        if !self.room_for(bytes.len()) {
            self.overflow = true;
            return self;
        }
        if let Some(b) = &mut self.block {
            if !b.append(Layer::Handler, bytes) {
                self.overflow = true;
            }
        }
        self
    }

    /// Makes sure [`ResponseBuilder::spare_mut`] offers at least `n` bytes.
    pub fn reserve(&mut self, n: usize) -> bool {
        self.room_for(n)
    }

    /// The writable space behind the payload written so far, for handlers
    /// that format in place; commit with [`ResponseBuilder::commit`]. Takes
    /// the first block (of the hint's size) if none is held yet; empty when
    /// the pool has none.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        if self.block.is_none() && !self.room_for(self.hint.max(1)) {
            return &mut [];
        }
        match &mut self.block {
            Some(b) => b.spare_mut(),
            None => &mut [],
        }
    }

    /// Commits `n` bytes written into [`ResponseBuilder::spare_mut`].
    pub fn commit(&mut self, n: usize) -> &mut Self {
        match &mut self.block {
            Some(b) if n <= b.tailroom() => b.commit(n),
            None if n == 0 => {}
            _ => self.overflow = true,
        }
        self
    }

    /// Uses a static payload, sent by reference with no copy.
    pub fn static_payload(&mut self, p: &'static [u8]) -> &mut Self {
        self.block = None;
        self.body = Body::Static(p);
        self
    }

    /// Uses a shared pooled payload, sent by reference with no copy.
    pub fn shared_payload(&mut self, b: Block) -> &mut Self {
        self.block = None;
        self.body = Body::Shared(b);
        self
    }

    /// The payload as it stands.
    pub fn payload(&self) -> &[u8] {
        match &self.body {
            Body::Inline => self.block.as_ref().map_or(&[], |b| b.as_slice()),
            Body::Static(s) => s,
            Body::Shared(b) => b,
        }
    }

    /// True if options or payload overflowed.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Encodes the message: header, token and options written in place into
    /// the block's headroom (or into a head block of their own when they do
    /// not fit or the payload is sent by reference), the payload where it
    /// already is.
    pub fn finish(self, ty: MessageType, mid: u16, token: &[u8]) -> Result<Outgoing, BuildError> {
        if self.exhausted {
            return Err(BuildError::Exhausted);
        }
        if self.overflow {
            return Err(
                if self.nopts == MAX_OPTIONS || self.optlen == OPTION_SPACE {
                    BuildError::TooManyOptions
                } else {
                    BuildError::PayloadTooLarge
                },
            );
        }
        if token.len() > crate::wire::MAX_TOKEN_LEN {
            return Err(BuildError::TooManyOptions);
        }
        let mut order = [0u8; MAX_OPTIONS];
        for (i, o) in order.iter_mut().enumerate().take(self.nopts) {
            *o = i as u8;
        }
        let order = &mut order[..self.nopts];
        order.sort_by_key(|i| self.opts[*i as usize].0); // stable: repeats keep their order
        let plen = self.payload().len();
        let hlen = head_len(
            token.len(),
            order.iter().map(|i| {
                let (n, _, l) = self.opts[*i as usize];
                (n, l as usize)
            }),
            plen,
        );
        let encode = |dst: &mut [u8]| -> Result<(), BuildError> {
            let mut w = MessageWriter::new(dst, ty, self.code, mid, token)
                .map_err(|_| BuildError::TooManyOptions)?;
            for i in order.iter() {
                let (n, st, l) = self.opts[*i as usize];
                w.option(
                    OptionNumber(n),
                    &self.optbuf[st as usize..(st + l) as usize],
                )
                .map_err(|_| BuildError::TooManyOptions)?;
            }
            if plen > 0 {
                w.payload_marker().map_err(|_| BuildError::TooManyOptions)?;
            }
            if w.finish() == hlen {
                Ok(())
            } else {
                Err(BuildError::TooManyOptions)
            }
        };
        let tail = match (self.body, self.block) {
            (Body::Inline, Some(mut block)) if plen > 0 && hlen <= block.headroom() => {
                encode(block.prepend(hlen).ok_or(BuildError::TooManyOptions)?)?;
                return Ok(Outgoing {
                    head: block.freeze(),
                    tail: Tail::None,
                });
            }
            (Body::Inline, Some(block)) if plen > 0 => Tail::Shared(block.freeze()),
            (Body::Inline, _) => Tail::None,
            (Body::Static(s), _) => Tail::Static(s),
            (Body::Shared(b), _) => Tail::Shared(b),
        };
        // The payload stays where it is; the head gets a block of its own.
        let mut hb = self
            .pool
            .alloc(Layer::Coap, hlen, 0)
            .map_err(|_| BuildError::Exhausted)?;
        encode(&mut hb.spare_mut()[..hlen])?;
        hb.commit(hlen);
        Ok(Outgoing {
            head: hb.freeze(),
            tail,
        })
    }
}

/// Payload part of an outgoing message that is not in the head block.
#[derive(Clone, Debug)]
pub enum Tail {
    /// The whole message is in the head block.
    None,
    /// A static payload.
    Static(&'static [u8]),
    /// A shared pooled payload.
    Shared(Block),
}

/// An encoded message ready for the socket: `head` then `tail`, gathered.
/// Cloning shares the blocks (this is what the de-duplication cache keeps).
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// Header, token, options, marker (and the payload when inline).
    pub head: Block,
    /// The payload when sent by reference.
    pub tail: Tail,
}

impl Outgoing {
    /// The tail bytes (empty when none).
    pub fn tail_bytes(&self) -> &[u8] {
        match &self.tail {
            Tail::None => &[],
            Tail::Static(s) => s,
            Tail::Shared(b) => b,
        }
    }

    /// Total length on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail_bytes().len()
    }

    /// Never true for an encoded message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message as one contiguous vector (tests and logs only: it copies).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = self.head.to_vec();
        v.extend_from_slice(self.tail_bytes());
        v
    }
}
