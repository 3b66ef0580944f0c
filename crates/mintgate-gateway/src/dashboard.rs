//! The live dashboard: one page at `/` (HTML, CSS and JavaScript embedded in
//! the binary; nothing is fetched from elsewhere) that polls `/api/state`
//! every second and draws the last two minutes.
//!
//! `/api/state` is one JSON object. `pipeline` comes from the same counters
//! and Performance Observer samples as `/metrics` and `/api/observer`; every
//! other section is added by the part of the process that runs it
//! ([`crate::Gateway::add_state_source`]): `devices` and `directpath` by the
//! device host, `proxy` by the CLI when the HTTP proxy runs, `mqtt` by the
//! MQTT bridge. A section that is absent is a part that is not running, and
//! the page says "not enabled".
//!
//! The router is merged into the HTTP proxy's listener and the metrics
//! endpoint. It answers loopback clients only unless
//! `dashboard.allow_remote` is set: the proxy's listener may face the
//! network, and the page shows the gateway's internals. It also answers
//! only requests whose `Host` names the gateway
//! ([`mintgate_coap::uri::host_allowed`]: an IP literal, `localhost` or
//! one of `proxy.allowed_hosts`), so that a web page whose name is made to
//! resolve to 127.0.0.1 (DNS rebinding) cannot read `/api/state` through
//! the browser of someone on the gateway's host. Refusals are counted in
//! `mintgate_dashboard_refused_total{reason}`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::metrics::{sample_json, vta_json};
use crate::pipeline::GatewayHandle;

/// The page (with its CSS).
pub const INDEX_HTML: &str = include_str!("../assets/dashboard.html");
/// The page's script.
pub const DASHBOARD_JS: &str = include_str!("../assets/dashboard.js");

/// Observer samples sent with each state (the page's time window).
pub const SERIES_SECONDS: usize = 120;

/// `/`, `/dashboard.js` and `/api/state` for the gateway behind `gw`.
pub fn router(gw: GatewayHandle) -> Router {
    let guard = Arc::new(Guard {
        allow_remote: gw.config().dashboard.allow_remote,
        allowed_hosts: gw.config().proxy.allowed_hosts.clone(),
        gw: gw.clone(),
    });
    Router::new()
        .route("/", get(index))
        .route("/dashboard.js", get(script))
        .route("/api/state", get(state))
        .with_state(gw)
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| admin_only(guard.clone(), req, next),
        ))
}

/// Who the dashboard answers.
struct Guard {
    allow_remote: bool,
    allowed_hosts: Vec<String>,
    gw: GatewayHandle,
}

/// Requests the dashboard refused, by reason.
#[derive(Debug, Default)]
pub struct Refusals {
    /// A client not on loopback (`dashboard.allow_remote` off).
    pub not_loopback: AtomicU64,
    /// A `Host` that does not name the gateway (DNS rebinding).
    pub host: AtomicU64,
}

impl Refusals {
    /// `mintgate_dashboard_refused_total`.
    pub fn collect(&self, m: &mut crate::exposition::Exposition) {
        m.counters(
            "mintgate_dashboard_refused_total",
            "Dashboard requests refused, by reason.",
            "reason",
            [
                ("not_loopback", self.not_loopback.load(Relaxed)),
                ("host", self.host.load(Relaxed)),
            ],
        );
    }
}

/// Refuses clients that are not on loopback unless `allow_remote`, and
/// requests whose `Host` (or authority) does not name the gateway. A
/// request without a peer address (a server that does not give one) is
/// refused too: both of mintgate's listeners give it.
async fn admin_only(g: Arc<Guard>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_canonical());
    let counts = g.gw.dashboard_refusals();
    if !(g.allow_remote || peer.is_some_and(|ip| ip.is_loopback())) {
        counts.not_loopback.fetch_add(1, Relaxed);
        return (
            StatusCode::FORBIDDEN,
            "the dashboard answers loopback clients only (dashboard.allow_remote)\n",
        )
            .into_response();
    }
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"))
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if !mintgate_coap::uri::host_allowed(host, &g.allowed_hosts) {
        counts.host.fetch_add(1, Relaxed);
        return (
            StatusCode::FORBIDDEN,
            format!(
                "the dashboard does not answer for the host {:?}: use its address or \
                 localhost, or add the name to proxy.allowed_hosts\n",
                host.unwrap_or_default()
            ),
        )
            .into_response();
    }
    next.run(req).await
}

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
}

