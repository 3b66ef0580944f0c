//! The gateway's TOML configuration (`Config::from_toml`: every section,
//! devices, direct-path links, proxy and MQTT, then `validate`) on
//! arbitrary text, plus the MQTT broker URL syntax the config carries.
//! An accepted config must write back (`to_toml`) to text that is accepted
//! again and writes back identically; a broker URL must print and parse
//! back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_gateway::Config;
use mintgate_mqtt::BrokerUrl;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(b) = text.trim().parse::<BrokerUrl>() {
        let back = b.to_string();
        assert_eq!(
            back.parse::<BrokerUrl>().as_ref(),
            Ok(&b),
            "{text:?} -> {back:?}"
        );
    }
    match Config::from_toml(text) {
        Ok(c) => {
            let t1 = c.to_toml();
            assert!(!t1.is_empty(), "an accepted config does not serialise");
            let c2 = match Config::from_toml(&t1) {
                Ok(c2) => c2,
                Err(e) => panic!("written back config refused: {e}\n{t1}"),
            };
            assert_eq!(c2.to_toml(), t1, "not stable after one round");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
