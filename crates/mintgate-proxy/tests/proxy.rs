//! The proxy end to end on loopback: HTTP/1.1, HTTP/2 and HTTP/3 clients
//! (this crate's) against a [`ProxyServer`] whose upstream is a small
//! scripted CoAP server (each path behaves in one way the mapping must
//! handle), so each rule of RFC 8075 and each limit is proven over real
//! sockets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_proxy::client::{ClientOptions, Exchange, HttpClient, Proto};
use mintgate_proxy::mapping::{Authority, ReverseMapping};
use mintgate_proxy::tls::Roots;
use mintgate_proxy::{Listen, ProxyConfig, ProxyServer};

/// A scripted CoAP server. Paths:
/// - `hello`: 2.05 "hello" text/plain, Max-Age 30, ETag 0102; 2.03 when the
///   request carries ETag 0102.
/// - `nocache`: 2.05 with Max-Age 0.
/// - `create`: 2.01 with Location-Path items/7.
/// - `echo`: 2.04 with the request payload and its Content-Format.
/// - `silent`: never answers. `reset`: Reset. `weird`: 2.05 with an
///   unknown critical option. `slow`: 2.05 after 400 ms.
struct FakeCoap {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeCoap {
    fn start() -> FakeCoap {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, st) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let sock = Arc::new(sock);
            let mut buf = [0u8; 2048];
            while !st.load(Relaxed) {
                let Ok((n, src)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(p) = Packet::new_checked(&buf[..n]) else {
                    continue;
                };
                if p.msg_type() != MessageType::Con {
                    continue;
                }
                let path: Vec<String> = p
                    .options()
                    .filter(|o| o.number == OptionNumber::URI_PATH)
                    .map(|o| String::from_utf8_lossy(o.value).into_owned())
                    .collect();
                let path = path.join("/");
                *h.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
                let etag = p.option(OptionNumber::ETAG).map(|o| o.value.to_vec());
                let cf = p
                    .option(OptionNumber::CONTENT_FORMAT)
                    .map(|o| o.value.to_vec());
                let mut out = [0u8; 2048];
                let (mid, tok) = (p.message_id(), p.token().to_vec());
                let reply = |code: Code,
                             opts: &[(OptionNumber, Vec<u8>)],
                             payload: &[u8],
                             out: &mut [u8]| {
                    let mut w = MessageWriter::new(out, MessageType::Ack, code, mid, &tok).unwrap();
                    let mut opts = opts.to_vec();
                    opts.sort_by_key(|(n, _)| *n);
                    for (n, v) in &opts {
                        w.option(*n, v).unwrap();
                    }
                    w.payload(payload).unwrap();
                    w.finish()
                };
                let len = match path.as_str() {
                    "hello" if etag.as_deref() == Some(&[1, 2]) => reply(
                        Code::VALID,
                        &[
                            (OptionNumber::ETAG, vec![1, 2]),
                            (OptionNumber::MAX_AGE, vec![30]),
                        ],
                        b"",
                        &mut out,
                    ),
                    "hello" => reply(
                        Code::CONTENT,
                        &[
                            (OptionNumber::ETAG, vec![1, 2]),
                            (OptionNumber::CONTENT_FORMAT, vec![]),
                            (OptionNumber::MAX_AGE, vec![30]),
                        ],
                        b"hello",
                        &mut out,
                    ),
                    "nocache" => reply(
                        Code::CONTENT,
                        &[(OptionNumber::MAX_AGE, vec![])],
                        b"x",
                        &mut out,
                    ),
                    "create" => reply(
                        Code::CREATED,
                        &[
                            (OptionNumber::LOCATION_PATH, b"items".to_vec()),
                            (OptionNumber::LOCATION_PATH, b"7".to_vec()),
                        ],
                        b"",
                        &mut out,
                    ),
                    "echo" => {
                        let mut o = Vec::new();
                        if let Some(cf) = cf {
                            o.push((OptionNumber::CONTENT_FORMAT, cf));
                        }
                        reply(Code::CHANGED, &o, p.payload(), &mut out)
                    }
                    "silent" => continue,
                    "reset" => {
                        let rst = mintgate_coap::wire::empty_message(MessageType::Rst, mid);
                        let _ = sock.send_to(&rst, src);
                        continue;
                    }
                    "weird" => reply(
                        Code::CONTENT,
                        &[(OptionNumber(13), vec![1])],
                        b"?",
                        &mut out,
                    ),
                    "slow" => {
                        let len = reply(Code::CONTENT, &[], b"slow", &mut out);
                        let (s, data) = (sock.clone(), out[..len].to_vec());
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_millis(400));
                            let _ = s.send_to(&data, src);
                        });
                        continue;
                    }
                    _ => reply(Code::NOT_FOUND, &[], b"", &mut out),
                };
                let _ = sock.send_to(&out[..len], src);
            }
        });
        FakeCoap {
            addr,
            hits,
            stop,
            thread: Some(thread),
        }
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn uri(&self, path: &str) -> String {
        format!("/hc/coap://{}/{path}", self.addr)
    }
}

