//! `mintgate http URL`: HTTP/1.1, HTTP/2 (prior knowledge) or HTTP/3
//! requests, for trying the proxy and for measuring it. Prints the first
//! response (status line, headers, body) on stdout and the timing of every
//! request on stderr; with `--count N`, a summary.

use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use mintgate_proxy::bytes::Bytes;
use mintgate_proxy::client::{ClientOptions, Exchange, HttpClient, Proto};
use mintgate_proxy::http::{HeaderMap, HeaderName, HeaderValue, Method};
use mintgate_proxy::tls::Roots;

/// Where `mintgate serve --h3` keeps its self-signed certificate by default.
const DEFAULT_CERT: &str = "mintgate-tls/cert.pem";

/// Arguments of `mintgate http`.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  mintgate http http://127.0.0.1:8080/hc/coap://127.0.0.1:5683/request
  mintgate http --h2 http://127.0.0.1:8080/hc/coap://127.0.0.1:5683/request
  mintgate http --h3 --new-conn --count 10 https://localhost:8443/hc/coap://127.0.0.1:5683/request
  mintgate http --oscore client.toml http://127.0.0.1:8080/hc/coap://127.0.0.1:5683/request

Exit status: 0 for 1xx-3xx, 3 for 4xx, 4 for 5xx (of the last response),
1 for other errors, 2 for usage errors.")]
pub struct HttpArgs {
    /// http://HOST:PORT/PATH (HTTP/1.1 or HTTP/2) or https://HOST:PORT/PATH
    /// (HTTP/3); the path is sent as written.
    #[arg(value_name = "URL")]
    url: String,
    /// HTTP/1.1 over TCP (the default for http://).
    #[arg(long, group = "proto")]
    h1: bool,
    /// HTTP/2 over TCP with prior knowledge (cleartext).
    #[arg(long, group = "proto")]
    h2: bool,
    /// HTTP/3 over QUIC (the default for https://).
    #[arg(long, group = "proto")]
    h3: bool,
    /// A new connection for every request (HTTP/3: 0-RTT after the first).
    #[arg(long)]
    new_conn: bool,
    /// Requests to send, one after the other.
    #[arg(long, short = 'n', default_value_t = 1)]
    count: u32,
    /// HTTP method: GET, HEAD, PUT, POST, DELETE, ... (the proxy maps
    /// each to its CoAP method).
    #[arg(long, short = 'X', default_value = "GET")]
    method: String,
    /// Request body, as given, with no Content-Type unless -H gives one
    /// (the proxy answers 415 to a type that has no CoAP Content-Format;
    /// `text/plain` and `application/json` have one).
    #[arg(long, short = 'd', value_name = "DATA")]
    data: Option<String>,
    /// Extra header "Name: value" (repeatable).
    #[arg(long, short = 'H', value_name = "HEADER")]
    header: Vec<String>,
    // Like get's --access-token and --access-token-file (client.rs).
    /// Bearer token (sent as Authorization: Bearer TOKEN); also read from
    /// MINTGATE_HTTP_TOKEN, which does not show in `ps`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "MINTGATE_HTTP_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// File holding the bearer token (one line); replaces --token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// HTTP/3: PEM certificate(s) to trust [default: mintgate-tls/cert.pem when present].
    #[arg(long, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// HTTP/3: do not check the server's certificate.
    #[arg(long, short = 'k')]
    insecure: bool,
    /// HTTP/3: client certificate (PEM) for mutual TLS; with --key.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// HTTP/3: client private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Time allowed per request (connecting included), e.g. 10s.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: Duration,
    /// Do not print the body.
    #[arg(long, short = 's')]
    silent: bool,
    /// Protect the request with OSCORE (RFC 8613) end to end, through the
    /// proxy, as its section 11 carries OSCORE over HTTP: the request
    /// (method, path and query of the `/hc/coap://...` URL, Content-Type,
    /// Accept, body) is mapped to CoAP and protected with this context file
    /// (as `mintgate get --oscore` takes it), sent as a POST with the
    /// `OSCORE` header field and an `application/oscore` body to the
    /// target's authority, and the answer verified and printed as the
    /// CoAP server gave it. The proxy holds no key.
    #[arg(long, value_name = "CONTEXT-FILE")]
    oscore: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    mintgate_gateway::config::parse_duration(s)
}