async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        DASHBOARD_JS,
    )
}

async fn state(State(gw): State<GatewayHandle>) -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Json(state_json(&gw)))
}

/// The whole state: `version`, `uptime_s`, `now_ms`, `pipeline`, and each
/// added section under its name.
pub fn state_json(gw: &GatewayHandle) -> Value {
    let c = gw.counters();
    let samples = gw.samples();
    let from = samples.len().saturating_sub(SERIES_SECONDS);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut v = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": gw.uptime().as_secs_f64(),
        "now_ms": now_ms,
        "pipeline": {
            "pool": gw.config().pipeline.pool.to_string(),
            "htp_threads": gw.htp_threads(),
            "batch_threads": c.pipeline_batch_threads.load(Relaxed),
            "queue_len": c.queue_len.load(Relaxed),
            "queue_bytes": c.queue_bytes.load(Relaxed),
            "queue_limit_bytes": gw.queue_bytes(),
            "totals": {
                "datagrams": c.nr_datagrams.load(Relaxed),
                "requests": c.nr_requests.load(Relaxed),
                "handled": c.htp_handled.load(Relaxed),
                "dropped_non": c.nr_dropped.load(Relaxed),
                "rejected_con": c.nr_rejected.load(Relaxed),
                "peer_limited": c.nr_peer_limited.load(Relaxed),
                "shed": c.htp_shed.load(Relaxed),
                "malformed": c.nr_malformed.load(Relaxed),
                "duplicates": c.nr_duplicates.load(Relaxed),
                "sent": c.sh_sent.load(Relaxed),
            },
            "samples": samples[from..].iter().map(sample_json).collect::<Vec<_>>(),
            "vta": vta_json(gw),
        },
        "observe": {
            "observers": gw.notifier().observers(),
        },
    });
    if let Value::Object(m) = &mut v {
        for (name, section) in gw.state_sections() {
            m.insert(name, section);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use axum::body::Body;
    use tower::ServiceExt as _;

    use super::*;
    use crate::{resources, Config, Gateway};

    fn gateway(allow_remote: bool) -> Gateway {
        let mut cfg = Config::default();
        cfg.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
        cfg.dashboard.allow_remote = allow_remote;
        Gateway::start(cfg.clone(), resources::router_for(&cfg)).unwrap()
    }

    async fn get_from(app: Router, path: &str, peer: Option<&str>) -> (StatusCode, String) {
        let mut req = Request::builder().uri(path).body(Body::empty()).unwrap();
        if let Some(p) = peer {
            req.extensions_mut()
                .insert(ConnectInfo(p.parse::<SocketAddr>().unwrap()));
        }
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn serves_the_page_and_state_to_loopback_only() {
        let gw = gateway(false);
        let app = router(gw.handle());
        let (s, body) = get_from(app.clone(), "/", Some("127.0.0.1:40000")).await;
        assert_eq!(s, StatusCode::OK);
        assert!(body.contains("<script src=\"/dashboard.js\">"), "{body}");
        // nothing fetched from elsewhere
        for page in [INDEX_HTML, DASHBOARD_JS] {
            let page = page.replace("'http://www.w3.org/2000/svg'", "");
            assert!(!page.contains("http://") && !page.contains("https://"));
        }
        let (s, _) = get_from(app.clone(), "/dashboard.js", Some("[::1]:40000")).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = get_from(app.clone(), "/api/state", Some("[::ffff:127.0.0.1]:1")).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = get_from(app.clone(), "/api/state", Some("192.0.2.7:40000")).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, _) = get_from(app, "/", None).await;
        assert_eq!(s, StatusCode::FORBIDDEN);

        let gw = gateway(true);
        let (s, _) = get_from(router(gw.handle()), "/api/state", Some("192.0.2.7:1")).await;
        assert_eq!(s, StatusCode::OK);
    }

    #[tokio::test]
    async fn answers_only_for_its_own_host_names() {
        let mut cfg = Config::default();
        cfg.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
        cfg.proxy.allowed_hosts = vec!["gw.example".into()];
        let gw = Gateway::start(cfg.clone(), resources::router_for(&cfg)).unwrap();
        let app = router(gw.handle());
        let with_host = |host: &'static str| {
            let mut req = Request::builder()
                .uri("/api/state")
                .header(header::HOST, host)
                .body(Body::empty())
                .unwrap();
            req.extensions_mut().insert(ConnectInfo(
                "127.0.0.1:40000".parse::<SocketAddr>().unwrap(),
            ));
            app.clone().oneshot(req)
        };
        for ok in [
            "127.0.0.1:9464",
            "[::1]:8080",
            "localhost:8080",
            "GW.example",
        ] {
            assert_eq!(
                with_host(ok).await.unwrap().status(),
                StatusCode::OK,
                "{ok}"
            );
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1.nip.io",
            "localhost.evil.example",
        ] {
            let r = with_host(bad).await.unwrap();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{bad}");
            let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
            assert!(
                String::from_utf8_lossy(&body).contains("proxy.allowed_hosts"),
                "{body:?}"
            );
        }
        // no Host at all (HTTP/1.0): not a browser
        let (s, _) = get_from(app, "/api/state", Some("127.0.0.1:1")).await;
        assert_eq!(s, StatusCode::OK);
        let text = crate::metrics::render_prometheus(&gw.handle());
        assert!(
            text.contains("mintgate_dashboard_refused_total{reason=\"host\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn state_follows_the_counters_and_carries_added_sections() {
        let gw = gateway(false);
        let addr = gw.local_addrs()[0];
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        // the Observer's samples count from its first tick: send only once
        // there is one, so every request falls into a sample
        let end = Instant::now() + Duration::from_secs(5);
        while state_json(&gw.handle())["pipeline"]["samples"]
            .as_array()
            .is_none_or(|a| a.is_empty())
        {
            assert!(Instant::now() < end, "the Observer took no sample");
            std::thread::sleep(Duration::from_millis(50));
        }
        for mid in 0..10u16 {
            let mut req = vec![0x50, 0x01];
            req.extend_from_slice(&mid.to_be_bytes());
            req.push(0xB7);
            req.extend_from_slice(b"request");
            client.send_to(&req, addr).unwrap();
            let mut buf = [0u8; 256];
            client.recv(&mut buf).expect("an answer");
        }
        let v = state_json(&gw.handle());
        assert_eq!(v["pipeline"]["totals"]["requests"], 10);
        assert_eq!(v["pipeline"]["pool"], "vta");
        assert!(v.get("mqtt").is_none(), "no MQTT section unless added");
        // H is counted once the answer is out, and the Observer's sample
        // within a second
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let v = state_json(&gw.handle());
            let sum = |k: &str| -> u64 {
                v["pipeline"]["samples"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s[k].as_u64().unwrap())
                    .sum()
            };
            if v["pipeline"]["totals"]["handled"] == 10 && sum("r") == 10 && sum("h") == 10 {
                break;
            }
            assert!(Instant::now() < end, "no sample counted the requests: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
        gw.add_state_source("mqtt", Arc::new(|| json!({"connected": true})));
        gw.add_state_source("mqtt", Arc::new(|| json!({"connected": false})));
        let v = state_json(&gw.handle());
        assert_eq!(v["mqtt"]["connected"], false, "replaced, not duplicated");
        gw.remove_state_source("mqtt");
        assert!(state_json(&gw.handle()).get("mqtt").is_none());
    }
}
