//! Properties of the gateway's parsers of outside input: the TOML config,
//! what a PUT to an actuator carries (`devices::parse_put`, `parse_put_as`) and MQTT
//! command payloads (`bridge::parse_command`). Total on any input; what
//! they accept they keep.

use mintgate_coap::wire::ContentFormat;
use mintgate_gateway::bridge::parse_command;
use mintgate_gateway::devices::{parse_put, parse_put_as};
use mintgate_gateway::Config;
use proptest::prelude::*;

/// Config text: a few real keys with arbitrary values, and junk.
fn config_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        Just("[coap]".to_string()),
        Just("[pipeline]".to_string()),
        Just("[proxy]".to_string()),
        Just("[mqtt]".to_string()),
        Just("[[devices.list]]".to_string()),
        Just("[directpath]".to_string()),
        (
            prop::sample::select(vec![
                "bind",
                "max_datagram",
                "threads",
                "name",
                "kind",
                "signal",
                "links",
                "enabled",
                "broker",
                "http",
                "period",
                "history",
            ]),
            prop_oneof![
                any::<i64>().prop_map(|v| v.to_string()),
                "[ -~&&[^\"\\\\]]{0,16}".prop_map(|s| format!("\"{s}\"")),
                Just("[\"127.0.0.1:0\"]".to_string()),
                Just("true".to_string()),
            ],
        )
            .prop_map(|(k, v)| format!("{k} = {v}")),
        "[ -~]{0,20}",
    ];
    proptest::collection::vec(line, 0..8).prop_map(|l| l.join("\n"))
}

proptest! {
    #[test]
    fn config_is_accepted_and_kept_or_refused_with_a_reason(text in config_text()) {
        match Config::from_toml(&text) {
            Ok(c) => {
                let t1 = c.to_toml();
                let c2 = Config::from_toml(&t1).unwrap();
                prop_assert_eq!(c2.to_toml(), t1);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn put_payloads_are_finite_numbers_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..24), v in -1e300f64..1e300) {
        if let Ok(x) = parse_put(&bytes) {
            prop_assert!(x.is_finite());
        }
        prop_assert_eq!(parse_put(format!(" {v:?}\n").as_bytes()), Ok(v));
    }

    #[test]
    fn json_put_payloads_are_finite_numbers_or_refused(text in "[ -~]{0,40}", v in -1e6f64..1e6) {
        let json = Some(ContentFormat::JSON);
        if let Ok(x) = parse_put_as(json, text.as_bytes()) {
            prop_assert!(x.is_finite());
        }
        // the device's own JSON representation goes back in
        let body = format!("{{\"n\":\"led0\",\"v\":{v:?},\"t\":1}}");
        let got = parse_put_as(json, body.as_bytes()).unwrap();
        prop_assert!((got - v).abs() <= v.abs() * 1e-15, "{got} vs {v}");
    }

    #[test]
    fn commands_are_finite_numbers_or_refused(text in "[ -~]{0,40}", v in -1e300f64..1e300) {
        if let Ok(x) = parse_command(text.as_bytes()) {
            prop_assert!(x.is_finite());
        }
        // serde_json (without its float_roundtrip feature) may be 1 ulp off
        let json = format!("{{\"value\": {v:?}}}");
        let x = parse_command(json.as_bytes()).unwrap();
        prop_assert!((x - v).abs() <= v.abs() * 4.0 * f64::EPSILON, "{} vs {}", x, v);
        let env = format!("{{\"pub\":\"gw\",\"seq\":1,\"ts\":0,\"msg\":\"{v:?}\"}}");
        prop_assert_eq!(parse_command(env.as_bytes()), Ok(v));
    }
}
