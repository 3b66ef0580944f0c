//! Listeners: the defaults keep every admin endpoint on loopback (or off),
//! and a running `mintgate serve` listens exactly where its configuration
//! says, nowhere else (read from the process's own sockets in /proc).

mod common;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use common::*;

fn loopback(a: &SocketAddr) -> bool {
    a.ip().to_canonical().is_loopback()
}

#[test]
fn defaults_keep_admin_endpoints_on_loopback_or_off() {
    let out = mintgate(&["serve", "--print-config"]);
    assert!(out.status.success(), "{out:?}");
    let v: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    // the CoAP service itself is public by design: [::]:5683
    assert_eq!(v["coap"]["bind"][0].as_str(), Some("[::]:5683"));
    // off unless asked for: metrics, the HTTP and HTTP/3 proxy (and with it
    // the dashboard)
    assert!(v["metrics"].get("bind").is_none(), "{v:?}");
    assert!(v["proxy"].get("http").is_none() && v["proxy"].get("h3").is_none());
    // on loopback: the embedded MQTT broker
    for k in ["embedded_listen", "embedded_listen5"] {
        let a: SocketAddr = v["mqtt"][k].as_str().unwrap().parse().unwrap();
        assert!(loopback(&a), "mqtt.{k} = {a}");
    }
    // the dashboard answers loopback only; /links writes come from loopback
    assert_eq!(v["dashboard"]["allow_remote"].as_bool(), Some(false));
    assert_eq!(v["access"]["admin_remote"].as_bool(), Some(false));
    // no write mode chosen: absent, and writes are taken from loopback only
    assert!(v["access"].get("write").is_none(), "{v:?}");
    // `mintgate proxy` on its own: loopback
    let out = mintgate(&["proxy", "--print-config"]);
    assert!(out.status.success(), "{out:?}");
    let v: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    for k in ["http", "h3"] {
        let a: SocketAddr = v["proxy"][k].as_str().unwrap().parse().unwrap();
        assert!(loopback(&a), "proxy --{k} defaults to {a}");
    }
    // `mintgate broker` on its own: loopback
    let help = String::from_utf8_lossy(&mintgate(&["broker", "--help"]).stdout).into_owned();
    assert!(
        help.contains("[default: 127.0.0.1:1883]") && help.contains("[default: 127.0.0.1:1884]"),
        "{help}"
    );
}

/// A socket of the process: protocol, local address, listening (TCP) or
/// unconnected (UDP).
#[derive(Debug, Clone, Copy)]
struct Sock {
    tcp: bool,
    local: SocketAddr,
    open: bool,
}

/// `/proc/net/{tcp,udp}[6]` address: hex IPv4 (one little-endian word) or
/// IPv6 (four little-endian words), colon, hex port.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(ip, 16).ok()?.swap_bytes(),
        )),
        32 => {
            let mut b = [0u8; 16];
            for w in 0..4 {
                let word = u32::from_str_radix(&ip[w * 8..w * 8 + 8], 16).ok()?;
                b[w * 4..w * 4 + 4].copy_from_slice(&word.to_le_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn sockets_of(pid: u32) -> Vec<Sock> {
    let mut inodes = HashSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(i.to_owned());
            }
        }
    }
    let mut out = Vec::new();
    for (file, tcp) in [
        ("tcp", true),
        ("tcp6", true),
        ("udp", false),
        ("udp6", false),
    ] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")) else {
            continue;
        };
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || !inodes.contains(f[9]) {
                continue;
            }
            let Some(local) = parse_addr(f[1]) else {
                continue;
            };
            // TCP 0A = LISTEN; UDP 07 = not connected (takes anyone's datagrams)
            let open = if tcp { f[3] == "0A" } else { f[3] == "07" };
            out.push(Sock { tcp, local, open });
        }
    }
    out
}

#[test]
fn serve_listens_exactly_where_configured() {
    let dir = tmp_dir("listeners");
    let (coap, http_port, h3, metrics) = (free_udp(), free_tcp(), free_udp(), free_tcp());
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [proxy]\nhttp = \"127.0.0.1:{http_port}\"\nh3 = \"127.0.0.1:{h3}\"\ntls_dir = \"{}\"\n\
             [mqtt]\nenabled = true\nembedded_listen = \"127.0.0.1:0\"\nembedded_listen5 = \"127.0.0.1:0\"\n\
             state = \"{}\"\n",
            dir.join("tls").display(),
            dir.join("mqtt").display()
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    gw.wait_coap(
        format!("127.0.0.1:{coap}").parse().unwrap(),
        Duration::from_secs(30),
    );
    // CoAP answers before the rest has started: wait for the last line
    gw.wait_log("mintgate serving CoAP", Duration::from_secs(30));
    let socks = sockets_of(gw.pid());
    println!("{socks:#?}");
    let tcp: Vec<&Sock> = socks.iter().filter(|s| s.tcp && s.open).collect();
    assert!(tcp.iter().all(|s| loopback(&s.local)), "{tcp:?}");
    let ports: HashSet<u16> = tcp.iter().map(|s| s.local.port()).collect();
    assert!(
        ports.contains(&http_port) && ports.contains(&metrics),
        "{tcp:?}"
    );
    assert_eq!(
        tcp.len(),
        4,
        "proxy, metrics and the broker's two listeners: {tcp:?}"
    );
    let udp: Vec<&Sock> = socks.iter().filter(|s| !s.tcp && s.open).collect();
    for port in [coap, h3] {
        assert!(
            udp.iter()
                .any(|s| s.local.port() == port && loopback(&s.local)),
            "udp {port} on loopback: {udp:?}"
        );
    }
    // every other unconnected UDP socket is a client's (the proxy's
    // upstream CoAP client, on an ephemeral port), never a configured one
    // on a wider address
    for s in udp.iter().filter(|s| !loopback(&s.local)) {
        assert!(
            s.local.port() != coap && s.local.port() != h3 && s.local.port() >= 32768,
            "{s:?}"
        );
    }
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}
