//! Property tests for the RFC 8323 framing (CoAP over TCP, TLS and
//! WebSockets):
//!
//! (a) every frame `TcpRepr` can write parses back to the same repr, with
//!     `frame_len` agreeing on its length from its header alone, over both
//!     framings and across the 13/269/65805 length thresholds;
//! (b) arbitrary bytes never panic the view, and an accepted frame
//!     re-encodes to exactly the same bytes (the encoding is canonical);
//! (c) a frame cut short is `Truncated` (or needs more bytes), never
//!     accepted;
//! (d) the translation to RFC 7252 and back keeps code, token, options
//!     and payload.

use proptest::collection::vec;
use proptest::prelude::*;

use mintgate_coap::wire::tcp::{frame_from_udp, frame_len, FrameError};
use mintgate_coap::wire::{
    Code, Framing, MessageType, OptionNumber, Packet, RawOption, TcpPacket, TcpRepr,
};

#[derive(Clone, Debug)]
struct Frame {
    code: u8,
    token: Vec<u8>,
    options: Vec<(u16, Vec<u8>)>,
    payload: Vec<u8>,
}

impl Frame {
    fn repr(&self) -> TcpRepr<'_> {
        TcpRepr {
            code: Code(self.code),
            token: &self.token,
            options: self
                .options
                .iter()
                .map(|(n, v)| RawOption {
                    number: OptionNumber(*n),
                    value: v,
                })
                .collect(),
            payload: &self.payload,
        }
    }
}

fn code() -> impl Strategy<Value = u8> {
    // classes 0, 2, 4, 5, 7 (1, 3 and 6 are reserved)
    (
        prop_oneof![Just(0u8), Just(2), Just(4), Just(5), Just(7)],
        0u8..32,
    )
        .prop_map(|(c, d)| (c << 5) | d)
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..300),
        1 => (60000usize..70000).prop_map(|n| vec![0xA5; n]),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (
        code(),
        vec(any::<u8>(), 0..=8),
        vec((0u16..400, vec(any::<u8>(), 0..300)), 0..6),
        payload(),
    )
        .prop_map(|(code, token, mut options, payload)| {
            options.sort_by_key(|o| o.0);
            Frame {
                code,
                token,
                options,
                payload,
            }
        })
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![Just(Framing::Stream), Just(Framing::WebSocket)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn emitted_frames_parse_back(f in frame(), framing in framing()) {
        let repr = f.repr();
        let mut buf = Vec::new();
        repr.emit_vec(framing, &mut buf).unwrap();
        prop_assert_eq!(buf.len(), repr.buffer_len(framing));
        if framing == Framing::Stream {
            prop_assert_eq!(frame_len(&buf).unwrap(), Some(buf.len() as u64));
        }
        let p = TcpPacket::new_checked(&buf[..], framing).unwrap();
        prop_assert_eq!(TcpRepr::parse(&p), repr);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_reencode_exactly(
        data in vec(any::<u8>(), 0..64),
        framing in framing(),
    ) {
        let _ = frame_len(&data);
        if let Ok(p) = TcpPacket::new_checked(&data[..], framing) {
            let repr = TcpRepr::parse(&p);
            let mut again = Vec::new();
            repr.emit_vec(framing, &mut again).unwrap();
            prop_assert_eq!(again, data);
        }
    }

    #[test]
    fn cut_frames_are_never_accepted(f in frame(), cut in any::<prop::sample::Index>()) {
        let mut buf = Vec::new();
        f.repr().emit_vec(Framing::Stream, &mut buf).unwrap();
        let n = cut.index(buf.len());
        let short = &buf[..n];
        match frame_len(short) {
            Ok(None) => {}
            Ok(Some(len)) => prop_assert_eq!(len, buf.len() as u64),
            Err(e) => prop_assert!(false, "{e}"),
        }
        prop_assert_eq!(
            TcpPacket::new_checked(short, Framing::Stream).err(),
            Some(FrameError::Truncated)
        );
    }

    #[test]
    fn udp_translation_keeps_the_message(f in frame(), framing in framing(), mid in any::<u16>()) {
        // a UDP message has at most 64 KiB, and Empty must be bare
        prop_assume!(f.code != 0 && f.payload.len() < 60000);
        let mut buf = Vec::new();
        f.repr().emit_vec(framing, &mut buf).unwrap();
        let p = TcpPacket::new_checked(&buf[..], framing).unwrap();
        let mut udp = Vec::new();
        p.to_udp(MessageType::Con, mid, &mut udp).unwrap();
        if matches!(f.code >> 5, 1 | 3 | 6 | 7) {
            return Ok(()); // reserved over UDP
        }
        let u = Packet::new_checked(&udp[..]).unwrap();
        prop_assert_eq!(u.message_id(), mid);
        let mut back = Vec::new();
        frame_from_udp(framing, &u, &mut back);
        prop_assert_eq!(back, buf);
    }
}
