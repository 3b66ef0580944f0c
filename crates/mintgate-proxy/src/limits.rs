//! What keeps the proxy from being an open relay or a free-for-all: the
//! per-client rate limit and the bearer-token check. (The upstream allow
//! list is a plain membership test in [`crate::service`].)

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Clients tracked at most; beyond, the idlest are forgotten (a forgotten
/// client starts again with a full bucket, which only errs on the side of
/// letting a request through).
pub const MAX_TRACKED_CLIENTS: usize = 65_536;

/// A token bucket per client IP address: `rate` tokens per second, at most
/// `burst` stored; a request takes one.
///
/// Invariant: every bucket holds between 0 and `burst` tokens as of its
/// `last` instant; the map holds at most [`MAX_TRACKED_CLIENTS`] buckets.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// A limiter; `rate` 0 lets everything through.
    pub fn new(rate: f64, burst: u32) -> RateLimiter {
        RateLimiter {
            rate,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for `client` at `now`. `Err(wait)` when there is none:
    /// the time until one will be there.
    pub fn check(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let mut map = match self.buckets.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if map.len() >= MAX_TRACKED_CLIENTS && !map.contains_key(&client) {
            // Forget the buckets that are full again (idle long enough).
            let (rate, burst) = (self.rate, self.burst);
            map.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * rate < burst
            });
            if map.len() >= MAX_TRACKED_CLIENTS {
                map.clear();
            }
        }
        let b = map.entry(client).or_insert(Bucket {
            tokens: self.burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }
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
        assert!(l.buckets.lock().unwrap().len() <= MAX_TRACKED_CLIENTS);
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