impl Drop for FakeCoap {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn config(coap: &FakeCoap) -> ProxyConfig {
    // One folder per server: tests run in parallel and each generates its
    // own self-signed certificate.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let tmp = std::env::temp_dir().join(format!(
        "mintgate-proxy-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Relaxed)
    ));
    let mut c = ProxyConfig {
        allow: vec![Authority::from(coap.addr)],
        ..ProxyConfig::default()
    };
    c.tls.self_signed_dir = tmp;
    c
}

fn start(cfg: ProxyConfig) -> ProxyServer {
    ProxyServer::start(
        cfg,
        &Listen {
            http: Some("127.0.0.1:0".parse().unwrap()),
            h3: Some("127.0.0.1:0".parse().unwrap()),
        },
        1,
    )
    .unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn opts(proto: Proto, new_conn: bool, srv: &ProxyServer) -> ClientOptions {
    let roots = match srv.cert() {
        Some((p, _)) => Roots::Certs(mintgate_proxy::tls::load_certs(p).unwrap()),
        None => Roots::Insecure,
    };
    ClientOptions {
        proto,
        new_conn,
        roots,
        server_name: "localhost".into(),
        client_cert: None,
        timeout: Duration::from_secs(10),
    }
}

fn addr(srv: &ProxyServer, proto: Proto) -> SocketAddr {
    match proto {
        Proto::H3 => srv.h3_addr().unwrap(),
        _ => srv.http_addr().unwrap(),
    }
}

async fn get(c: &mut HttpClient, target: &str, headers: &[(&str, &str)]) -> Exchange {
    req(c, Method::GET, target, headers, "").await
}

async fn req(
    c: &mut HttpClient,
    m: Method,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Exchange {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    c.request(m, target, &h, Bytes::from(body.to_owned()))
        .await
        .unwrap()
}

#[test]
fn mapping_over_every_protocol() {
    let coap = FakeCoap::start();
    let srv = start(config(&coap));
    rt().block_on(async {
        for proto in [Proto::H1, Proto::H2, Proto::H3] {
            let mut c = HttpClient::new(opts(proto, false, &srv), addr(&srv, proto), None).unwrap();
            // Plain GET: status, headers, body, Server-Timing.
            let r = get(&mut c, &coap.uri("hello"), &[("cache-control", "no-cache")]).await;
            assert_eq!(r.status, StatusCode::OK, "{proto:?}");
            assert_eq!(r.body.as_ref(), b"hello");
            assert_eq!(r.headers["content-type"], "text/plain; charset=utf-8");
            assert_eq!(r.headers["etag"], "\"0102\"");
            assert_eq!(r.headers["cache-control"], "max-age=30");
            assert!(r.coap_rtt().is_some(), "{proto:?}: {:?}", r.headers);
            // Conditional GET: 304.
            let r = get(
                &mut c,
                &coap.uri("hello"),
                &[("if-none-match", "\"0102\""), ("cache-control", "no-cache")],
            )
            .await;
            assert_eq!(r.status, StatusCode::NOT_MODIFIED, "{proto:?}");
            assert!(r.body.is_empty());
            // POST -> 2.01 with Location.
            let r = req(&mut c, Method::POST, &coap.uri("create"), &[], "x").await;
            assert_eq!(r.status, StatusCode::CREATED);
            assert_eq!(
                r.headers["location"],
                format!("/hc/coap://{}/items/7", coap.addr).as_str()
            );
            // PUT with a content type: format carried both ways.
            let r = req(
                &mut c,
                Method::PUT,
                &coap.uri("echo"),
                &[("content-type", "application/json")],
                "{\"a\":1}",
            )
            .await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(r.headers["content-type"], "application/json");
            assert_eq!(r.body.as_ref(), b"{\"a\":1}");
            // Unknown content type: 415 before anything goes upstream.
            let before = coap.hits("echo");
            let r = req(
                &mut c,
                Method::PUT,
                &coap.uri("echo"),
                &[("content-type", "image/png")],
                "x",
            )
            .await;
            assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(coap.hits("echo"), before);
            // 4.04 -> 404; Reset and an unintelligible answer -> 502.
            assert_eq!(
                get(&mut c, &coap.uri("nothing"), &[]).await.status,
                StatusCode::NOT_FOUND
            );
            assert_eq!(
                get(&mut c, &coap.uri("reset"), &[]).await.status,
                StatusCode::BAD_GATEWAY
            );
            assert_eq!(
                get(&mut c, &coap.uri("weird"), &[]).await.status,
                StatusCode::BAD_GATEWAY
            );
            // Not a proxy path: 404 from the router or the proxy.
            assert_eq!(
                get(&mut c, "/elsewhere", &[]).await.status,
                StatusCode::NOT_FOUND
            );
            // Unsupported method: 501.
            let r = req(&mut c, Method::OPTIONS, &coap.uri("hello"), &[], "").await;
            assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
            c.shutdown().await;
        }
    });
}

#[test]
fn cache_honours_max_age_and_no_cache() {
    let coap = FakeCoap::start();
    let srv = start(config(&coap));
    rt().block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H1, false, &srv), addr(&srv, Proto::H1), None).unwrap();
        for _ in 0..5 {
            let r = get(&mut c, &coap.uri("hello"), &[]).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(r.body.as_ref(), b"hello");
        }
        assert_eq!(coap.hits("hello"), 1, "four of five from the cache");
        let r = get(&mut c, &coap.uri("hello"), &[]).await;
        assert_eq!(r.headers["server-timing"], "cache;desc=hit");
        // A cached response still answers a conditional request with 304.
        let r = get(&mut c, &coap.uri("hello"), &[("if-none-match", "\"0102\"")]).await;
        assert_eq!(r.status, StatusCode::NOT_MODIFIED);
        assert_eq!(coap.hits("hello"), 1);
        // no-cache goes upstream.
        get(&mut c, &coap.uri("hello"), &[("cache-control", "no-cache")]).await;
        assert_eq!(coap.hits("hello"), 2);
        // Max-Age 0 is never served from the cache.
        for _ in 0..3 {
            get(&mut c, &coap.uri("nocache"), &[]).await;
        }
        assert_eq!(coap.hits("nocache"), 3);
        assert!(srv.proxy().stats().cache_hits.load(Relaxed) >= 5);
    });
}

