// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! The message envelope every queued publish carries, as JSON:
//!
//! ```json
//! {"pub":"gw-3f2a9c1e","seq":17,"ts":1732550400123,"msg":"0017:mintgate-fig5-payload"}
//! ```
//!
//! - `pub`: the publisher's identity (stable across restarts: it lives in the
//!   queue's store), so that a receiver orders each publisher separately.
//! - `seq`: the sequence number per publisher and topic, 1, 2, 3, ... with
//!   no gaps on each topic (a first message may start above 1, see
//!   [`crate::store`]). The receiver orders and de-duplicates by it (the
//!   paper used the current time in milliseconds, which collides when two
//!   messages share a millisecond).
//! - `ts`: when the message was enqueued, milliseconds since the Unix epoch;
//!   informational only, never used for ordering.
//! - `msg`: the application's body. A body that is itself a JSON object or
//!   array goes in as that object, not as a string of JSON, so a consumer
//!   (Node-RED, Telegraf, Home Assistant) decodes once:
//!   `"msg":{"device":"temp0","value":22.5}`; any other body goes in as a
//!   string. [`decode`] gives either back as the body's text, byte for
//!   byte (older envelopes, whose `msg` was always a string, decode too).
//!
//! [`decode`] is a pure function of its input: it never panics, whatever the
//! bytes (they come off the network), and it rejects rather than guesses.

use serde::{Deserialize, Serialize};

/// Longest publisher id [`decode`] accepts, in bytes.
pub const MAX_PUBLISHER_LEN: usize = 128;

/// One queued message as it travels in a PUBLISH payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The publisher's identity.
    #[serde(rename = "pub")]
    pub publisher: String,
    /// Per-publisher sequence number, starting at 1.
    pub seq: u64,
    /// Enqueue time, ms since the Unix epoch.
    pub ts: u64,
    /// The application's body (see the module's docs for how it travels).
    #[serde(default, with = "body")]
    pub msg: String,
}

/// `msg` on the wire: a JSON object or array as itself, anything else as a
/// JSON string; read back as the text it was made from.
mod body {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::value::RawValue;

    /// Whether `text` goes in as JSON: an object or an array, valid, with
    /// nothing around it (whitespace around would not come back).
    pub(super) fn as_json(text: &str) -> Option<Box<RawValue>> {
        let b = text.as_bytes();
        if !matches!(b.first(), Some(b'{' | b'[')) || !matches!(b.last(), Some(b'}' | b']')) {
            return None;
        }
        // valid one level deeper too: inside the envelope it must still be
        // within the JSON parser's nesting limit, or it would not decode
        serde_json::from_str::<serde::de::IgnoredAny>(&format!("[{text}]")).ok()?;
        RawValue::from_string(text.to_owned()).ok()
    }

    pub fn serialize<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
        match as_json(text) {
            Some(raw) => raw.serialize(s),
            None => text.serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        let text = raw.get();
        if text.starts_with('"') {
            serde_json::from_str(text).map_err(serde::de::Error::custom)
        } else {
            Ok(text.to_owned())
        }
    }
}

/// Why a payload is not an [`Envelope`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or JSON without the required fields of the right types.
    #[error("not a mintgate envelope: {0}")]
    Json(String),
    /// `seq` is 0 (sequence numbers start at 1).
    #[error("seq must be at least 1")]
    ZeroSeq,
    /// The publisher id is empty or longer than [`MAX_PUBLISHER_LEN`].
    #[error("publisher id must be 1..={MAX_PUBLISHER_LEN} bytes, got {0}")]
    PublisherLen(usize),
}

impl Envelope {
    /// `msg` as it travels: the JSON object or array it holds, or a string.
    pub fn msg_value(&self) -> serde_json::Value {
        body::as_json(&self.msg)
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_else(|| serde_json::Value::String(self.msg.clone()))
    }

