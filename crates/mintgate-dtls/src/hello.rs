//! The stateless half of the DTLS 1.2 cookie exchange (RFC 6347 4.2.1):
//! just enough of a ClientHello record to answer it with a
//! HelloVerifyRequest, and to tell a second ClientHello whose cookie is
//! valid from one that needs an answer, before any session exists.
//!
//! The parser reads one datagram that it is given whole and keeps nothing:
//! it borrows the fields it returns from the input, allocates nothing and
//! reads every byte at most once, so its cost is bounded by the datagram.
//! It accepts what OpenSSL's `DTLSv1_listen` accepts (a handshake record of
//! epoch 0 that holds exactly one unfragmented ClientHello, message sequence
//! 0 to 2) and a little less: the ClientHello must be well formed to its
//! end (RFC 5246 7.4.1.2), so that a hello that OpenSSL would refuse never
//! costs a session.

/// DTLS record header: type, version, epoch, sequence number, length.
pub const RECORD_HEADER: usize = 13;
/// DTLS handshake header: type, length, message_seq, fragment offset and
/// fragment length (RFC 6347 4.2.2).
pub const HANDSHAKE_HEADER: usize = 12;
/// ContentType handshake.
pub const CONTENT_HANDSHAKE: u8 = 22;
/// HandshakeType client_hello.
pub const CLIENT_HELLO: u8 = 1;
/// HandshakeType hello_verify_request.
pub const HELLO_VERIFY_REQUEST: u8 = 3;
/// DTLS 1.0's version number, which a HelloVerifyRequest carries whatever
/// version is negotiated later (RFC 6347 4.2.1).
pub const DTLS_1_0: [u8; 2] = [0xfe, 0xff];
/// DTLS 1.2's version number.
pub const DTLS_1_2: [u8; 2] = [0xfe, 0xfd];
/// Longest cookie DTLS 1.2 allows (`opaque cookie<0..2^8-1>`).
pub const MAX_COOKIE: usize = 255;
/// Longest session id (`opaque SessionID<0..32>`).
pub const MAX_SESSION_ID: usize = 32;
/// Largest HelloVerifyRequest record: headers, version, cookie.
pub const MAX_HELLO_VERIFY_REQUEST: usize = RECORD_HEADER + HANDSHAKE_HEADER + 3 + MAX_COOKIE;

/// The fields of a ClientHello that the cookie exchange needs, borrowed
/// from the datagram. Extensions are checked for their length only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHello<'a> {
    /// The record's version field (DTLS 1.0 or 1.2 in practice).
    pub record_version: [u8; 2],
    /// The record's 48-bit sequence number (epoch 0), which the
    /// HelloVerifyRequest repeats.
    pub record_seq: [u8; 6],
    /// The handshake message sequence number (0 for the first hello, 1 for
    /// the one that carries the cookie).
    pub message_seq: u16,
    /// `client_version`.
    pub client_version: [u8; 2],
    /// `random`.
    pub random: &'a [u8; 32],
    /// `session_id` (0 to 32 bytes).
    pub session_id: &'a [u8],
    /// `cookie` (empty in a first hello).
    pub cookie: &'a [u8],
    /// `cipher_suites`, two bytes each.
    pub cipher_suites: &'a [u8],
    /// `compression_methods`.
    pub compression_methods: &'a [u8],
    /// The whole extensions block (with its length), empty if absent.
    pub extensions: &'a [u8],
}

/// Why a datagram is not a ClientHello this parser takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelloError {
    /// Not a handshake record of epoch 0 holding a ClientHello.
    NotClientHello,
    /// A length field runs past the data.
    Truncated,
    /// The ClientHello is split into fragments (reassembly would need
    /// state; `DTLSv1_listen` and Scandium refuse it too).
    Fragmented,
    /// A field has a value the protocol does not allow (message sequence
    /// number above 2, session id over 32 bytes, odd cipher suite list,
    /// no compression method, bytes left over).
    Malformed,
}

/// Whether `datagram` starts with a handshake record of epoch 0 whose
/// first message is a ClientHello: what goes to [`parse_client_hello`]
/// instead of a session.
pub fn is_initial_client_hello(datagram: &[u8]) -> bool {
    datagram.len() > RECORD_HEADER
        && datagram[0] == CONTENT_HANDSHAKE
        && datagram[1] == 0xfe
        && datagram[3..5] == [0, 0]
        && datagram[RECORD_HEADER] == CLIENT_HELLO
}