/// `scheme://host[:port]/path` split without normalising the path.
fn split_url(url: &str) -> anyhow::Result<(String, String, u16, String)> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow!("`{url}` is not an http:// or https:// URL"))?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => bail!("scheme `{scheme}`: use http:// or https://"),
    };
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(r) = auth.strip_prefix('[') {
        let end = r
            .find(']')
            .ok_or_else(|| anyhow!("unclosed [ in `{auth}`"))?;
        let port = match r[end + 1..].strip_prefix(':') {
            Some(p) => p.parse().context("bad port")?,
            None => default_port,
        };
        (r[..end].to_owned(), port)
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().context("bad port")?),
            None => (auth.to_owned(), default_port),
        }
    };
    if host.is_empty() {
        bail!("no host in `{url}`");
    }
    Ok((scheme, host, port, path.to_owned()))
}

/// Runs `mintgate http`.
pub fn run(a: HttpArgs) -> anyhow::Result<ExitCode> {
    let (scheme, host, port, path) = split_url(&a.url)?;
    let proto = if a.h1 {
        Proto::H1
    } else if a.h2 {
        Proto::H2
    } else if a.h3 || scheme == "https" {
        Proto::H3
    } else {
        Proto::H1
    };
    let addr: SocketAddr = (host.as_str(), port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .ok_or_else(|| anyhow!("{host} has no address"))?;
    let method = Method::from_bytes(a.method.as_bytes()).context("bad method")?;
    let mut headers = HeaderMap::new();
    for h in &a.header {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| anyhow!("header `{h}` is not `Name: value`"))?;
        headers.append(
            HeaderName::from_bytes(k.trim().as_bytes()).context("bad header name")?,
            HeaderValue::from_str(v.trim()).context("bad header value")?,
        );
    }
    let token = match &a.token_file {
        Some(f) => Some(crate::secret_from_file(f, "--token-file")?),
        None => a.token.clone().filter(|t| !t.is_empty()),
    };
    if let Some(t) = &token {
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {t}")).context("bad token")?,
        );
    }
    let roots = if proto != Proto::H3 || a.insecure {
        Roots::Insecure
    } else {
        let file = match &a.cacert {
            Some(f) => f.clone(),
            None if std::path::Path::new(DEFAULT_CERT).exists() => PathBuf::from(DEFAULT_CERT),
            None => bail!(
                "HTTP/3 needs the server's certificate: pass --cacert FILE (mintgate serve \
                 --h3 prints its path) or --insecure"
            ),
        };
        Roots::Certs(mintgate_proxy::tls::load_certs(&file)?)
    };
    let client_cert = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => Some((
            mintgate_proxy::tls::load_certs(c)?,
            Arc::new(mintgate_proxy::tls::load_key(k)?),
        )),
        _ => None,
    };
    let opts = ClientOptions {
        proto,
        new_conn: a.new_conn,
        roots,
        server_name: host.clone(),
        client_cert,
        timeout: a.timeout,
    };
    let body = Bytes::from(a.data.clone().unwrap_or_default());
    let rt = mintgate_proxy::tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?;
    let count = a.count.max(1);
    let mut oscore = match &a.oscore {
        Some(f) => Some(Protected::new(f, &method, &headers, &path, &body)?),
        None => None,
    };
    let results: Vec<Exchange> = rt.block_on(async {
        let mut c = HttpClient::new(opts, addr, None)?;
        let mut out = Vec::new();
        for i in 0..count {
            let r = match oscore.as_mut() {
                Some(p) => p.exchange(&mut c, &headers).await,
                None => {
                    c.request(method.clone(), &path, &headers, body.clone())
                        .await
                }
            }
            .with_context(|| format!("request {} to {addr} ({})", i + 1, proto.name()))?;
            if i == 0 {
                print_response(&r, proto, a.silent)?;
            }
            print_timing(i + 1, &r);
            out.push(r);
        }
        c.shutdown().await;
        anyhow::Ok(out)
    })?;
    if results.len() > 1 {
        print_summary(&results);
    }
    let last = results.last().map(|r| r.status.as_u16()).unwrap_or(0);
    Ok(ExitCode::from(match last {
        100..=399 => 0,
        400..=499 => 3,
        500..=599 => 4,
        _ => 1,
    }))
}