#[test]
fn not_an_open_relay() {
    let coap = FakeCoap::start();
    let other = FakeCoap::start();
    let srv = start(config(&coap));
    rt().block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H1, false, &srv), addr(&srv, Proto::H1), None).unwrap();
        // Another CoAP server, another port on the same host, a name: 403,
        // and nothing reaches them.
        assert_eq!(
            get(&mut c, &other.uri("hello"), &[]).await.status,
            StatusCode::FORBIDDEN
        );
        let port = coap.addr.port().wrapping_add(1).max(1);
        let r = get(&mut c, &format!("/hc/coap://127.0.0.1:{port}/hello"), &[]).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        let r = get(
            &mut c,
            &format!("/hc/coap://localhost:{}/hello", coap.addr.port()),
            &[],
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert_eq!(other.hits("hello"), 0);
        assert_eq!(srv.proxy().stats().forbidden.load(Relaxed), 3);
    });
}

#[test]
fn bearer_tokens_are_required_when_configured() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.bearer_tokens = vec!["tok-1".into()];
    let srv = start(cfg);
    rt().block_on(async {
        for proto in [Proto::H1, Proto::H3] {
            let mut c = HttpClient::new(opts(proto, false, &srv), addr(&srv, proto), None).unwrap();
            let r = get(&mut c, &coap.uri("hello"), &[]).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED);
            assert!(r.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer"));
            let r = get(
                &mut c,
                &coap.uri("hello"),
                &[("authorization", "Bearer wrong")],
            )
            .await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED);
            let r = get(
                &mut c,
                &coap.uri("hello"),
                &[("authorization", "Bearer tok-1")],
            )
            .await;
            assert_eq!(r.status, StatusCode::OK);
            c.shutdown().await;
        }
        assert_eq!(
            coap.hits("hello"),
            1,
            "refused requests never went upstream"
        );
    });
}

