//! What keeps the proxy from being an open relay or a free-for-all: the
//! per-client rate limit and the bearer-token check. (The upstream allow
//! list is a plain membership test in [`crate::service`].)

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Clients the rate limiter tracks at most by default; beyond, the least
/// recently seen is forgotten.
pub const MAX_TRACKED_CLIENTS: usize = 65_536;

/// What limits count per: an IPv4 address, or the /64 prefix of an IPv6
/// address (one host usually holds a whole /64, so counting its addresses
/// apart would give it 2^64 budgets). IPv4-mapped IPv6 addresses count as
/// their IPv4 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey(IpAddr);

impl SourceKey {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> SourceKey {
        match ip.to_canonical() {
            IpAddr::V4(a) => SourceKey(IpAddr::V4(a)),
            IpAddr::V6(a) => {
                let bits = u128::from(a) & !((1u128 << 64) - 1);
                SourceKey(IpAddr::V6(bits.into()))
            }
        }
    }
}

impl std::fmt::Display for SourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

/// A token bucket per source ([`SourceKey`]: IPv4 address or IPv6 /64):
/// `rate` tokens per second, at most `burst` stored; a request takes one.
///
/// The table holds at most `capacity` sources. When it is full, a new
/// source takes the place of the least recently seen one (whose bucket has
/// had the longest to fill up again, so forgetting it is the smallest
/// loss); the other buckets are kept, so a flood of new sources cannot
/// reset the budget of the busy ones all at once.
///
/// Invariant: every bucket holds between 0 and `burst` tokens as of its
/// `last` instant; `map` and `order` hold the same sources, at most
/// `capacity`.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    capacity: usize,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// Source -> bucket and its recency stamp.
    map: HashMap<SourceKey, (Bucket, u64)>,
    /// Recency stamp -> source, oldest first.
    order: BTreeMap<u64, SourceKey>,
    next: u64,
    evicted: u64,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// A limiter tracking up to [`MAX_TRACKED_CLIENTS`] sources; `rate` 0
    /// lets everything through.
    pub fn new(rate: f64, burst: u32) -> RateLimiter {
        Self::with_capacity(rate, burst, MAX_TRACKED_CLIENTS)
    }

    /// A limiter tracking up to `capacity` (at least 1) sources.
    pub fn with_capacity(rate: f64, burst: u32, capacity: usize) -> RateLimiter {
        RateLimiter {
            rate,
            burst: f64::from(burst.max(1)),
            capacity: capacity.max(1),
            table: Mutex::new(Table::default()),
        }
    }

    /// Takes a token for `client` at `now`. `Err(wait)` when there is none:
    /// the time until one will be there.
    pub fn check(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let key = SourceKey::of(client);
        let mut t = match self.table.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        let t = &mut *t;
        let stamp = t.next;
        t.next += 1;
        let mut bucket = match t.map.get(&key) {
            Some(&(b, old)) => {
                t.order.remove(&old);
                b
            }
            None => {
                while t.map.len() >= self.capacity {
                    let Some((_, oldest)) = t.order.pop_first() else {
                        break;
                    };
                    t.map.remove(&oldest);
                    t.evicted += 1;
                }
                Bucket {
                    tokens: self.burst,
                    last: now,
                }
            }
        };
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.last = now;
        let r = if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        };
        t.map.insert(key, (bucket, stamp));
        t.order.insert(stamp, key);
        r
    }

    /// Sources tracked now, and sources forgotten so far to make room.
    pub fn tracked(&self) -> (usize, u64) {
        let t = match self.table.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        (t.map.len(), t.evicted)
    }
}

