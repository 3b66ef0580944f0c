//! `mintgate proxy` (the HTTP/1.1, HTTP/2 and HTTP/3 proxy on its own) and
//! the glue `mintgate serve --http/--h3` uses: the `[proxy]` section of
//! the gateway's configuration turned into a `mintgate_proxy::ProxyConfig`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use mintgate_coap::rto::Algorithm;
use mintgate_gateway::access::{AccessSection, WriteMode};
use mintgate_gateway::config::ProxySection;
use mintgate_gateway::Config;
use mintgate_proxy::mapping::Authority;
use mintgate_proxy::{Listen, ProxyConfig, ProxyServer, WriteAuth};

/// Arguments of `mintgate proxy`.
#[derive(clap::Args)]
#[command(after_help = "\
Requests go to CoAP as /hc/coap://HOST:PORT/PATH (RFC 8075) or through the
configured reverse mappings ([[proxy.reverse]] in the config file). Only the
upstreams given with --upstream (or proxy.allow) are served; anything else
gets 403. Without --http or --h3 (or proxy.http / proxy.h3) the proxy serves
HTTP on 127.0.0.1:8080 and HTTP/3 on 127.0.0.1:8443.

Example:
  mintgate serve &
  mintgate proxy --upstream 127.0.0.1:5683
  curl http://127.0.0.1:8080/hc/coap://127.0.0.1:5683/request")]
pub struct ProxyArgs {
    /// TOML file; its [proxy] section is used (every key optional).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// TCP address for HTTP/1.1 and HTTP/2 (replaces proxy.http).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// UDP address for HTTP/3 (replaces proxy.h3).
    #[arg(long, value_name = "ADDR")]
    h3: Option<SocketAddr>,
    /// Allowed upstream CoAP server, host:port (repeatable; replaces
    /// proxy.allow) [default: 127.0.0.1:5683, [::1]:5683, localhost:5683].
    #[arg(long, value_name = "HOST:PORT")]
    upstream: Vec<String>,
    // A multi-line #[arg] like client.rs's -e and the token flags of get and
    // http: declarations of different flags, alike only in form.
    /// Accepted bearer token (repeatable; replaces proxy.bearer_tokens).
    /// Shows in `ps`: prefer --token-file, the MINTGATE_PROXY_TOKENS
    /// variable (tokens separated by commas) or the config file.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "MINTGATE_PROXY_TOKENS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    token: Vec<String>,
    /// File of accepted bearer tokens, one a line (blank lines and `#`
    /// comments skipped); with --token, both are accepted.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Congestion control of the upstream CoAP client (replaces proxy.congestion).
    #[arg(long, value_name = "basic|cocoa|adaptive")]
    cc: Option<Algorithm>,
    /// Check the [proxy] section with these flags applied, print the whole
    /// effective configuration as TOML (tokens shown as "<redacted>"; an
    /// empty `allow` means the default upstreams above) and exit.
    #[arg(long)]
    print_config: bool,
}