#[test]
fn per_client_rate_limit() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    // One token per 10 s: none comes back during the test, however slow.
    cfg.rate_per_client = 0.1;
    cfg.rate_burst = 3;
    let srv = start(cfg);
    rt().block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H1, false, &srv), addr(&srv, Proto::H1), None).unwrap();
        for _ in 0..3 {
            assert_eq!(
                get(&mut c, &coap.uri("hello"), &[]).await.status,
                StatusCode::OK
            );
        }
        let r = get(&mut c, &coap.uri("hello"), &[]).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=10).contains(&wait), "retry-after {wait}");
        assert_eq!(srv.proxy().stats().rate_limited.load(Relaxed), 1);
    });
}

#[test]
fn size_limits() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.max_body = 16;
    cfg.max_uri = 200;
    let srv = start(cfg);
    rt().block_on(async {
        for proto in [Proto::H1, Proto::H2, Proto::H3] {
            let mut c = HttpClient::new(opts(proto, false, &srv), addr(&srv, proto), None).unwrap();
            let r = req(
                &mut c,
                Method::PUT,
                &coap.uri("echo"),
                &[],
                "0123456789abcdef",
            )
            .await;
            assert_eq!(r.status, StatusCode::OK, "{proto:?}: 16 bytes are allowed");
            let r = req(
                &mut c,
                Method::PUT,
                &coap.uri("echo"),
                &[],
                "0123456789abcdefg",
            )
            .await;
            assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{proto:?}");
            let long = format!("{}?{}", coap.uri("echo"), "q".repeat(200));
            let r = get(&mut c, &long, &[]).await;
            assert_eq!(r.status, StatusCode::URI_TOO_LONG, "{proto:?}");
            c.shutdown().await;
        }
    });
}

#[test]
fn timeouts_and_overload() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.request_timeout = Duration::from_millis(700);
    cfg.max_queue_per_upstream = 1;
    let srv = start(cfg);
    rt().block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H1, false, &srv), addr(&srv, Proto::H1), None).unwrap();
        let r = get(&mut c, &coap.uri("silent"), &[]).await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
        // The silent exchange still holds the only upstream slot: 503.
        let r = get(&mut c, &coap.uri("hello"), &[("cache-control", "no-cache")]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers.contains_key("retry-after"));
        assert!(srv.proxy().stats().timeouts.load(Relaxed) >= 1);
        assert!(srv.proxy().stats().overloaded.load(Relaxed) >= 1);
    });
}

#[test]
fn reverse_mapping() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.reverse = vec![ReverseMapping::new("/dev", &format!("coap://{}/", coap.addr)).unwrap()];
    let srv = start(cfg);
    rt().block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H1, false, &srv), addr(&srv, Proto::H1), None).unwrap();
        let r = get(&mut c, "/dev/hello", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_ref(), b"hello");
        let r = req(&mut c, Method::POST, "/dev/create", &[], "").await;
        assert_eq!(r.headers["location"], "/dev/items/7");
    });
    // A reverse mapping to a host that is not allowed is a configuration error.
    let mut bad = config(&coap);
    bad.reverse = vec![ReverseMapping::new("/x", "coap://10.0.0.1/").unwrap()];
    assert!(bad.validate().is_err());
}