/// Connections open per source ([`SourceKey`]) and in all, with caps on
/// both. A slot is held by the [`ConnSlot`] [`ConnCounter::try_open`]
/// returns and given back when it is dropped. The table only holds sources
/// with an open connection, so it is bounded by the total cap.
pub struct ConnCounter {
    per_source: usize,
    total: usize,
    inner: Mutex<(HashMap<SourceKey, usize>, usize)>,
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnRefused {
    /// The source has `max_connections_per_source` open.
    PerSource,
    /// `max_connections` are open in all.
    Total,
}

impl ConnCounter {
    /// A counter admitting `per_source` connections per source and `total`
    /// in all (each at least 1).
    pub fn new(per_source: usize, total: usize) -> Arc<ConnCounter> {
        Arc::new(ConnCounter {
            per_source: per_source.max(1),
            total: total.max(1),
            inner: Mutex::new((HashMap::new(), 0)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<SourceKey, usize>, usize)> {
        match self.inner.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        }
    }

    /// Admits a connection from `peer`, or says which cap it hits.
    pub fn try_open(self: &Arc<Self>, peer: IpAddr) -> Result<ConnSlot, ConnRefused> {
        let key = SourceKey::of(peer);
        let mut g = self.lock();
        let (map, total) = &mut *g;
        if *total >= self.total {
            return Err(ConnRefused::Total);
        }
        let n = map.entry(key).or_insert(0);
        if *n >= self.per_source {
            return Err(ConnRefused::PerSource);
        }
        *n += 1;
        *total += 1;
        Ok(ConnSlot {
            counter: self.clone(),
            key,
        })
    }

    /// Connections open now: from `peer`'s source, and in all.
    pub fn open(&self, peer: IpAddr) -> (usize, usize) {
        let g = self.lock();
        (g.0.get(&SourceKey::of(peer)).copied().unwrap_or(0), g.1)
    }
}

/// One admitted connection; dropping it frees the slot.
pub struct ConnSlot {
    counter: Arc<ConnCounter>,
    key: SourceKey,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut g = self.counter.lock();
        let (map, total) = &mut *g;
        *total = total.saturating_sub(1);
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Why a browser's request is taken as a cross-site write, if it is one:
/// `Sec-Fetch-Site: cross-site` (or `same-site`: another origin under the
/// same registrable domain, e.g. another device's page), or an `Origin`
/// header that is not this listener's own (`own`: the request's `Host`, or
/// its URI authority for HTTP/2 and HTTP/3). A request with neither header
/// (curl, scripts, CoAP clients) is not a browser's and passes. Only meant
/// for writes: a page may still read, which the same-origin policy keeps
/// from the page.
///
/// Browsers send a text/plain POST across sites without a CORS preflight,
/// so without this check any web page a user of the gateway's network
/// opens could write through the proxy.
pub fn cross_site(
    sec_fetch_site: Option<&[u8]>,
    origin: Option<&[u8]>,
    own: Option<&str>,
) -> Option<&'static str> {
    if let Some(site) = sec_fetch_site {
        let site = site.trim_ascii();
        if site.eq_ignore_ascii_case(b"cross-site") || site.eq_ignore_ascii_case(b"same-site") {
            return Some("a cross-site write (Sec-Fetch-Site) is refused");
        }
    }
    let origin = origin?;
    let ok = std::str::from_utf8(origin)
        .ok()
        .and_then(|o| origin_authority(o.trim()))
        .zip(own.map(normal_authority))
        .is_some_and(|(o, own)| o == own);
    if ok {
        None
    } else {
        Some("a write from another origin (Origin) is refused")
    }
}

/// `host[:port]` of `scheme://host[:port]`, lower case, without the
/// scheme's default port; `None` for `null` and anything else.
fn origin_authority(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.split_once("://")?;
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    let a = rest.to_ascii_lowercase();
    Some(a.strip_suffix(default).map(str::to_owned).unwrap_or(a))
}

/// A `Host` value as [`origin_authority`] gives it (lower case; port 80 and
/// 443 dropped, since the listener's scheme is not known here and an
/// `Origin` leaves its default port out).
fn normal_authority(host: &str) -> String {
    let a = host.trim().to_ascii_lowercase();
    for d in [":80", ":443"] {
        if let Some(x) = a.strip_suffix(d) {
            return x.to_owned();
        }
    }
    a
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks an `Authorization` header value against the accepted tokens.
/// With no tokens configured, everything passes.
pub fn bearer_ok(tokens: &[String], authorization: Option<&[u8]>) -> bool {
    tokens.is_empty() || bearer_token(authorization).is_some_and(|t| token_in(tokens, t))
}

/// The token of an `Authorization: Bearer TOKEN` header value.
pub fn bearer_token(authorization: Option<&[u8]>) -> Option<&str> {
    let v = std::str::from_utf8(authorization?).ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Whether `token` is one of `tokens`.
pub fn token_in(tokens: &[String], token: &str) -> bool {
    // Compare against every token so the time does not reveal which one
    // (or whether an early one) matched.
    tokens.iter().fold(false, |ok, t| {
        constant_time_eq(t.as_bytes(), token.as_bytes()) | ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_rate() {
        let l = RateLimiter::new(10.0, 5);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..5 {
            assert!(l.check(ip, t0).is_ok());
        }
        let wait = l.check(ip, t0).unwrap_err();
        assert!(wait > Duration::from_millis(90) && wait <= Duration::from_millis(100));
        // Another client has its own bucket.
        assert!(l.check(other, t0).is_ok());
        // 100 ms later one token is back, not two.
        let t1 = t0 + Duration::from_millis(100);
        assert!(l.check(ip, t1).is_ok());
        assert!(l.check(ip, t1).is_err());
        // Long idle refills to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(100);
        for _ in 0..5 {
            assert!(l.check(ip, t2).is_ok());
        }
        assert!(l.check(ip, t2).is_err());
    }

    #[test]
    fn zero_rate_is_unlimited() {
        let l = RateLimiter::new(0.0, 1);
        let ip: IpAddr = "::1".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..10_000 {
            assert!(l.check(ip, t0).is_ok());
        }
    }

    #[test]
    fn tracked_clients_are_bounded() {
        let l = RateLimiter::new(1.0, 1);
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED_CLIENTS as u32 + 10) {
            let ip = IpAddr::from(i.to_be_bytes());
            let _ = l.check(ip, t0);
        }
        assert!(l.tracked().0 <= MAX_TRACKED_CLIENTS);
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_v4_as_v4() {
        let k = |s: &str| SourceKey::of(s.parse().unwrap());
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("::ffff:192.0.2.1"), k("192.0.2.1"));
        assert_ne!(k("192.0.2.1"), k("192.0.2.2"));
        assert_eq!(k("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
        // one /64's addresses share one bucket
        let l = RateLimiter::new(1.0, 2);
        let t0 = Instant::now();
        assert!(l.check("2001:db8::1".parse().unwrap(), t0).is_ok());
        assert!(l.check("2001:db8::2".parse().unwrap(), t0).is_ok());
        assert!(l.check("2001:db8::3".parse().unwrap(), t0).is_err());
        assert!(l.check("2001:db8:0:1::3".parse().unwrap(), t0).is_ok());
    }

    #[test]
    fn full_table_forgets_the_least_recently_seen_only() {
        // Two busy clients have spent their buckets; a flood of new
        // sources fills the table many times over. The busy client seen
        // last keeps its empty bucket (no clearing of every bucket); the
        // table stays at its capacity.
        let l = RateLimiter::with_capacity(0.001, 3, 100);
        let t0 = Instant::now();
        let busy: IpAddr = "198.51.100.1".parse().unwrap();
        for _ in 0..3 {
            assert!(l.check(busy, t0).is_ok());
        }
        assert!(l.check(busy, t0).is_err());
        for i in 0..1_000u32 {
            let ip = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            assert!(l.check(ip, t0).is_ok(), "a new source has a full bucket");
            if i % 10 == 0 {
                // the busy client keeps coming back, so it is never the
                // least recently seen, and stays limited
                assert!(l.check(busy, t0).is_err(), "after {i} new sources");
            }
        }
        let (n, evicted) = l.tracked();
        assert_eq!(n, 100);
        assert!(evicted >= 900, "{evicted}");
        // A source that went quiet is the one forgotten: it starts again
        // with a full bucket, which errs on the side of letting it through.
        let quiet: IpAddr = "198.51.100.2".parse().unwrap();
        for _ in 0..3 {
            assert!(l.check(quiet, t0).is_ok());
        }
        for i in 0..100u32 {
            let _ = l.check(IpAddr::from((0x0b00_0000 + i).to_be_bytes()), t0);
        }
        assert!(l.check(quiet, t0).is_ok());
    }

    #[test]
    fn connections_capped_per_source_and_in_all() {
        let c = ConnCounter::new(2, 3);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = c.try_open(a).unwrap();
        let _a2 = c.try_open(a).unwrap();
        assert_eq!(c.try_open(a).err(), Some(ConnRefused::PerSource));
        let b1 = c.try_open(b).unwrap();
        assert_eq!(c.try_open(b).err(), Some(ConnRefused::Total));
        assert_eq!(c.open(a), (2, 3));
        drop(a1);
        assert_eq!(c.open(a), (1, 2));
        let _a3 = c.try_open(a).unwrap();
        drop(b1);
        assert_eq!(c.open(b), (0, 2));
        assert!(
            !c.lock().0.contains_key(&SourceKey::of(b)),
            "no empty entries kept"
        );
        // IPv6: one /64 is one source
        let v1: IpAddr = "2001:db8::1".parse().unwrap();
        let v2: IpAddr = "2001:db8::2".parse().unwrap();
        let _v = c.try_open(v1).unwrap();
        drop(_a3);
        assert_eq!(c.open(v2).0, 1);
    }

    #[test]
    fn cross_site_writes_are_told_apart() {
        let own = Some("127.0.0.1:8080");
        assert_eq!(cross_site(None, None, own), None, "not a browser");
        assert_eq!(cross_site(Some(b"same-origin"), None, own), None);
        assert_eq!(cross_site(Some(b"none"), None, own), None);
        assert!(cross_site(Some(b"cross-site"), None, own).is_some());
        assert!(cross_site(Some(b"same-site"), None, own).is_some());
        assert_eq!(cross_site(None, Some(b"http://127.0.0.1:8080"), own), None);
        assert_eq!(
            cross_site(Some(b"same-origin"), Some(b"HTTP://127.0.0.1:8080"), own),
            None
        );
        assert!(cross_site(None, Some(b"http://evil.example"), own).is_some());
        assert!(cross_site(None, Some(b"http://127.0.0.1:8081"), own).is_some());
        assert!(cross_site(None, Some(b"null"), own).is_some());
        assert!(cross_site(None, Some(b"http://127.0.0.1:8080"), None).is_some());
        assert!(cross_site(None, Some(b"http://a@127.0.0.1:8080"), own).is_some());
        // default ports
        assert_eq!(
            cross_site(None, Some(b"http://gw.local"), Some("gw.local:80")),
            None
        );
        assert_eq!(
            cross_site(None, Some(b"https://gw.local:443"), Some("gw.local")),
            None
        );
        assert!(cross_site(
            Some(b"cross-site"),
            Some(b"http://gw.local"),
            Some("gw.local")
        )
        .is_some());
    }

    #[test]
    fn bearer_tokens() {
        let toks = vec!["s3cret".to_owned(), "other".to_owned()];
        assert!(bearer_ok(&[], None));
        assert!(bearer_ok(&toks, Some(b"Bearer s3cret")));
        assert!(bearer_ok(&toks, Some(b"bearer other")));
        assert!(!bearer_ok(&toks, None));
        assert!(!bearer_ok(&toks, Some(b"Bearer s3cre")));
        assert!(!bearer_ok(&toks, Some(b"Basic s3cret")));
        assert!(!bearer_ok(&toks, Some(b"s3cret")));
        assert!(!bearer_ok(&toks, Some(b"Bearer \xff")));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
