//! A responsiveness probe: one CON GET every `interval` from its own socket
//! (its own source address, if asked), retransmitted as RFC 7252 section
//! 4.2 says, and timed from its first transmission.
//!
//! Timing is the RFC's with ACK_RANDOM_FACTOR taken as 1, the strictest
//! choice: the first retransmission goes `ack_timeout` after the request,
//! the k-th `ack_timeout * (2^k - 1)` after it. A probe is *answered* when a
//! response with its token (piggybacked on the ACK, or separate after an
//! empty ACK) arrives before the retransmission after the last allowed one
//! would be due: with `ack_timeout` = 2 s and 2 retransmissions (at 2 s and
//! 6 s), within `2 s * (1 + 2 + 4)` = 14 s of the first transmission.
//! Otherwise it is *lost*. Any response code counts as an answer; the code
//! is kept so that a caller can tell 2.05 from 5.03.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use mintgate_coap::wire::{empty_message, Code, MessageType, MessageWriter, OptionNumber, Packet};

/// What to probe and how.
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    /// The server.
    pub target: SocketAddr,
    /// Local address of the probe's socket, e.g. `127.0.0.2:0` (a source
    /// other than the load's).
    pub bind: SocketAddr,
    /// The resource to GET.
    pub path: String,
    /// One probe every this long.
    pub interval: Duration,
    /// How long to send probes (the last probe is then waited for).
    pub duration: Duration,
    /// ACK_TIMEOUT (RFC 7252: 2 s).
    pub ack_timeout: Duration,
    /// Retransmissions allowed (the criterion's "first two": 2).
    pub max_retransmit: u32,
}

impl ProbeSpec {
    /// One probe a second for `duration`, RFC 7252 defaults, 2 retransmissions.
    pub fn new(target: SocketAddr, bind: SocketAddr, path: &str, duration: Duration) -> ProbeSpec {
        ProbeSpec {
            target,
            bind,
            path: path.to_string(),
            interval: Duration::from_secs(1),
            duration,
            ack_timeout: Duration::from_secs(2),
            max_retransmit: 2,
        }
    }

    /// Time after the first transmission within which an answer counts:
    /// `ack_timeout * (2^(max_retransmit + 1) - 1)`.
    pub fn deadline(&self) -> Duration {
        self.ack_timeout * ((1u32 << (self.max_retransmit + 1).min(16)) - 1)
    }
}

/// One probe's outcome.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeResult {
    /// When it was first sent, after the start of [`run_probes`].
    pub sent_at: Duration,
    /// First transmission to the response; `None` when lost.
    pub latency: Option<Duration>,
    /// The response's code.
    pub code: Option<Code>,
    /// Transmissions made (1 = answered without retransmitting).
    pub transmissions: u32,
}

impl ProbeResult {
    /// Answered 2.xx.
    pub fn ok(&self) -> bool {
        self.code.is_some_and(|c| c.class() == 2)
    }
}

struct Outstanding {
    first: Instant,
    next: Instant,
    mid: u16,
    token: [u8; 4],
    transmissions: u32,
    acked: bool,
    result: usize,
}

fn encode(buf: &mut [u8], mid: u16, token: &[u8], path: &str) -> std::io::Result<usize> {
    let bad = |e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e:?}"));
    let mut w = MessageWriter::new(buf, MessageType::Con, Code::GET, mid, token).map_err(bad)?;
    w.path_options(OptionNumber::URI_PATH, path).map_err(bad)?;
    Ok(w.finish())
}