/// An OSCORE-protected request (RFC 8613 section 11): the inner CoAP
/// request mapped from the HTTP one, and the context that protects it.
struct Protected {
    ctx: mintgate_coap::oscore::Context,
    inner: mintgate_coap::client::Request,
    target: mintgate_proxy::mapping::CoapTarget,
    /// Where the protected POST goes: the target's authority only (its path
    /// and query travel inside).
    outer_path: String,
}

impl Protected {
    fn new(
        file: &std::path::Path,
        method: &Method,
        headers: &HeaderMap,
        path: &str,
        body: &Bytes,
    ) -> anyhow::Result<Protected> {
        use mintgate_proxy::mapping::{map_request, resolve_target, HC_PREFIX};
        let target = match resolve_target(path, &[]) {
            Ok(Some((t, _))) => t,
            Ok(None) => {
                bail!("--oscore: the URL's path must be {HC_PREFIX}coap://HOST[:PORT]/PATH")
            }
            Err(e) => bail!("--oscore: {}", e.message),
        };
        // the request as the proxy would map it, then protected whole
        let mut plain = headers.clone();
        plain.remove("authorization");
        let (req, _) = map_request(method, &plain, &target, body).map_err(|e| {
            anyhow!(
                "--oscore: the request has no CoAP mapping: {} {}",
                e.status,
                e.message
            )
        })?;
        let ctx = crate::client::oscore_context(file, mintgate_gateway::oscore::DEFAULT_SEQ_STEP)?;
        let outer_path = format!("{HC_PREFIX}coap://{}/", target.authority);
        Ok(Protected {
            ctx,
            inner: mintgate_coap::client::Request {
                confirmable: true,
                code: req.code,
                options: req.options,
                payload: req.payload,
            },
            target,
            outer_path,
        })
    }

    /// Sends the request protected and verifies the answer: the exchange
    /// with the verified inner answer mapped to HTTP. A 4.01 with Echo (a
    /// server that restarted, RFC 8613 B.1.2) is answered by sending the
    /// request again once with the Echo. An unprotected answer (a refusal
    /// by the proxy or the server) is returned as it is, with a word on
    /// stderr.
    async fn exchange(
        &mut self,
        c: &mut HttpClient,
        headers: &HeaderMap,
    ) -> anyhow::Result<Exchange> {
        use mintgate_coap::oscore::{client, OSCORE};
        use mintgate_coap::wire::{Code, OptionNumber};
        use mintgate_proxy::mapping as m;
        let mut request = self.inner.clone();
        for attempt in 0..2 {
            let (outer, id) =
                client::protect(&mut self.ctx, &request).map_err(|e| anyhow!("OSCORE: {e}"))?;
            let option = outer
                .options
                .iter()
                .find(|(n, _)| *n == OSCORE)
                .map(|(_, v)| v.as_slice())
                .unwrap_or_default();
            let mut h = HeaderMap::new();
            if let Some(auth) = headers.get("authorization") {
                h.insert("authorization", auth.clone());
            }
            h.insert(m::OSCORE_HEADER, m::header_from_option(option));
            h.insert(
                "content-type",
                HeaderValue::from_static(m::APPLICATION_OSCORE),
            );
            let verb = if outer.code == Code::FETCH {
                Method::from_bytes(b"FETCH").context("FETCH")?
            } else {
                Method::POST
            };
            let r = c
                .request(verb, &self.outer_path, &h, Bytes::from(outer.payload))
                .await?;
            let Some(v) = r.headers.get(m::OSCORE_HEADER) else {
                eprintln!(
                    "mintgate: the answer ({}) is not OSCORE-protected: the proxy or the server \
                     refused the request",
                    r.status
                );
                return Ok(r);
            };
            let value = m::option_from_header(v.as_bytes())
                .map_err(|e| anyhow!("the answer's OSCORE header field: {}", e.message))?;
            // the outer code is not protected (RFC 8613 4.2): any will do
            let (code, options, payload) = client::unprotect(
                &self.ctx,
                Code::CHANGED,
                &[(OSCORE, &value[..])],
                &r.body,
                &id,
            )
            .map_err(|e| anyhow!("OSCORE: the answer does not verify: {e}"))?;
            let echo = options
                .iter()
                .find(|(n, _)| *n == OptionNumber::ECHO)
                .map(|(_, v)| v.clone());
            if let (Some(e), true) = (echo, code == Code::UNAUTHORIZED && attempt == 0) {
                request.options.retain(|(n, _)| *n != OptionNumber::ECHO);
                request.options.push((OptionNumber::ECHO, e));
                continue;
            }
            eprintln!(
                "mintgate: OSCORE answer verified (outer {}, {} bytes)",
                r.status,
                r.body.len()
            );
            let inner = m::CoapResponse {
                code,
                options: options
                    .into_iter()
                    .map(|(n, v)| (n, Bytes::from(v)))
                    .collect(),
                payload: Bytes::from(payload),
            };
            let info = m::RequestInfo::default();
            let mapped = m::map_response(
                inner,
                &m::ResponseContext {
                    authority: &self.target.authority,
                    mapping: None,
                    info: &info,
                    age: 0,
                },
            )
            .map_err(|e| anyhow!("the verified answer: {}", e.message))?;
            let (parts, body) = mapped.into_parts();
            return Ok(Exchange {
                status: parts.status,
                headers: parts.headers,
                body,
                ..r
            });
        }
        bail!("OSCORE: the server asked for Echo twice")
    }
}