/// The addresses the gateway's own CoAP endpoint is reached at: each bound
/// address, an unspecified one (`[::]`, `0.0.0.0`) as loopback and
/// `localhost`.
pub fn own_endpoints(binds: &[SocketAddr]) -> Vec<Authority> {
    let mut out: Vec<Authority> = Vec::new();
    for b in binds {
        let port = b.port();
        let list: Vec<Authority> = if b.ip().is_unspecified() {
            let mut v = vec![Authority::from(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            ))];
            if b.is_ipv6() {
                v.push(Authority::from(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::LOCALHOST),
                    port,
                )));
            }
            v.push(Authority::new("localhost", port));
            v
        } else {
            let mut v = vec![Authority::from(*b)];
            if b.ip().is_loopback() {
                v.push(Authority::new("localhost", port));
            }
            v
        };
        for a in list {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// `[proxy]` as the proxy crate's configuration
/// ([`ProxySection::to_config`]), with its `[[proxy.oscore]]` context files
/// read once to check them; `default_allow` when `allow` is empty. Errors
/// name the key.
pub fn proxy_config(s: &ProxySection, default_allow: &[Authority]) -> anyhow::Result<ProxyConfig> {
    let cfg = s
        .to_config(default_allow)
        .map_err(|e| anyhow!("invalid config value proxy.{}: {}", e.key, e.why))?;
    for o in &s.oscore {
        mintgate_gateway::oscore::ContextConfig::from_file(&o.context)
            .map_err(|e| anyhow!("invalid config value proxy.oscore: {e}"))?;
    }
    Ok(cfg)
}

/// Sequence numbers the proxy reserves per write of a context's file: the
/// write (and its two fsyncs) runs on the task that drives every upstream
/// exchange, so it is rare; a restart skips at most this many of 2^40.
const PROXY_SEQ_STEP: u64 = 4096;

/// `[[proxy.oscore]]`: each upstream's context, opened from its file, its
/// sequence number in `STATE/proxy/NAME.seq` (`[oscore] state`, where
/// a packaged gateway may write; locked while the proxy runs).
fn upstream_oscore(
    list: &[mintgate_gateway::config::ProxyOscore],
    state: &std::path::Path,
) -> anyhow::Result<mintgate_proxy::upstream::UpstreamOscore> {
    let mut m = std::collections::HashMap::new();
    for o in list {
        let f = &o.context;
        let cfg = mintgate_gateway::oscore::ContextConfig::from_file(f)
            .map_err(|e| anyhow!("invalid config value proxy.oscore: {e}"))?;
        let base = match f.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        let (ctx, _) = mintgate_gateway::oscore::open_context(
            &cfg,
            base,
            &state.join("proxy"),
            PROXY_SEQ_STEP,
        )
        .map_err(|e| anyhow!("invalid config value proxy.oscore: {}: {e}", f.display()))?;
        if m.insert(
            o.upstream,
            std::sync::Arc::new(parking_lot::Mutex::new(ctx)),
        )
        .is_some()
        {
            return Err(anyhow!(
                "invalid config value proxy.oscore: {} has two contexts",
                o.upstream
            ));
        }
    }
    Ok(mintgate_proxy::upstream::UpstreamOscore(m))
}

/// The HTTP side of the `[access]` policy: bearer tokens for writes, passed
/// on to the gateway's own CoAP endpoints `own` only; writes from loopback
/// clients only while no mode is chosen.
pub fn write_auth(access: &AccessSection, own: &[Authority]) -> WriteAuth {
    match access.write {
        WriteMode::Unset => WriteAuth::LoopbackOnly {
            why: mintgate_gateway::access::UNSET_WHY.to_owned(),
        },
        WriteMode::Open => WriteAuth::Open,
        WriteMode::Token => WriteAuth::Bearer {
            tokens: access.tokens.clone(),
            forward_to: own.to_vec(),
        },
        WriteMode::Dtls | WriteMode::Oscore => WriteAuth::Refuse,
    }
}

/// Starts the proxy of `s` when it has a listener, with `extra` routes (the
/// dashboard) beside the proxy's on the HTTP listener and `access`'s write
/// policy; logs where it serves and where the HTTP/3 certificate is.
/// `upstream_bound` is told the upstream CoAP socket's local address before
/// any request can use it (the gateway in this process registers it as a
/// proxy source, see `mintgate_gateway::access`). `coap_ws` takes the
/// CoAP over WebSockets upgrades the HTTP listener hands over (serve's
/// gateway, with `proxy.coap_ws`).
pub fn start(
    s: &ProxySection,
    default_allow: &[Authority],
    access: &AccessSection,
    extra: Option<axum::Router>,
    upstream_bound: &dyn Fn(SocketAddr),
    coap_ws: Option<mintgate_gateway::coap_tcp::Adopter>,
    oscore_state: &std::path::Path,
) -> anyhow::Result<Option<ProxyServer>> {
    if s.http.is_none() && s.h3.is_none() {
        return Ok(None);
    }
    let mut cfg = proxy_config(s, default_allow)?;
    cfg.upstream_oscore = upstream_oscore(&s.oscore, oscore_state)?;
    cfg.write_auth = write_auth(access, default_allow);
    let allow: Vec<String> = cfg.allow.iter().map(|a| a.to_string()).collect();
    let mut sockets = mintgate_proxy::Sockets::bind(&Listen {
        http: s.http,
        h3: s.h3,
    })?;
    let up =
        mintgate_proxy::upstream::bind(s.upstream_bind).with_context(|| match s.upstream_bind {
            Some(a) => {
                format!("binding the proxy's upstream socket to udp {a} (proxy.upstream_bind)")
            }
            None => "binding the proxy's upstream socket".to_owned(),
        })?;
    upstream_bound(up.local_addr()?);
    sockets.upstream = Some(up);
    sockets.ws_handoff = coap_ws.map(|a| mintgate_proxy::server::Handoff {
        to: std::sync::Arc::new(move |s, peer| a.adopt(s, peer)),
    });
    let srv = ProxyServer::start_with(cfg, sockets, s.threads, extra)
        .context("starting the HTTP proxy")?;
    if let Some(a) = srv.http_addr() {
        tracing::info!(
            allow = %allow.join(", "),
            "HTTP/1.1 and HTTP/2 proxy on tcp {a} (try: curl http://{a}/hc/coap://{}/request)",
            allow.first().map(String::as_str).unwrap_or("127.0.0.1:5683")
        );
    }
    if let Some(a) = srv.h3_addr() {
        let (cert, generated) = srv
            .cert()
            .map(|(p, g)| (p.display().to_string(), g))
            .unwrap_or_default();
        if generated {
            tracing::info!("generated a self-signed certificate for HTTP/3: {cert}");
        }
        tracing::info!(
            certificate = %cert,
            "HTTP/3 proxy on udp {a} (try: mintgate http --h3 --cacert {cert} https://localhost:{}/hc/coap://{}/request)",
            a.port(),
            allow.first().map(String::as_str).unwrap_or("127.0.0.1:5683")
        );
    }
    Ok(Some(srv))
}

/// The proxy's counters: the dashboard's `proxy` section.
pub fn proxy_state(
    proxy: &mintgate_proxy::Proxy,
    conns: Option<&mintgate_proxy::server::ConnStats>,
    http: Option<SocketAddr>,
    h3: Option<SocketAddr>,
) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let st = proxy.stats();
    serde_json::json!({
        "http": http.map(|a| a.to_string()),
        "h3": h3.map(|a| a.to_string()),
        "requests": st.requests.load(Relaxed),
        "cache_hits": st.cache_hits.load(Relaxed),
        "early_data_served": st.early_data_served.load(Relaxed),
        "oscore": st.oscore.load(Relaxed),
        "connections": conns.map(|c| serde_json::json!({
            "open": c.open.load(Relaxed),
            "accepted": c.accepted.load(Relaxed),
            "refused_per_source": c.refused_per_source.load(Relaxed),
            "refused_total": c.refused_total.load(Relaxed),
            "header_timeouts": c.header_timeouts.load(Relaxed),
            "idle_closed": c.idle_closed.load(Relaxed),
            "handed_off": c.handed_off.load(Relaxed),
        })),
        "errors": errors(st).into_iter().map(|(k, v)| (k.to_string(), v.into())).collect::<serde_json::Map<String, serde_json::Value>>(),
    })
}