#[test]
fn h3_zero_rtt_only_for_safe_methods() {
    let coap = FakeCoap::start();
    let srv = start(config(&coap));
    rt().block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H3, true, &srv), addr(&srv, Proto::H3), None).unwrap();
        // First connection: full handshake, gets a session ticket.
        let r = get(&mut c, &coap.uri("hello"), &[("cache-control", "no-cache")]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(!r.early_data);
        // Returning client: GET as 0-RTT early data, served.
        let mut early_served = 0;
        for _ in 0..3 {
            let r = get(&mut c, &coap.uri("hello"), &[("cache-control", "no-cache")]).await;
            assert_eq!(r.status, StatusCode::OK);
            early_served += usize::from(r.early_data);
        }
        // (A session ticket that arrives late leaves a connection without
        // 0-RTT on a loaded machine; most must use it.)
        assert!(
            early_served >= 2,
            "0-RTT was used {early_served} of 3 times"
        );
        // A POST in early data: the server answers 425 Too Early with
        // nothing sent upstream, and the client sends it again after the
        // handshake (RFC 8470), served once (201). A POST that went after a
        // full handshake is served at once; try until one went early.
        let mut refused_early = 0;
        for _ in 0..5 {
            let before = coap.hits("create");
            let too_early_before = srv.proxy().stats().too_early.load(Relaxed);
            let r = req(&mut c, Method::POST, &coap.uri("create"), &[], "x").await;
            assert_eq!(r.status, StatusCode::CREATED);
            assert_eq!(coap.hits("create"), before + 1, "upstream exactly once");
            assert!(!r.early_data);
            if r.too_early_retried {
                let too_early = srv.proxy().stats().too_early.load(Relaxed);
                assert_eq!(too_early, too_early_before + 1);
                refused_early += 1;
                break;
            }
        }
        assert_eq!(refused_early, 1, "no POST went as early data in 5 tries");
        // On a persistent connection (after the handshake) the POST goes through.
        let mut p =
            HttpClient::new(opts(Proto::H3, false, &srv), addr(&srv, Proto::H3), None).unwrap();
        get(&mut p, &coap.uri("hello"), &[]).await;
        let r = req(&mut p, Method::POST, &coap.uri("create"), &[], "x").await;
        assert_eq!(r.status, StatusCode::CREATED);
        let st = srv.proxy().stats();
        assert!(st.early_data_served.load(Relaxed) >= 2);
        assert!(st.too_early.load(Relaxed) >= 1);
        c.shutdown().await;
        p.shutdown().await;
    });
}

