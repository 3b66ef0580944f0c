//! What several commands share: argument parsers for clap's
//! `value_parser`, the `coap://` URI argument of the client commands and
//! `observe`, JSON string output, and the synchronous signal handling of
//! the long-running commands (`serve`, `proxy`, `netem`, `observe`).
//!
//! Invariants: the parsers only read their argument and answer an error
//! text clap shows as it is. SIGINT and SIGTERM are taken synchronously
//! (`sigtimedwait`) from the set [`block_signals`] blocked; a command calls
//! it before it starts threads, which inherit the mask, so the signals wait
//! for the command's own shutdown instead of ending the process.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use mintgate_coap::uri::CoapUri;

/// A count of at least `MIN`, for the flags where fewer means nothing.
#[cfg(feature = "labs")]
pub(crate) fn at_least<const MIN: usize>(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= MIN => Ok(n),
        _ => Err(format!("'{s}' is not a whole number of at least {MIN}")),
    }
}

/// A positive duration (see `mintgate_gateway::config::parse_duration`).
pub(crate) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = mintgate_gateway::config::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("duration '{s}' must be positive"));
    }
    Ok(d)
}

/// A link's one-way delay or jitter: a bare number is milliseconds (every
/// link delay flag reads it so), anything else a duration with its unit.
pub(crate) fn parse_ms(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let v: f64 = t
            .parse()
            .map_err(|_| format!("`{s}`: milliseconds like 40 or 40ms"))?;
        return mintgate_gateway::config::parse_duration(&format!("{v}ms"));
    }
    mintgate_gateway::config::parse_duration(t)
}

/// Parses a `coap://` URI for a command ([`mintgate_coap::uri::parse`]).
pub(crate) fn parse_uri(s: &str) -> anyhow::Result<CoapUri> {
    mintgate_coap::uri::parse(s).with_context(|| format!("bad URI '{s}'"))
}

/// The socket address of the URI's host (the first one a name resolves to).
pub(crate) fn resolve(uri: &CoapUri) -> anyhow::Result<SocketAddr> {
    Ok(mintgate_gateway::observe_client::resolve(uri)?)
}

/// `s` as a JSON string literal (serde_json's escaping, the one the
/// program uses everywhere).
pub(crate) fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it starts
/// afterwards), so that `wait_for_signal` can take them synchronously.
pub(crate) fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// A signal of `set` that is pending now, taken; `None` if there is none
/// (does not wait).
pub(crate) fn take_signal(set: &libc::sigset_t) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: set and ts are valid; info may be null.
    let r = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (r > 0).then_some(r)
}

/// Waits for a signal of `set` and returns it, calling `tick` every
/// `every` (at least a second) meanwhile.
pub(crate) fn wait_for_signal(
    set: &libc::sigset_t,
    every: Duration,
    mut tick: impl FnMut(),
) -> i32 {
    let ts = libc::timespec {
        tv_sec: every.as_secs().max(1) as libc::time_t,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: set and ts are valid; info may be null.
        let r = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        if r > 0 {
            return r;
        }
        tick();
    }
}