/// The proxy's refusals and failures by reason, for both the dashboard and
/// `/metrics`.
fn errors(st: &mintgate_proxy::service::ProxyStats) -> [(&'static str, u64); 11] {
    use std::sync::atomic::Ordering::Relaxed;
    [
        ("bad_gateway", &st.bad_gateway),
        ("bad_host", &st.bad_host),
        ("cross_site", &st.cross_site),
        ("forbidden", &st.forbidden),
        ("overloaded", &st.overloaded),
        ("rate_limited", &st.rate_limited),
        ("timeouts", &st.timeouts),
        ("too_early", &st.too_early),
        ("unauthorized", &st.unauthorized),
        ("write_mode_unset", &st.write_mode_unset),
        ("write_refused", &st.write_refused),
    ]
    .map(|(k, v)| (k, v.load(Relaxed)))
}

/// The same counters, for `/metrics`.
pub fn collect_proxy_metrics(
    m: &mut mintgate_gateway::exposition::Exposition,
    proxy: &mintgate_proxy::Proxy,
    conns: Option<&mintgate_proxy::server::ConnStats>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let st = proxy.stats();
    m.counter(
        "mintgate_proxy_requests_total",
        "HTTP requests the proxy handled.",
        st.requests.load(Relaxed),
    );
    m.counter(
        "mintgate_proxy_cache_hits_total",
        "Proxied requests answered from the cache.",
        st.cache_hits.load(Relaxed),
    );
    m.counters(
        "mintgate_proxy_errors_total",
        "Proxied requests refused or failed, by reason.",
        "reason",
        errors(st),
    );
    let Some(c) = conns else {
        return;
    };
    m.gauge(
        "mintgate_proxy_connections",
        "HTTP/1.1 and HTTP/2 connections open now.",
        c.open.load(Relaxed),
    );
    m.counters(
        "mintgate_proxy_connections_closed_total",
        "HTTP/1.1 and HTTP/2 connections closed by a limit, by reason.",
        "reason",
        [
            ("refused_per_source", &c.refused_per_source),
            ("refused_total", &c.refused_total),
            ("header_timeouts", &c.header_timeouts),
            ("idle_closed", &c.idle_closed),
        ]
        .map(|(k, v)| (k, v.load(Relaxed))),
    );
    m.counter(
        "mintgate_proxy_connections_handed_off_total",
        "Connections on the HTTP port handed to the coap+ws server (proxy.coap_ws).",
        c.handed_off.load(Relaxed),
    );
}

/// Runs `mintgate proxy` until SIGINT or SIGTERM.
pub fn run(a: ProxyArgs) -> anyhow::Result<ExitCode> {
    let cfg = match &a.config {
        // a gateway's file: its [coaps] identity may take its key from the
        // variable, as `serve` does, before the whole file is checked
        Some(p) => {
            let mut cfg = Config::read(p)?;
            if cfg.coaps.psk_identity.is_some() && cfg.coaps.psk_key.is_none() {
                cfg.coaps.psk_key = crate::psk_key_or_env(None);
            }
            cfg.validate()?;
            cfg
        }
        None => Config::default(),
    };
    let mut s = cfg.proxy.clone();
    if a.http.is_some() || a.h3.is_some() {
        s.http = a.http;
        s.h3 = a.h3;
    }
    if s.http.is_none() && s.h3.is_none() {
        s.http = Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)));
        s.h3 = Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 8443)));
    }
    if !a.upstream.is_empty() {
        s.allow = a.upstream.clone();
    }
    let mut tokens: Vec<String> = a.token.iter().filter(|t| !t.is_empty()).cloned().collect();
    if let Some(f) = &a.token_file {
        tokens.extend(crate::secrets_from_file(f, "--token-file")?);
    }
    if !tokens.is_empty() {
        s.bearer_tokens = tokens;
    }
    if let Some(cc) = a.cc {
        s.congestion = cc.name().to_owned();
    }
    let default_allow = own_endpoints(&[SocketAddr::from((Ipv6Addr::UNSPECIFIED, 5683))]);
    if a.print_config {
        proxy_config(&s, &default_allow)?;
        let mut full = cfg.clone();
        full.proxy = s;
        print!("{}", full.to_toml_redacted());
        return Ok(ExitCode::SUCCESS);
    }
    let nofile = crate::raise_nofile_limit();
    tracing::debug!(nofile, "open descriptor limit");
    let set = crate::common::block_signals();
    // the HTTP listener also answers /healthz and /readyz, as serve's does
    let health = mintgate_proxy::health::router(std::time::Instant::now());
    let srv = start(
        &s,
        &default_allow,
        &cfg.access,
        Some(health),
        &|a| tracing::debug!("upstream CoAP socket on udp {a}"),
        None,
        &cfg.oscore.state,
    )?
    .ok_or_else(|| anyhow!("nothing to serve"))?;
    let listeners: Vec<SocketAddr> = srv.http_addr().into_iter().chain(srv.h3_addr()).collect();
    if let Some(w) = mintgate_gateway::access::unset_warning(&cfg.access, &listeners) {
        tracing::warn!("{w}");
    }
    let sig = crate::common::wait_for_signal(&set, Duration::from_secs(3600), || {});
    // A last log line like serve's: other counters, one field each.
    let st = srv.proxy().stats();
    use std::sync::atomic::Ordering::Relaxed;
    tracing::info!(
        signal = sig,
        requests = st.requests.load(Relaxed),
        cache_hits = st.cache_hits.load(Relaxed),
        forbidden = st.forbidden.load(Relaxed),
        too_early = st.too_early.load(Relaxed),
        timeouts = st.timeouts.load(Relaxed),
        "proxy stopping"
    );
    drop(srv);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_defaults_match_the_proxy_crate() {
        let own = own_endpoints(&["[::]:5683".parse().unwrap()]);
        let from_section = proxy_config(&ProxySection::default(), &own).unwrap();
        let expected = ProxyConfig {
            allow: own.clone(),
            ..ProxyConfig::default()
        };
        assert_eq!(from_section, expected);
        assert_eq!(
            own.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["127.0.0.1:5683", "[::1]:5683", "localhost:5683"]
        );
    }

    #[test]
    fn section_errors_name_the_key() {
        let own = own_endpoints(&["127.0.0.1:5683".parse().unwrap()]);
        let mut s = ProxySection {
            congestion: "fast".into(),
            ..ProxySection::default()
        };
        let e = proxy_config(&s, &own).unwrap_err().to_string();
        assert!(e.contains("proxy.congestion"), "{e}");
        s.congestion = "adaptive".into();
        s.allow = vec!["::1".into()];
        let e = proxy_config(&s, &own).unwrap_err().to_string();
        assert!(e.contains("proxy.allow"), "{e}");
        s.allow = vec![];
        s.nstart = 0;
        let e = proxy_config(&s, &own).unwrap_err().to_string();
        assert!(e.contains("proxy.nstart"), "{e}");
        s.nstart = 1;
        s.reverse = vec![mintgate_gateway::config::ProxyReverse {
            prefix: "/s".into(),
            target: "coap://192.0.2.1/s".into(),
        }];
        let e = proxy_config(&s, &own).unwrap_err().to_string();
        assert!(e.contains("proxy.reverse"), "{e}");
    }

    #[test]
    fn toml_section_parses() {
        let c = Config::from_toml(
            "[proxy]\nhttp = \"127.0.0.1:0\"\nallow = [\"127.0.0.1:5683\"]\ncongestion = \"cocoa\"\n\
             [[proxy.reverse]]\nprefix = \"/sensors\"\ntarget = \"coap://127.0.0.1:5683/sensors\"\n",
        )
        .unwrap();
        let p = proxy_config(&c.proxy, &[]).unwrap();
        assert_eq!(p.congestion, Algorithm::Cocoa);
        assert_eq!(p.reverse[0].prefix, "/sensors");
        assert!(Config::from_toml("[proxy]\nbogus = 1\n").is_err());
    }
}