/// A cursor over a byte slice that never reads past its end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.rest.len() < n {
            return Err(HelloError::Truncated);
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Result<usize, HelloError> {
        let b = self.take(3)?;
        Ok(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }

    fn vec8(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    fn vec16(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// Parses the first record of `datagram` as a ClientHello. Records after
/// the first are ignored, as `DTLSv1_listen` ignores them.
pub fn parse_client_hello(datagram: &[u8]) -> Result<ClientHello<'_>, HelloError> {
    if !is_initial_client_hello(datagram) {
        return Err(HelloError::NotClientHello);
    }
    let mut r = Reader { rest: datagram };
    let header = r.take(RECORD_HEADER)?;
    let record_version = [header[1], header[2]];
    let mut record_seq = [0u8; 6];
    record_seq.copy_from_slice(&header[5..11]);
    let record_len = usize::from(u16::from_be_bytes([header[11], header[12]]));
    let mut rec = Reader {
        rest: r.take(record_len)?,
    };
    let _ = rec.u8()?; // the ClientHello type, checked above
    let length = rec.u24()?;
    let message_seq = rec.u16()?;
    let frag_offset = rec.u24()?;
    let frag_length = rec.u24()?;
    if frag_offset != 0 || frag_length != length {
        return Err(HelloError::Fragmented);
    }
    if message_seq > 2 {
        return Err(HelloError::Malformed);
    }
    let body = rec.take(frag_length)?;
    if !rec.rest.is_empty() {
        // one message per record, as DTLSv1_listen requires
        return Err(HelloError::Malformed);
    }
    let mut b = Reader { rest: body };
    let v = b.take(2)?;
    let client_version = [v[0], v[1]];
    let random: &[u8; 32] = b.take(32)?.try_into().map_err(|_| HelloError::Truncated)?;
    let session_id = b.vec8()?;
    if session_id.len() > MAX_SESSION_ID {
        return Err(HelloError::Malformed);
    }
    let cookie = b.vec8()?;
    let cipher_suites = b.vec16()?;
    if cipher_suites.is_empty() || cipher_suites.len() % 2 != 0 {
        return Err(HelloError::Malformed);
    }
    let compression_methods = b.vec8()?;
    if compression_methods.is_empty() {
        return Err(HelloError::Malformed);
    }
    let extensions = b.rest;
    if !extensions.is_empty() {
        let mut e = Reader { rest: extensions };
        let _ = e.vec16()?;
        if !e.rest.is_empty() {
            return Err(HelloError::Malformed);
        }
    }
    Ok(ClientHello {
        record_version,
        record_seq,
        message_seq,
        client_version,
        random,
        session_id,
        cookie,
        cipher_suites,
        compression_methods,
        extensions,
    })
}

impl ClientHello<'_> {
    /// The bytes a cookie is computed over, in order, each variable field
    /// with its length so that no two hellos give the same input: the
    /// parameters RFC 6347 4.2.1 says a client repeats in its second hello
    /// (version, random, session_id, cipher_suites, compression_methods).
    /// Extensions are left out, as Scandium leaves them out: the RFC does
    /// not ask a client to repeat them unchanged.
    pub fn cookie_input(&self, f: &mut dyn FnMut(&[u8])) {
        f(&self.client_version);
        f(self.random);
        f(&[self.session_id.len() as u8]);
        f(self.session_id);
        f(&(self.cipher_suites.len() as u16).to_be_bytes());
        f(self.cipher_suites);
        f(&[self.compression_methods.len() as u8]);
        f(self.compression_methods);
    }
}

/// Writes the HelloVerifyRequest that answers `hello` with `cookie` into
/// `out` and returns its length, or `None` when the cookie is longer than
/// [`MAX_COOKIE`] or `out` too short. As `DTLSv1_listen` writes it: record
/// and server_version DTLS 1.0, the hello's record sequence number, message
/// sequence 0, one fragment.
pub fn write_hello_verify_request(
    hello: &ClientHello<'_>,
    cookie: &[u8],
    out: &mut [u8],
) -> Option<usize> {
    if cookie.len() > MAX_COOKIE {
        return None;
    }
    let body = 3 + cookie.len();
    let total = RECORD_HEADER + HANDSHAKE_HEADER + body;
    let out = out.get_mut(..total)?;
    let frag = (HANDSHAKE_HEADER + body) as u16;
    let len24 = [0, 0, body as u8];
    out[0] = CONTENT_HANDSHAKE;
    out[1..3].copy_from_slice(&DTLS_1_0);
    out[3..5].copy_from_slice(&[0, 0]);
    out[5..11].copy_from_slice(&hello.record_seq);
    out[11..13].copy_from_slice(&frag.to_be_bytes());
    let h = &mut out[RECORD_HEADER..];
    h[0] = HELLO_VERIFY_REQUEST;
    h[1..4].copy_from_slice(&len24);
    h[4..6].copy_from_slice(&[0, 0]);
    h[6..9].copy_from_slice(&[0, 0, 0]);
    h[9..12].copy_from_slice(&len24);
    let b = &mut h[HANDSHAKE_HEADER..];
    b[0..2].copy_from_slice(&DTLS_1_0);
    b[2] = cookie.len() as u8;
    b[3..3 + cookie.len()].copy_from_slice(cookie);
    Some(total)
}

/// The fields of a ClientHello to write with [`write_client_hello`] (for
/// tests, the fuzz target and the labs' load generators).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloFields {
    /// Record sequence number (48 bits).
    pub record_seq: u64,
    /// Handshake message sequence number.
    pub message_seq: u16,
    /// `random`.
    pub random: [u8; 32],
    /// `session_id` (at most 32 bytes).
    pub session_id: Vec<u8>,
    /// `cookie` (at most 255 bytes).
    pub cookie: Vec<u8>,
    /// Cipher suites.
    pub cipher_suites: Vec<u16>,
    /// The extensions block without its length (none when empty).
    pub extensions: Vec<u8>,
}

