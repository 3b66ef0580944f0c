//! `Packet::new_checked` on arbitrary bytes, then every accessor of an
//! accepted packet, then `classify`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_coap::server::{classify, Inbound};
use mintgate_coap::wire::{MessageType, Packet};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::new_checked(data) {
        let _ = p.msg_type();
        let code = p.code();
        let _ = p.message_id();
        let token = p.token();
        assert!(token.len() <= 8);
        let mut last = 0u16;
        let mut seen = 0usize;
        for o in p.options() {
            assert!(o.number.0 >= last, "options out of order");
            last = o.number.0;
            seen += o.value.len();
            let _ = o.uint();
            let _ = o.str();
        }
        let payload = p.payload();
        assert!(p.payload_offset() + payload.len() == data.len());
        assert!(4 + token.len() + seen + payload.len() <= data.len());
        if code.is_empty() {
            assert_eq!(data.len(), 4, "Empty message with content accepted");
        }
        let _ = format!("{p:?}");
    }
    match classify(data) {
        Inbound::Reset(rst, _) => {
            let (_, ty, _, mid) = Packet::<&[u8]>::peek_header(data).expect("Reset without header");
            assert_eq!(ty, MessageType::Con, "Reset for a non-CON");
            let r = Packet::new_checked(&rst[..]).expect("our Reset must parse");
            assert_eq!(r.msg_type(), MessageType::Rst);
            assert_eq!(r.message_id(), mid);
        }
        Inbound::Request(p) => {
            assert!(p.code().is_request());
            let _ = p.token();
            let _ = p.options().count();
            let _ = p.payload();
        }
        Inbound::Ack(_) | Inbound::PeerReset(_) | Inbound::Drop(_) => {}
    }
});
