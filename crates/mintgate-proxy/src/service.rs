//! The proxy itself, shared by the HTTP/1.1, HTTP/2 and HTTP/3 front ends:
//! [`Proxy::handle`] takes a request whose body has been read (within the
//! size limit) and returns the response.
//!
//! Order of the checks, each with its status:
//! 1. per-client rate limit (429 with Retry-After);
//! 2. bearer token when tokens are configured (401 with a challenge), and
//!    for writes (methods other than GET, HEAD, OPTIONS): a browser's
//!    cross-site request is refused ([`cross_site`]; 403), so is one whose
//!    `Host` is not a name of the proxy (DNS rebinding; 403), then the write
//!    policy ([`WriteAuth`]; 401, or 403 for a client not on loopback while
//!    the gateway's owner has chosen none);
//! 3. target length (414), target form (`/hc/...` or a reverse prefix; 404
//!    when neither, 400/501 when malformed);
//! 4. the upstream must be allowed (403);
//! 5. early data (TLS 0-RTT) may only carry safe methods (425);
//! 6. the mapping (415, 412, 501 ...), then the cache, then upstream:
//!    overloaded 503, no answer 504, Reset or an unintelligible answer 502,
//!    the whole request bounded by `request_timeout` (504).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri};
use mintgate_coap::wire::{Code, OptionNumber};

use crate::cache::{self, Cache, Lookup};
use crate::config::ProxyConfig;
use crate::config::WriteAuth;
use crate::limits::{bearer_ok, bearer_token, cross_site, token_in, RateLimiter};
use crate::mapping::{
    map_request, map_response, resolve_target, safe_for_early_data, Authority, ProxyError,
    ResponseContext, Via,
};
use crate::upstream::{Upstream, UpstreamError};

/// Who sent a request, as far as the front end knows.
#[derive(Clone, Copy, Debug)]
pub struct ClientInfo {
    /// The peer's IP address (rate limits are per address).
    pub addr: IpAddr,
    /// The request arrived as TLS early data (0-RTT), before the handshake
    /// completed.
    pub early_data: bool,
}

/// Counters of the proxy, all front ends together.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Requests handled.
    pub requests: AtomicU64,
    /// Answered from the cache.
    pub cache_hits: AtomicU64,
    /// Refused: rate limit.
    pub rate_limited: AtomicU64,
    /// Refused: authentication.
    pub unauthorized: AtomicU64,
    /// Writes refused by the write policy (401, and 403 while no policy is
    /// chosen).
    pub write_refused: AtomicU64,
    /// Of those, writes from clients not on loopback while no write policy
    /// is chosen ([`WriteAuth::LoopbackOnly`], 403).
    pub write_mode_unset: AtomicU64,
    /// Refused: a browser's cross-site write (Origin, Sec-Fetch-Site).
    pub cross_site: AtomicU64,
    /// Refused: a write whose `Host` is not one of the proxy's names (DNS
    /// rebinding; `allowed_hosts`).
    pub bad_host: AtomicU64,
    /// Refused: upstream not allowed.
    pub forbidden: AtomicU64,
    /// Refused: unsafe method in early data.
    pub too_early: AtomicU64,
    /// Requests that arrived as early data and were served.
    pub early_data_served: AtomicU64,
    /// OSCORE messages forwarded (RFC 8613 section 11).
    pub oscore: AtomicU64,
    /// 504s.
    pub timeouts: AtomicU64,
    /// 502s.
    pub bad_gateway: AtomicU64,
    /// 503s.
    pub overloaded: AtomicU64,
}

/// The proxy: configuration, upstream client, cache, limiter, counters.
pub struct Proxy {
    cfg: ProxyConfig,
    upstream: Upstream,
    cache: Mutex<Cache>,
    limiter: RateLimiter,
    stats: ProxyStats,
}

