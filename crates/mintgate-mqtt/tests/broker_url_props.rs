//! Properties of broker URLs (`mqtt://HOST[:PORT]`, `mqtt5://...`): total
//! on any text; what is accepted prints and parses back the same.

use mintgate_mqtt::BrokerUrl;
use proptest::prelude::*;

proptest! {
    #[test]
    fn broker_urls_round_trip(s in "(mqtt5?|tcp|http)://(\\[[0-9a-f:]{0,12}\\]|[a-z0-9.-]{0,12})(:[0-9]{0,6})?/?") {
        if let Ok(u) = s.parse::<BrokerUrl>() {
            let back = u.to_string();
            prop_assert_eq!(back.parse::<BrokerUrl>(), Ok(u), "{} -> {}", s, back);
        }
    }

    /// Any characters at all in the host: what is accepted is an IPv6
    /// address in brackets or a plain name, and prints back the same.
    #[test]
    fn any_host_is_refused_or_round_trips(s in "(mqtt5?|tcp)://(\\[.{0,16}\\]|.{0,16})(:[0-9]{1,5})?") {
        if let Ok(u) = s.parse::<BrokerUrl>() {
            let ok_host = u.host.parse::<std::net::Ipv6Addr>().is_ok()
                || u.host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            prop_assert!(ok_host, "{:?} accepted host {:?}", s, u.host);
            let back = u.to_string();
            prop_assert_eq!(back.parse::<BrokerUrl>(), Ok(u), "{} -> {}", s, back);
        }
    }

    /// WebSocket URLs with any path: refused, or printed back the same.
    #[test]
    fn ws_urls_round_trip(s in "wss?5?://[a-z0-9.-]{1,12}(:[0-9]{1,5})?(/[ -~]{0,20})?") {
        if let Ok(u) = s.parse::<BrokerUrl>() {
            prop_assert!(u.ws_path.as_deref().is_some_and(|p| p.starts_with('/')));
            let back = u.to_string();
            prop_assert_eq!(back.parse::<BrokerUrl>(), Ok(u), "{} -> {}", s, back);
        }
    }

    #[test]
    fn any_text_parses_or_says_why(s in "[ -~]{0,40}") {
        if let Err(e) = s.parse::<BrokerUrl>() {
            prop_assert!(!e.is_empty());
        }
    }
}