fn print_response(r: &Exchange, proto: Proto, silent: bool) -> anyhow::Result<()> {
    let version = match proto {
        Proto::H1 => "HTTP/1.1",
        Proto::H2 => "HTTP/2",
        Proto::H3 => "HTTP/3",
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{version} {}", r.status)?;
    for (k, v) in &r.headers {
        writeln!(out, "{k}: {}", String::from_utf8_lossy(v.as_bytes()))?;
    }
    writeln!(out)?;
    if !silent {
        out.write_all(&r.body)?;
        if !r.body.ends_with(b"\n") && !r.body.is_empty() {
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_timing(i: u32, r: &Exchange) {
    let coap = r
        .coap_rtt()
        .map(|c| {
            format!(
                " coap {:.3} ms, proxy+http {:.3} ms,",
                ms(c),
                ms(r.total.saturating_sub(c))
            )
        })
        .unwrap_or_default();
    eprintln!(
        "#{i}: {} total {:.3} ms,{coap} connect {:.3} ms{}{}",
        r.status.as_u16(),
        ms(r.total),
        ms(r.connect),
        if r.new_connection {
            ", new connection"
        } else {
            ""
        },
        match (r.early_data, r.too_early_retried) {
            (true, _) => ", 0-RTT",
            (false, true) => ", 425 Too Early to 0-RTT, sent again after the handshake",
            _ => "",
        },
    );
}

fn print_summary(rs: &[Exchange]) {
    let mut t: Vec<f64> = rs.iter().map(|r| ms(r.total)).collect();
    t.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
    let mean = t.iter().sum::<f64>() / t.len() as f64;
    let early = rs.iter().filter(|r| r.early_data).count();
    eprintln!(
        "{} requests: min {:.3} ms, median {:.3} ms, mean {:.3} ms, p99 {:.3} ms, max {:.3} ms; {} new connections, {} as 0-RTT",
        rs.len(),
        t[0],
        pct(0.5),
        mean,
        pct(0.99),
        t[t.len() - 1],
        rs.iter().filter(|r| r.new_connection).count(),
        early
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_without_normalising() {
        let (s, h, p, path) =
            split_url("http://127.0.0.1:8080/hc/coap://127.0.0.1:5683/request").unwrap();
        assert_eq!((s.as_str(), h.as_str(), p), ("http", "127.0.0.1", 8080));
        assert_eq!(path, "/hc/coap://127.0.0.1:5683/request");
        let (s, h, p, path) = split_url("https://[::1]/x?y").unwrap();
        assert_eq!(
            (s.as_str(), h.as_str(), p, path.as_str()),
            ("https", "::1", 443, "/x?y")
        );
        let (_, h, p, path) = split_url("http://localhost").unwrap();
        assert_eq!((h.as_str(), p, path.as_str()), ("localhost", 80, "/"));
        assert!(split_url("ftp://x/").is_err());
        assert!(split_url("127.0.0.1:80/").is_err());
        assert!(split_url("http://:80/").is_err());
    }
}
