//! The stateless ClientHello parser of coaps (`mintgate_dtls::hello`, RFC
//! 6347 4.2.1) on arbitrary datagrams. It must never panic nor read past
//! the input; a hello it accepts lies wholly within the input, its
//! HelloVerifyRequest repeats the record sequence number and is never
//! longer than the hello plus the cookie, and the hello written back from
//! its fields parses to the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_dtls::hello::{
    parse_client_hello, write_client_hello, write_hello_verify_request, HelloFields,
    MAX_HELLO_VERIFY_REQUEST,
};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse_client_hello(data) else {
        return;
    };
    let range = data.as_ptr_range();
    for s in [
        h.session_id,
        h.cookie,
        h.cipher_suites,
        h.compression_methods,
        h.extensions,
    ] {
        assert!(range.start <= s.as_ptr() && s.as_ptr_range().end <= range.end);
    }
    assert!(h.session_id.len() <= 32);
    assert!(!h.cipher_suites.is_empty() && h.cipher_suites.len() % 2 == 0);
    let cookie = [0x5au8; 32];
    let mut out = [0u8; MAX_HELLO_VERIFY_REQUEST];
    let n = write_hello_verify_request(&h, &cookie, &mut out).expect("a 32-byte cookie fits");
    assert_eq!(&out[5..11], &h.record_seq);
    assert!(n <= data.len() + cookie.len());
    // written back (DTLS 1.2, null compression, extensions without their
    // length), it parses to the same fields
    let f = HelloFields {
        record_seq: u64::from_be_bytes([
            0,
            0,
            h.record_seq[0],
            h.record_seq[1],
            h.record_seq[2],
            h.record_seq[3],
            h.record_seq[4],
            h.record_seq[5],
        ]),
        message_seq: h.message_seq,
        random: *h.random,
        session_id: h.session_id.to_vec(),
        cookie: h.cookie.to_vec(),
        cipher_suites: h
            .cipher_suites
            .chunks(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
        extensions: h.extensions.get(2..).unwrap_or_default().to_vec(),
    };
    let again = write_client_hello(&f);
    let g = parse_client_hello(&again).expect("a written hello parses");
    assert_eq!(
        (g.record_seq, g.message_seq, g.random, g.session_id, g.cookie, g.cipher_suites),
        (h.record_seq, h.message_seq, h.random, h.session_id, h.cookie, h.cipher_suites)
    );
    // an empty extensions block (`00 00`) is written back as none: the
    // contents, not the framing, must survive
    assert_eq!(
        g.extensions.get(2..).unwrap_or_default(),
        h.extensions.get(2..).unwrap_or_default()
    );
});