impl Proxy {
    /// A proxy sending upstream through `upstream`.
    pub fn new(cfg: ProxyConfig, upstream: Upstream) -> Arc<Proxy> {
        Arc::new(Proxy {
            cache: Mutex::new(Cache::new(cfg.cache_entries, cfg.cache_max_payload)),
            limiter: RateLimiter::new(cfg.rate_per_client, cfg.rate_burst),
            cfg,
            upstream,
            stats: ProxyStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }

    /// The upstream client.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Whether `path_and_query` is one the proxy serves (under `/hc/` or a
    /// reverse prefix).
    pub fn serves(&self, path: &str) -> bool {
        path.starts_with(crate::mapping::HC_PREFIX)
            || self.cfg.reverse.iter().any(|m| {
                path == m.prefix
                    || (path.starts_with(&m.prefix)
                        && path.as_bytes().get(m.prefix.len()) == Some(&b'/'))
            })
    }

    /// Handles one request. Never fails: errors become their HTTP answer.
    pub async fn handle(
        &self,
        client: ClientInfo,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response<Bytes> {
        self.stats.requests.fetch_add(1, Relaxed);
        let r = match tokio::time::timeout(
            self.cfg.request_timeout,
            self.handle_inner(client, method, uri, headers, body),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(ProxyError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "no CoAP response within {} ms",
                    self.cfg.request_timeout.as_millis()
                ),
            )),
        };
        match r {
            Ok(resp) => resp,
            Err(e) => {
                let counter = match e.status {
                    StatusCode::GATEWAY_TIMEOUT => Some(&self.stats.timeouts),
                    StatusCode::BAD_GATEWAY => Some(&self.stats.bad_gateway),
                    StatusCode::SERVICE_UNAVAILABLE => Some(&self.stats.overloaded),
                    _ => None,
                };
                if let Some(c) = counter {
                    c.fetch_add(1, Relaxed);
                }
                e.to_response()
            }
        }
    }

    // handle's arguments, passed on: handle bounds this with the timeout and
    // counts its errors.
    async fn handle_inner(
        &self,
        client: ClientInfo,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Bytes>, ProxyError> {
        if let Err(wait) = self.limiter.check(client.addr, Instant::now()) {
            self.stats.rate_limited.fetch_add(1, Relaxed);
            let secs = wait.as_secs_f64().ceil().max(1.0) as u32;
            return Err(ProxyError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate limit exceeded for this client",
            )
            .retry_after(secs));
        }
        let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
        let write_token = match &self.cfg.write_auth {
            WriteAuth::Bearer { tokens, .. } => {
                bearer_token(authorization).filter(|t| token_in(tokens, t))
            }
            _ => None,
        };
        if write_token.is_none() && !bearer_ok(&self.cfg.bearer_tokens, authorization) {
            self.stats.unauthorized.fetch_add(1, Relaxed);
            return Err(ProxyError::new(
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is required",
            ));
        }
        // writes: no cross-site browser request, then the [access] policy
        // (safe methods pass)
        if !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            let own = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| uri.authority().map(|a| a.as_str()));
            if let Some(why) = cross_site(
                headers.get("sec-fetch-site").map(|v| v.as_bytes()),
                headers.get(header::ORIGIN).map(|v| v.as_bytes()),
                own,
            ) {
                self.stats.cross_site.fetch_add(1, Relaxed);
                return Err(ProxyError::new(StatusCode::FORBIDDEN, why));
            }
            if !mintgate_coap::uri::host_allowed(own, &self.cfg.allowed_hosts) {
                self.stats.bad_host.fetch_add(1, Relaxed);
                return Err(ProxyError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "a write for the host {:?} is refused: not a name of this proxy \
                         (proxy.allowed_hosts)",
                        own.unwrap_or_default()
                    ),
                ));
            }
            // An OSCORE message (RFC 8613 section 11) is verified and
            // authorised by the CoAP server that holds its key; the proxy
            // cannot even tell a read from a write inside it, so its own
            // write policy stays out of the way.
            let write_auth = if crate::mapping::is_oscore(headers) {
                &WriteAuth::Open
            } else {
                &self.cfg.write_auth
            };
            if let WriteAuth::LoopbackOnly { why } = write_auth {
                if !client.addr.to_canonical().is_loopback() {
                    self.stats.write_refused.fetch_add(1, Relaxed);
                    self.stats.write_mode_unset.fetch_add(1, Relaxed);
                    return Err(ProxyError::new(StatusCode::FORBIDDEN, why.clone()));
                }
            }
            let refused = match write_auth {
                WriteAuth::Open | WriteAuth::LoopbackOnly { .. } => None,
                WriteAuth::Bearer { .. } if write_token.is_some() => None,
                WriteAuth::Bearer { .. } => Some("writes need a valid bearer token"),
                WriteAuth::Refuse => Some(
                    "writes need a DTLS identity or OSCORE (access.write): over HTTP only an \
                     OSCORE-protected request carries one (RFC 8613 section 11; mintgate http \
                     --oscore)",
                ),
            };
            if let Some(why) = refused {
                self.stats.unauthorized.fetch_add(1, Relaxed);
                self.stats.write_refused.fetch_add(1, Relaxed);
                return Err(ProxyError::new(StatusCode::UNAUTHORIZED, why));
            }
        }
        let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        if pq.len() > self.cfg.max_uri {
            return Err(ProxyError::new(
                StatusCode::URI_TOO_LONG,
                format!("the request target is over {} bytes", self.cfg.max_uri),
            ));
        }
        let (target, via) = resolve_target(pq, &self.cfg.reverse)?.ok_or_else(|| {
            ProxyError::new(
                StatusCode::NOT_FOUND,
                "not a proxy path: use /hc/coap://host[:port]/path or a configured prefix",
            )
        })?;
        let authority = target.authority();
        if !self.cfg.allow.contains(&authority) {
            self.stats.forbidden.fetch_add(1, Relaxed);
            return Err(ProxyError::new(
                StatusCode::FORBIDDEN,
                format!("the CoAP server {authority} is not allowed by this proxy"),
            ));
        }
        if client.early_data {
            if !safe_for_early_data(method) {
                self.stats.too_early.fetch_add(1, Relaxed);
                return Err(ProxyError::new(
                    StatusCode::from_u16(425).unwrap_or(StatusCode::BAD_REQUEST),
                    format!("{method} is not accepted in early data; retry after the handshake"),
                ));
            }
            self.stats.early_data_served.fetch_add(1, Relaxed);
        }
        if body.len() > self.cfg.max_body {
            return Err(ProxyError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {} bytes", self.cfg.max_body),
            ));
        }
        let (mut req, info) = map_request(method, headers, &target, &body)?;
        if crate::mapping::is_oscore(headers) {
            self.stats.oscore.fetch_add(1, Relaxed);
        }
        if let (Some(t), WriteAuth::Bearer { forward_to, .. }) = (write_token, &self.cfg.write_auth)
        {
            if forward_to.contains(&authority) {
                req.options
                    .push((OptionNumber::ACCESS_TOKEN, t.as_bytes().to_vec()));
            }
        }
        let mapping = match via {
            Via::Reverse(i) => self.cfg.reverse.get(i),
            Via::Default => None,
        };
        let key = cache::key(&authority, &req);
        let mut revalidating: Option<Vec<u8>> = None;
        if info.cacheable && self.cfg.cache_entries > 0 {
            let found = self.lock_cache().lookup(&key, Instant::now());
            match found {
                Lookup::Fresh(resp, age) if !info.no_cache => {
                    self.stats.cache_hits.fetch_add(1, Relaxed);
                    // The client's own validators still apply.
                    let mut cached_info = info.clone();
                    let etag = resp.option(OptionNumber::ETAG).map(<[u8]>::to_vec);
                    let resp = if info.conditional && etag.is_some_and(|e| info.etags.contains(&e))
                    {
                        cached_info.conditional = true;
                        crate::mapping::CoapResponse {
                            code: Code::VALID,
                            ..resp
                        }
                    } else {
                        resp
                    };
                    let mut out = map_response(
                        resp,
                        &ResponseContext {
                            authority: &authority,
                            mapping,
                            info: &cached_info,
                            age,
                        },
                    )?;
                    if self.cfg.server_timing {
                        out.headers_mut().insert(
                            HeaderName::from_static("server-timing"),
                            HeaderValue::from_static("cache;desc=hit"),
                        );
                    }
                    return Ok(out);
                }
                Lookup::Stale(tag) if !info.conditional => {
                    req.options.push((OptionNumber::ETAG, tag.clone()));
                    revalidating = Some(tag);
                }
                _ => {}
            }
        }
        let dest = self.resolve(&authority).await?;
        let up = self
            .upstream
            .request(dest, req)
            .await
            .map_err(|e| match e {
                UpstreamError::Timeout => ProxyError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("the CoAP server {authority} did not answer"),
                ),
                UpstreamError::Reset => ProxyError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the CoAP server {authority} answered with a Reset"),
                ),
                UpstreamError::Overloaded => ProxyError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("too many requests in flight to {authority}"),
                )
                .retry_after(1),
                UpstreamError::Request(m) => ProxyError::new(StatusCode::BAD_REQUEST, m),
                UpstreamError::Io(m) => ProxyError::new(StatusCode::BAD_GATEWAY, m),
                UpstreamError::Block(m) => ProxyError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the CoAP server {authority}: {m}"),
                ),
                UpstreamError::Oscore(m) => ProxyError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the CoAP server {authority}: {m}"),
                ),
            })?;
        let now = Instant::now();
        let mut resp = up.response;
        if revalidating.is_some() && resp.code == Code::VALID {
            // Our own validation: serve the refreshed stored response.
            match self.lock_cache().revalidated(&key, &resp, now) {
                Some(stored) => resp = stored,
                None => {
                    return Err(ProxyError::new(
                        StatusCode::BAD_GATEWAY,
                        "the CoAP server validated an entity tag the proxy no longer holds",
                    ))
                }
            }
        } else if info.cacheable && !info.no_store && self.cfg.cache_entries > 0 {
            self.lock_cache().store(key.clone(), &resp, now);
        } else if !info.cacheable && method != Method::GET && method != Method::HEAD {
            // An unsafe method on a resource makes what is stored for it stale
            // (RFC 7252 section 5.6 leaves this to the cache; dropping is safe).
            let get = crate::mapping::CoapRequest {
                code: Code::GET,
                options: target_options(&target),
                payload: Vec::new(),
            };
            self.lock_cache().invalidate(&cache::key(&authority, &get));
        }
        let mut out = map_response(
            resp,
            &ResponseContext {
                authority: &authority,
                mapping,
                info: &info,
                age: 0,
            },
        )?;
        if self.cfg.server_timing {
            let v = format!("coap;dur={:.3}", up.rtt.as_secs_f64() * 1e3);
            if let Ok(v) = HeaderValue::from_str(&v) {
                out.headers_mut()
                    .insert(HeaderName::from_static("server-timing"), v);
            }
        }
        Ok(out)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        match self.cache.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        }
    }

    async fn resolve(&self, a: &Authority) -> Result<SocketAddr, ProxyError> {
        if let Some(ip) = a.ip() {
            return Ok(SocketAddr::new(ip, a.port));
        }
        let lookup = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((a.host.as_str(), a.port)),
        )
        .await;
        match lookup {
            Ok(Ok(addrs)) => {
                // a name with several addresses goes to the one that has an
                // OSCORE context ([[proxy.oscore]]), so that it is never
                // sent unprotected to another of its addresses
                let addrs: Vec<SocketAddr> = addrs.collect();
                let oscore = &self.config().upstream_oscore.0;
                addrs
                    .iter()
                    .find(|d| oscore.contains_key(d))
                    .or(addrs.first())
                    .copied()
                    .ok_or_else(|| {
                        ProxyError::new(
                            StatusCode::BAD_GATEWAY,
                            format!("{} has no address", a.host),
                        )
                    })
            }
            Ok(Err(e)) => Err(ProxyError::new(
                StatusCode::BAD_GATEWAY,
                format!("cannot resolve {}: {e}", a.host),
            )),
            Err(_) => Err(ProxyError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!("resolving {} took too long", a.host),
            )),
        }
    }
}

/// The options a GET to `t` carries (for invalidating its cache entry).
fn target_options(t: &crate::mapping::CoapTarget) -> Vec<(OptionNumber, Vec<u8>)> {
    let mut o = Vec::new();
    if t.authority.ip().is_none() {
        o.push((OptionNumber::URI_HOST, t.authority.host.as_bytes().to_vec()));
    }
    o.extend(t.path.iter().map(|p| (OptionNumber::URI_PATH, p.clone())));
    o.extend(t.query.iter().map(|q| (OptionNumber::URI_QUERY, q.clone())));
    o
}