    /// The JSON bytes of this envelope.
    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Parses a PUBLISH payload. Pure and total: any input gives `Ok` or `Err`,
/// never a panic. Unknown extra fields are ignored (forward compatibility).
pub fn decode(payload: &[u8]) -> Result<Envelope, DecodeError> {
    let env: Envelope =
        serde_json::from_slice(payload).map_err(|e| DecodeError::Json(e.to_string()))?;
    if env.seq == 0 {
        return Err(DecodeError::ZeroSeq);
    }
    let n = env.publisher.len();
    if n == 0 || n > MAX_PUBLISHER_LEN {
        return Err(DecodeError::PublisherLen(n));
    }
    Ok(env)
}

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_shape() {
        let e = Envelope {
            publisher: "gw-1".into(),
            seq: 17,
            ts: 1_732_550_400_123,
            msg: "0017:mintgate-fig5-payload".into(),
        };
        let bytes = e.encode();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains("\"seq\":17"), "{text}");
        assert!(text.contains("\"ts\":1732550400123"), "{text}");
        assert_eq!(decode(&bytes).unwrap(), e);
    }

    #[test]
    fn a_json_body_travels_as_an_object_and_comes_back_as_it_was() {
        let body = r#"{"device":"temp0","value":22.513,"unit":"Cel","ts":1}"#;
        let e = Envelope {
            publisher: "gw-1".into(),
            seq: 2,
            ts: 3,
            msg: body.into(),
        };
        let bytes = e.encode();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["msg"]["device"], "temp0", "{v}");
        assert_eq!(decode(&bytes).unwrap().msg, body);
        // not an object: a string, as before
        for text in [
            "22.5",
            "{not json",
            "[1,",
            "\"q\"",
            "",
            "{}\n",
            "[] ",
            " {}",
        ] {
            let e = Envelope {
                msg: text.into(),
                ..e.clone()
            };
            let bytes = e.encode();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["msg"], text, "{v}");
            assert_eq!(decode(&bytes).unwrap().msg, text);
        }
        // an envelope of an older version (msg a string of JSON) decodes
        let old = br#"{"pub":"a","seq":1,"ts":0,"msg":"{\"value\":1}"}"#;
        assert_eq!(decode(old).unwrap().msg, r#"{"value":1}"#);
        // nested as deep as the parser allows on its own: a string, so the
        // envelope around it still decodes
        for depth in [120, 127, 128, 200] {
            let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let e = Envelope {
                msg: deep.clone(),
                ..e.clone()
            };
            assert_eq!(decode(&e.encode()).unwrap().msg, deep, "depth {depth}");
        }
        // a number or null as msg is taken as its text
        assert_eq!(
            decode(br#"{"pub":"a","seq":1,"ts":0,"msg":7}"#)
                .unwrap()
                .msg,
            "7"
        );
    }

    #[test]
    fn rejects_bad_payloads() {
        assert!(matches!(decode(b""), Err(DecodeError::Json(_))));
        assert!(matches!(decode(b"hello"), Err(DecodeError::Json(_))));
        assert!(matches!(
            decode(br#"{"pub":"a","seq":-1,"ts":0}"#),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(
            decode(br#"{"pub":"a","seq":"1","ts":0}"#),
            Err(DecodeError::Json(_))
        ));
        assert_eq!(
            decode(br#"{"pub":"a","seq":0,"ts":0}"#),
            Err(DecodeError::ZeroSeq)
        );
        assert_eq!(
            decode(br#"{"pub":"","seq":1,"ts":0}"#),
            Err(DecodeError::PublisherLen(0))
        );
        // Unknown fields are fine, msg defaults to empty.
        let e = decode(br#"{"pub":"a","seq":3,"ts":5,"x":[1,2]}"#).unwrap();
        assert_eq!((e.seq, e.ts, e.msg.as_str()), (3, 5, ""));
        // Deep nesting hits serde_json's recursion limit: an error, no stack overflow.
        let deep = "[".repeat(100_000);
        assert!(decode(deep.as_bytes()).is_err());
    }

    proptest! {
        #[test]
        fn any_body_comes_back_as_it_was(msg in ".{0,64}", obj in proptest::collection::btree_map("[a-z]{1,4}", any::<i32>(), 0..4)) {
            for msg in [msg, serde_json::to_string(&obj).unwrap()] {
                let e = Envelope { publisher: "p".into(), seq: 1, ts: 0, msg };
                prop_assert_eq!(decode(&e.encode()).unwrap(), e);
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_near_json(
            seq in any::<i128>(),
            ts in any::<i128>(),
            p in ".{0,140}",
            cut in 0usize..200,
        ) {
            let s = format!(r#"{{"pub":{},"seq":{seq},"ts":{ts},"msg":"x"}}"#,
                serde_json::to_string(&p).unwrap());
            let r = decode(s.as_bytes());
            if let Ok(e) = &r {
                prop_assert!(e.seq >= 1);
                prop_assert_eq!(e.seq as i128, seq);
            }
            let _ = decode(&s.as_bytes()[..cut.min(s.len())]);
        }

        #[test]
        fn encode_decode_round_trip(
            p in "[a-zA-Z0-9_-]{1,64}",
            seq in 1u64..,
            ts in any::<u64>(),
            msg in ".{0,64}",
        ) {
            let e = Envelope { publisher: p, seq, ts, msg };
            prop_assert_eq!(decode(&e.encode()).unwrap(), e);
        }
    }
}