/// Sends the probes and returns their outcomes in order. Returns within
/// `duration + deadline` (plus a poll tick).
pub fn run_probes(spec: &ProbeSpec) -> std::io::Result<Vec<ProbeResult>> {
    let sock = UdpSocket::bind(spec.bind)?;
    sock.connect(spec.target)?;
    sock.set_read_timeout(Some(Duration::from_millis(5)))?;
    let start = Instant::now();
    let deadline = spec.deadline();
    let mut results: Vec<ProbeResult> = Vec::new();
    let mut out: Vec<Outstanding> = Vec::new();
    let mut next_probe = start;
    let mut mid: u16 = rand::random();
    let mut tx = [0u8; 512];
    let mut rx = [0u8; 2048];
    loop {
        let now = Instant::now();
        if now.duration_since(start) < spec.duration && now >= next_probe {
            mid = mid.wrapping_add(1);
            let token = (results.len() as u32).to_be_bytes();
            let n = encode(&mut tx, mid, &token, &spec.path)?;
            sock.send(&tx[..n])?;
            out.push(Outstanding {
                first: now,
                next: now + spec.ack_timeout,
                mid,
                token,
                transmissions: 1,
                acked: false,
                result: results.len(),
            });
            results.push(ProbeResult {
                sent_at: now.duration_since(start),
                latency: None,
                code: None,
                transmissions: 1,
            });
            next_probe += spec.interval;
        }
        // retransmit (until ACKed) and give up at the deadline
        out.retain_mut(|o| {
            if now.duration_since(o.first) >= deadline {
                results[o.result].transmissions = o.transmissions;
                return false;
            }
            if !o.acked && now >= o.next && o.transmissions <= spec.max_retransmit {
                if let Ok(n) = encode(&mut tx, o.mid, &o.token, &spec.path) {
                    let _ = sock.send(&tx[..n]);
                }
                o.transmissions += 1;
                o.next = o.first + spec.ack_timeout * ((1u32 << o.transmissions) - 1);
            }
            true
        });
        if out.is_empty() && now.duration_since(start) >= spec.duration {
            break;
        }
        let n = match sock.recv(&mut rx) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // ICMP port unreachable and the like: the server is not there yet
            Err(_) => continue,
        };
        let Ok(p) = Packet::new_checked(&rx[..n]) else {
            continue;
        };
        let at = Instant::now();
        // a separate CON response is acknowledged whoever it is for
        if p.msg_type() == MessageType::Con {
            let _ = sock.send(&empty_message(MessageType::Ack, p.message_id()));
        }
        if p.code() == Code::EMPTY {
            if p.msg_type() == MessageType::Ack {
                if let Some(o) = out.iter_mut().find(|o| o.mid == p.message_id()) {
                    o.acked = true;
                }
            }
            continue;
        }
        if let Some(i) = out.iter().position(|o| o.token[..] == *p.token()) {
            let o = out.swap_remove(i);
            let r = &mut results[o.result];
            r.latency = Some(at.duration_since(o.first));
            r.code = Some(p.code());
            r.transmissions = o.transmissions;
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_the_rfc_sum() {
        let s = ProbeSpec::new(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            "/x",
            Duration::from_secs(1),
        );
        assert_eq!(s.deadline(), Duration::from_secs(14));
    }

    #[test]
    fn answered_once_and_retransmitted_when_silent() {
        // a server that drops the first transmission of each request
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            server
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            let mut b = [0u8; 512];
            let mut seen = std::collections::HashSet::new();
            while let Ok((n, from)) = server.recv_from(&mut b) {
                let p = Packet::new_checked(&b[..n]).unwrap();
                if seen.insert(p.message_id()) {
                    continue;
                }
                let mut out = [0u8; 64];
                let w = MessageWriter::new(
                    &mut out,
                    MessageType::Ack,
                    Code::CONTENT,
                    p.message_id(),
                    p.token(),
                )
                .unwrap();
                let len = w.finish();
                server.send_to(&out[..len], from).unwrap();
            }
        });
        let mut s = ProbeSpec::new(
            addr,
            "127.0.0.1:0".parse().unwrap(),
            "/x",
            Duration::from_millis(1),
        );
        s.ack_timeout = Duration::from_millis(100);
        let r = run_probes(&s).unwrap();
        assert_eq!(r.len(), 1);
        assert!(r[0].ok(), "{r:?}");
        assert_eq!(r[0].transmissions, 2);
        let l = r[0].latency.unwrap();
        assert!(
            l >= Duration::from_millis(100) && l < Duration::from_millis(700),
            "{l:?}"
        );
        t.join().unwrap();
    }
}
