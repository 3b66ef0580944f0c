//! OSCORE verification (`mintgate_coap::oscore`, RFC 8613 8.2 and 8.4) of
//! hostile datagrams. Nothing may panic; the option codec must give back
//! the value it read; a request that verifies must be one the fuzzer could
//! only have made with the keys, so any success is a genuine protected
//! request and must not verify twice (the replay window); the same holds
//! for a notification (its Notification Number).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_coap::oscore::{
    option_of, Context, Error, Notifications, OscoreOption, Params, RequestId,
};
use mintgate_coap::wire::Packet;

fn params(sender: &[u8], recipient: &[u8]) -> Params {
    Params {
        master_secret: (1..=16).collect(),
        master_salt: vec![0x9e, 0x7c, 0xa9, 0x22, 0x23, 0x78, 0x63, 0x40],
        sender_id: sender.to_vec(),
        recipient_id: recipient.to_vec(),
        id_context: None,
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(o) = OscoreOption::decode(data) {
        let mut back = Vec::new();
        o.encode(&mut back).expect("a decoded option encodes");
        // the flag byte 0x00 alone decodes as the empty value
        if data != [0] {
            assert_eq!(back, data);
        }
    }
    if let Ok(p) = Packet::new_checked(data) {
        let _ = option_of(&p);
    }
    let mut server = Context::new(&params(&[1], &[])).expect("context");
    match server.unprotect_request(data) {
        Ok(u) => {
            assert!(Packet::new_checked(&u.message[..]).is_ok());
            assert_eq!(server.unprotect_request(data).unwrap_err(), Error::Replay);
        }
        Err(Error::EchoRequired(_)) => panic!("the window is known"),
        Err(_) => {}
    }
    let client = Context::new(&params(&[], &[1])).expect("context");
    let req = RequestId {
        kid: vec![],
        piv: vec![0x14],
        nonce: [0; 13],
    };
    if let Ok(m) = client.unprotect_response(data, &req) {
        assert!(Packet::new_checked(&m[..]).is_ok());
    }
    // a notification that verifies is delivered once (RFC 8613 7.4.1)
    let mut seen = Notifications::default();
    if let Ok(m) = client.unprotect_notification(data, &req, &mut seen) {
        assert!(Packet::new_checked(&m[..]).is_ok());
        assert_eq!(
            client.unprotect_notification(data, &req, &mut seen),
            Err(Error::Replay)
        );
    }
});