impl Default for HelloFields {
    fn default() -> Self {
        HelloFields {
            record_seq: 0,
            message_seq: 0,
            random: [0; 32],
            session_id: Vec::new(),
            cookie: Vec::new(),
            // TLS_PSK_WITH_AES_128_CCM_8 and TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8
            cipher_suites: vec![0xc0a8, 0xc0ae],
            extensions: Vec::new(),
        }
    }
}

/// A DTLS 1.2 ClientHello record (one datagram) with `f`'s fields, no
/// compression. Lengths past what the fields allow are cut.
pub fn write_client_hello(f: &HelloFields) -> Vec<u8> {
    let sid = &f.session_id[..f.session_id.len().min(MAX_SESSION_ID)];
    let cookie = &f.cookie[..f.cookie.len().min(MAX_COOKIE)];
    let suites = &f.cipher_suites[..f.cipher_suites.len().min(0x7fff)];
    let mut body = Vec::with_capacity(64 + sid.len() + cookie.len() + 2 * suites.len());
    body.extend_from_slice(&DTLS_1_2);
    body.extend_from_slice(&f.random);
    body.push(sid.len() as u8);
    body.extend_from_slice(sid);
    body.push(cookie.len() as u8);
    body.extend_from_slice(cookie);
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        body.extend_from_slice(&s.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // null compression only
    if !f.extensions.is_empty() {
        // what still fits in one record
        let room = 0xffff - HANDSHAKE_HEADER - body.len() - 2;
        let ext = &f.extensions[..f.extensions.len().min(room)];
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(ext);
    }
    let len = body.len();
    let len24 = [(len >> 16) as u8, (len >> 8) as u8, len as u8];
    let mut d = Vec::with_capacity(RECORD_HEADER + HANDSHAKE_HEADER + len);
    d.push(CONTENT_HANDSHAKE);
    d.extend_from_slice(&DTLS_1_0);
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(&f.record_seq.to_be_bytes()[2..]);
    d.extend_from_slice(&((HANDSHAKE_HEADER + len) as u16).to_be_bytes());
    d.push(CLIENT_HELLO);
    d.extend_from_slice(&len24);
    d.extend_from_slice(&f.message_seq.to_be_bytes());
    d.extend_from_slice(&[0, 0, 0]);
    d.extend_from_slice(&len24);
    d.extend_from_slice(&body);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fields() -> impl Strategy<Value = HelloFields> {
        (
            0u64..(1 << 48),
            0u16..=2,
            any::<[u8; 32]>(),
            proptest::collection::vec(any::<u8>(), 0..=32),
            proptest::collection::vec(any::<u8>(), 0..=255),
            proptest::collection::vec(any::<u16>(), 1..200),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(
                |(
                    record_seq,
                    message_seq,
                    random,
                    session_id,
                    cookie,
                    cipher_suites,
                    extensions,
                )| {
                    HelloFields {
                        record_seq,
                        message_seq,
                        random,
                        session_id,
                        cookie,
                        cipher_suites,
                        // a well-formed block: one extension holding the bytes
                        extensions: if extensions.is_empty() {
                            Vec::new()
                        } else {
                            let mut e = vec![0xff, 0x01];
                            e.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
                            e.extend_from_slice(&extensions);
                            e
                        },
                    }
                },
            )
    }

    proptest! {
        /// Whatever a client writes, the parser reads back the same fields.
        #[test]
        fn a_written_hello_parses_back(f in fields()) {
            let d = write_client_hello(&f);
            let h = parse_client_hello(&d).unwrap();
            prop_assert_eq!(&h.record_seq[..], &f.record_seq.to_be_bytes()[2..]);
            prop_assert_eq!(h.message_seq, f.message_seq);
            prop_assert_eq!(h.client_version, DTLS_1_2);
            prop_assert_eq!(h.random, &f.random);
            prop_assert_eq!(h.session_id, &f.session_id[..]);
            prop_assert_eq!(h.cookie, &f.cookie[..]);
            let suites: Vec<u16> = h.cipher_suites.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            prop_assert_eq!(suites, f.cipher_suites.clone());
            prop_assert_eq!(h.compression_methods, &[0u8][..]);
            prop_assert_eq!(h.extensions.len(), if f.extensions.is_empty() { 0 } else { f.extensions.len() + 2 });
            // the answer repeats the record sequence number and the cookie
            let mut out = [0u8; MAX_HELLO_VERIFY_REQUEST];
            let n = write_hello_verify_request(&h, &f.cookie, &mut out).unwrap();
            prop_assert_eq!(n, RECORD_HEADER + HANDSHAKE_HEADER + 3 + f.cookie.len());
            prop_assert_eq!(&out[5..11], &h.record_seq[..]);
            prop_assert_eq!(out[RECORD_HEADER], HELLO_VERIFY_REQUEST);
            prop_assert_eq!(&out[n - f.cookie.len()..n], &f.cookie[..]);
            // never bigger than what it answers (no amplification)
            prop_assert!(n <= d.len() + f.cookie.len() + 3);
        }

        /// Any cut of a hello is refused (nothing past the end is read),
        /// and so is any change of a length byte that makes it inconsistent;
        /// random bytes never panic.
        #[test]
        fn cut_or_garbled_hellos_are_refused(f in fields(), cut in 0usize..2000, at in any::<usize>(), byte in any::<u8>()) {
            let d = write_client_hello(&f);
            let cut = cut % d.len();
            prop_assert!(parse_client_hello(&d[..cut]).is_err());
            let mut g = d.clone();
            let i = at % g.len();
            g[i] = byte;
            if let Ok(h) = parse_client_hello(&g) {
                // whatever parses lies within the input
                let range = g.as_ptr_range();
                for s in [h.session_id, h.cookie, h.cipher_suites, h.compression_methods, h.extensions] {
                    prop_assert!(range.start <= s.as_ptr() && s.as_ptr_range().end <= range.end);
                }
            }
        }

        #[test]
        fn random_bytes_never_panic(d in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_client_hello(&d);
        }
    }

    #[test]
    fn fragments_and_leftovers_are_refused() {
        let f = HelloFields::default();
        let d = write_client_hello(&f);
        assert!(parse_client_hello(&d).is_ok());
        // a fragment offset
        let mut g = d.clone();
        g[RECORD_HEADER + 8] = 1;
        assert_eq!(parse_client_hello(&g), Err(HelloError::Fragmented));
        // a message sequence number of 3
        let mut g = d.clone();
        g[RECORD_HEADER + 5] = 3;
        assert_eq!(parse_client_hello(&g), Err(HelloError::Malformed));
        // epoch 1 is no initial hello
        let mut g = d.clone();
        g[4] = 1;
        assert_eq!(parse_client_hello(&g), Err(HelloError::NotClientHello));
        // a second record after the first is ignored
        let mut g = d.clone();
        g.extend_from_slice(&d);
        assert!(parse_client_hello(&g).is_ok());
        // an odd cipher suite list
        let mut g = write_client_hello(&HelloFields {
            cipher_suites: vec![],
            ..HelloFields::default()
        });
        assert_eq!(parse_client_hello(&g), Err(HelloError::Malformed));
        g.clear();
        assert_eq!(parse_client_hello(&g), Err(HelloError::NotClientHello));
    }
}