#[test]
fn h3_mutual_tls() {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let coap = FakeCoap::start();
    let dir = std::env::temp_dir().join(format!("mintgate-mtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let client_key = KeyPair::generate().unwrap();
    let mut cp = CertificateParams::new(vec!["client-1".to_owned()]).unwrap();
    cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = cp.signed_by(&client_key, &issuer).unwrap();

    let mut cfg = config(&coap);
    cfg.tls.client_ca = Some(dir.join("ca.pem"));
    let srv = start(cfg);
    rt().block_on(async {
        let mut o = opts(Proto::H3, false, &srv);
        o.timeout = Duration::from_secs(3);
        let mut anon = HttpClient::new(o.clone(), addr(&srv, Proto::H3), None).unwrap();
        let mut h = HeaderMap::new();
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        let r = anon
            .request(Method::GET, &coap.uri("hello"), &h, Bytes::new())
            .await;
        assert!(
            r.is_err(),
            "a client without a certificate must be refused: {r:?}"
        );
        o.client_cert = Some((
            vec![client_cert.der().clone()],
            Arc::new(
                rustls::pki_types::PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
            ),
        ));
        let mut ok = HttpClient::new(o, addr(&srv, Proto::H3), None).unwrap();
        let r = ok
            .request(Method::GET, &coap.uri("hello"), &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
        ok.shutdown().await;
    });
    assert_eq!(coap.hits("hello"), 1);
}

#[test]
fn self_signed_certificate_is_generated_once() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    let dir = std::env::temp_dir().join(format!("mintgate-selfsigned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    cfg.tls.self_signed_dir = dir.clone();
    let first = start(cfg.clone());
    let (p, generated) = first.cert().unwrap();
    assert!(generated);
    assert_eq!(p, dir.join("cert.pem"));
    let meta = std::fs::metadata(dir.join("key.pem")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let pem1 = std::fs::read(dir.join("cert.pem")).unwrap();
    drop(first);
    let second = start(cfg);
    assert!(!second.cert().unwrap().1);
    assert_eq!(std::fs::read(dir.join("cert.pem")).unwrap(), pem1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connection_limit_and_header_timeout() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.max_connections = 2;
    cfg.header_timeout = Duration::from_millis(300);
    let srv = start(cfg);
    let addr = srv.http_addr().unwrap();
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(50));
    // A third connection is closed at once: reading gives end of stream.
    let mut third = TcpStream::connect(addr).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let _ = third.write_all(b"GET /hc/ HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut b = [0u8; 64];
    assert!(
        matches!(third.read(&mut b), Ok(0) | Err(_)),
        "over the limit: closed"
    );
    // The idle ones never sent a request head: closed after the timeout.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = std::time::Instant::now();
        let r = s.read(&mut b);
        assert!(
            matches!(r, Ok(0))
                || matches!(r, Ok(n) if b[..n].starts_with(b"HTTP/1.1 408"))
                || r.is_err(),
            "{r:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "closed by the header timeout"
        );
    }
    // A keep-alive connection that goes quiet after a request is closed
    // too (hyper's header timer covers the wait for the next head).
    std::thread::sleep(Duration::from_millis(100));
    let mut ka = TcpStream::connect(addr).unwrap();
    ka.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!("GET {} HTTP/1.1\r\nhost: x\r\n\r\n", coap.uri("hello"));
    ka.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let t0 = std::time::Instant::now();
    loop {
        match ka.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
        }
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "idle keep-alive connection closed"
    );
    // With the slots free again, a request is served.
    std::thread::sleep(Duration::from_millis(100));
    let mut ok = TcpStream::connect(addr).unwrap();
    ok.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "GET {} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        coap.uri("hello")
    );
    ok.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    ok.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8
/// is all loopback on Linux: another address is another source).
fn connect_from(from: &str, to: SocketAddr) -> std::net::TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&format!("{from}:0").parse::<SocketAddr>().unwrap().into())
        .unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// Reads until the server closes (or 5 s pass); the bytes and the time.
fn read_until_closed(s: &mut std::net::TcpStream) -> (Vec<u8>, Duration) {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = std::time::Instant::now();
    let mut got = Vec::new();
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("not closed within 5 s: {e}"),
        }
    }
    (got, t0.elapsed())
}

#[test]
fn stalled_clients_of_one_source_leave_others_served() {
    use std::io::Write;
    use std::sync::atomic::Ordering::Relaxed;
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    // fewer slots in all than the one source opens: without the cap per
    // source, the other client would find none
    cfg.max_connections = 32;
    cfg.max_connections_per_source = 8;
    cfg.header_timeout = Duration::from_millis(700);
    cfg.idle_timeout = Duration::from_millis(900);
    let srv = start(cfg);
    let addr = srv.http_addr().unwrap();
    // 40 connections from 127.0.0.1, each half a request line, stalled
    let stalled: Vec<std::net::TcpStream> = (0..40)
        .map(|_| {
            let mut s = connect_from("127.0.0.1", addr);
            let _ = s.write_all(b"GET /hc/coap://12");
            s
        })
        .collect();
    // a client of another source is answered at once
    let t0 = std::time::Instant::now();
    let mut other = connect_from("127.0.0.2", addr);
    let req = format!(
        "GET {} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        coap.uri("hello")
    );
    other.write_all(req.as_bytes()).unwrap();
    let (got, _) = read_until_closed(&mut other);
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    let st = srv.conn_stats();
    assert_eq!(st.refused_per_source.load(Relaxed), 32, "8 of 40 admitted");
    assert_eq!(st.refused_total.load(Relaxed), 0);
    // the admitted stalled ones are cut after the header timeout
    let mut closed = 0;
    for mut s in stalled {
        let (_, t) = read_until_closed(&mut s);
        assert!(t < Duration::from_secs(3), "{t:?}");
        closed += 1;
    }
    assert_eq!(closed, 40);

    // a slow head, trickled a byte every 100 ms, is cut after the header
    // timeout although bytes keep coming
    let mut slow = connect_from("127.0.0.3", addr);
    slow.write_all(b"GET /hc/x HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .unwrap();
    slow.set_nonblocking(false).unwrap();
    let t0 = std::time::Instant::now();
    let mut cut = None;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        if slow.write_all(b"a").is_err() {
            cut = Some(t0.elapsed());
            break;
        }
    }
    let cut = cut.unwrap_or_else(|| read_until_closed(&mut slow).1 + t0.elapsed());
    assert!(
        cut >= Duration::from_millis(500) && cut < Duration::from_secs(3),
        "cut after {cut:?}"
    );

    // half an HTTP/2 preface, stalled: closed after the header timeout
    // (by the listener's watchdog: hyper has no timer there)
    let before = st.header_timeouts.load(Relaxed);
    let mut h2 = connect_from("127.0.0.4", addr);
    h2.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
    let (_, t) = read_until_closed(&mut h2);
    assert!(
        t >= Duration::from_millis(500) && t < Duration::from_secs(3),
        "{t:?}"
    );
    // a whole preface and settings but no request: closed too
    let mut h2 = connect_from("127.0.0.4", addr);
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let (_, t) = read_until_closed(&mut h2);
    assert!(
        t >= Duration::from_millis(500) && t < Duration::from_secs(3),
        "{t:?}"
    );
    assert_eq!(st.header_timeouts.load(Relaxed) - before, 2);
    assert_eq!(st.open.load(Relaxed), 0);
}

#[test]
fn an_idle_http2_connection_is_closed() {
    use std::sync::atomic::Ordering::Relaxed;
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.idle_timeout = Duration::from_millis(600);
    let srv = start(cfg);
    let rt = rt();
    rt.block_on(async {
        let mut c =
            HttpClient::new(opts(Proto::H2, false, &srv), addr(&srv, Proto::H2), None).unwrap();
        let e = get(&mut c, &coap.uri("hello"), &[]).await;
        assert_eq!(e.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(2500)).await;
    });
    let st = srv.conn_stats();
    assert_eq!(st.idle_closed.load(Relaxed), 1, "{st:?}");
    assert_eq!(st.open.load(Relaxed), 0);
}

#[test]
fn cross_site_browser_writes_are_refused() {
    let coap = FakeCoap::start();
    let srv = start(config(&coap));
    let a = srv.http_addr().unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = HttpClient::new(opts(Proto::H1, false, &srv), a, None).unwrap();
        let target = coap.uri("echo");
        let own = format!("http://{a}");
        let cases: [(&[(&str, &str)], bool); 5] = [
            (&[("origin", "http://evil.example")], false),
            (&[("sec-fetch-site", "cross-site")], false),
            (&[("origin", "null")], false),
            (
                &[("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
                true,
            ),
            (&[], true),
        ];
        for (headers, passes) in cases {
            let e = req(&mut c, Method::POST, &target, headers, "x").await;
            if passes {
                assert!(e.status.is_success(), "{headers:?}: {:?}", e.status);
            } else {
                assert_eq!(e.status, StatusCode::FORBIDDEN, "{headers:?}");
                assert!(
                    String::from_utf8_lossy(&e.body).contains("refused"),
                    "{:?}",
                    e.body
                );
            }
        }
        // reads are not concerned
        let e = get(
            &mut c,
            &coap.uri("hello"),
            &[("origin", "http://evil.example")],
        )
        .await;
        assert_eq!(e.status, StatusCode::OK);
    });
}

/// `WriteAuth::LoopbackOnly` (the gateway's `access.write` not chosen):
/// writes from loopback clients pass, over a real socket (HTTP/1.1 and
/// HTTP/3); the same write from a client elsewhere is refused 403 with the
/// configured text and counted, and reads from it are served. (No source
/// off loopback exists here, so that client is given to `Proxy::handle`.)
#[test]
fn loopback_only_writes_refuse_other_clients() {
    let coap = FakeCoap::start();
    let mut cfg = config(&coap);
    cfg.write_auth = mintgate_proxy::WriteAuth::LoopbackOnly {
        why: "choose access.write".into(),
    };
    let srv = start(cfg);
    let rt = rt();
    rt.block_on(async {
        for proto in [Proto::H1, Proto::H3] {
            let mut c = HttpClient::new(opts(proto, false, &srv), addr(&srv, proto), None).unwrap();
            let e = req(&mut c, Method::POST, &coap.uri("echo"), &[], "x").await;
            assert!(e.status.is_success(), "{proto:?}: {:?}", e.status);
        }
        let p = srv.proxy();
        let uri: http::Uri = coap.uri("echo").parse().unwrap();
        let far = mintgate_proxy::ClientInfo {
            addr: "192.0.2.7".parse().unwrap(),
            early_data: false,
        };
        for m in [Method::PUT, Method::POST, Method::DELETE] {
            let r = p
                .handle(far, &m, &uri, &HeaderMap::new(), Bytes::from_static(b"x"))
                .await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{m}");
            assert!(
                String::from_utf8_lossy(r.body()).contains("choose access.write"),
                "{:?}",
                r.body()
            );
        }
        let r = p
            .handle(far, &Method::GET, &uri, &HeaderMap::new(), Bytes::new())
            .await;
        assert!(r.status().is_success(), "{:?}", r.status());
        assert_eq!(p.stats().write_mode_unset.load(Relaxed), 3);
        assert_eq!(p.stats().write_refused.load(Relaxed), 3);
        assert_eq!(p.stats().unauthorized.load(Relaxed), 0);
    });
}
