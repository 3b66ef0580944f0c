//! The client side of CoAP Observe (RFC 7641) over one UDP socket: used by
//! `mintgate observe` and by the MQTT bridge's `[[mqtt.observe]]` entries.
//!
//! [`Observation::register`] sends a CON GET with `Observe: 0`,
//! retransmitted per RFC 7252 (2 s doubling, 4 retransmissions) until it is
//! answered. [`Observation::next_event`] then returns each representation
//! newer than the last one returned (RFC 7641 3.4's ordering rule; older
//! ones are acknowledged and dropped), acknowledges confirmable
//! notifications, and answers a notification for a token it does not hold
//! with a Reset, which ends that stale observation on the server.
//! [`Observation::deregister`] sends a GET with `Observe: 1`.
//!
//! With OSCORE ([`Observation::register_oscore`], RFC 8613 4.1.3.5) the
//! registration and the deregistration are protected, and a notification
//! is returned only when it verifies against the registration and its
//! Partial IV is above every one returned before (7.4.1; the first answer
//! may reuse the request's nonce): unprotected, unverifiable, replayed and
//! older ones are dropped and counted ([`Observation::dropped`]). A
//! protected 4.01 with Echo to the registration (a server that lost its
//! replay window, Appendix B.1.2) is answered once by registering again
//! with the Echo.
//!
//! Blocking and single-threaded: the caller owns the loop and decides what
//! a representation without Observe (not observable, or the end of the
//! observation) and an error answer mean for it.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use mintgate_coap::oscore::{self, Context, Notifications, RequestId};
use mintgate_coap::server::observe::fresher;
use mintgate_coap::uri::{CoapUri, Host};
use mintgate_coap::wire::{
    empty_message, encode_uint, Code, ContentFormat, MessageType, MessageWriter, OptionNumber,
    Packet,
};

/// The socket address of the URI's host (the first one a name resolves to).
pub fn resolve(uri: &CoapUri) -> io::Result<SocketAddr> {
    match &uri.host {
        Host::Ip(ip) => Ok(SocketAddr::new(*ip, uri.port)),
        Host::Name(name) => (name.as_str(), uri.port)
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve host '{name}': {e}")))?
            .next()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("host '{name}' has no address"),
                )
            }),
    }
}

/// One representation received.
#[derive(Clone, Debug)]
pub struct Notification {
    /// Its Observe value; `None`: the server did not register us (in the
    /// registration's answer) or ended the observation.
    pub observe: Option<u32>,
    /// CON, NON or ACK (the registration's piggybacked answer).
    pub msg_type: MessageType,
    /// The response code.
    pub code: Code,
    /// Its Content-Format, if given.
    pub content_format: Option<u16>,
    /// Its Max-Age in seconds, if given (RFC 7252: 60 when absent).
    pub max_age: Option<u32>,
    /// The payload.
    pub payload: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
}

/// What [`Observation::next_event`] reports.
#[derive(Clone, Debug)]
pub enum ObserveEvent {
    /// A 2.xx representation, newer than the one before.
    Notification(Notification),
    /// An answer of another class (4.xx, 5.xx): the observation is over.
    Failed(Notification),
    /// The registration got no answer after its retransmissions.
    NoAnswer,
    /// The server rejected the registration with a Reset.
    Reset,
    /// An ICMP port unreachable came back before the registration was
    /// answered: nothing listens at the destination.
    Unreachable,
}

/// Most retransmissions of the registration (RFC 7252 MAX_RETRANSMIT).
const MAX_RETRANSMIT: u32 = 4;

/// An observation's OSCORE state: the context, what its notifications are
/// bound to (the registration request) and its Notification Number.
struct Secured {
    ctx: Context,
    id: RequestId,
    seen: Notifications,
    /// The registration was repeated with an Echo already.
    echoed: bool,
}

/// One observation; see the module docs.
pub struct Observation {
    sock: UdpSocket,
    dest: SocketAddr,
    token: [u8; 4],
    mid: u16,
    reg: Vec<u8>,
    reg_mid: u16,
    options: Vec<(OptionNumber, Vec<u8>)>,
    accept: Option<ContentFormat>,
    timeout: Duration,
    next_tx: Instant,
    tries: u32,
    acked: bool,
    answered: bool,
    /// An ICMP port unreachable was reported on the socket.
    refused: bool,
    last: Option<(u32, Instant)>,
    buf: Vec<u8>,
    oscore: Option<Secured>,
    dropped: u64,
}

fn oscore_error(e: oscore::Error) -> io::Error {
    io::Error::other(format!("OSCORE: {e}"))
}

/// A notification of `p`'s code, Content-Format, Max-Age and payload with
/// the Observe value `observe` (the outer one under OSCORE).
fn note_of(p: &Packet<&[u8]>, observe: Option<u32>, at: Instant) -> Notification {
    let uint = |o| p.option(o).and_then(|o| o.uint());
    Notification {
        observe,
        msg_type: p.msg_type(),
        code: p.code(),
        content_format: uint(OptionNumber::CONTENT_FORMAT).map(|v| v as u16),
        max_age: uint(OptionNumber::MAX_AGE),
        payload: p.payload().to_vec(),
        at,
    }
}

/// Builds a CON GET with `Observe: obs`.
fn get(
    mid: u16,
    token: &[u8],
    obs: u32,
    opts: &[(OptionNumber, Vec<u8>)],
    accept: Option<ContentFormat>,
) -> io::Result<Vec<u8>> {
    let bad = |e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("forming the GET: {e:?}"),
        )
    };
    let mut all: Vec<(OptionNumber, Vec<u8>)> = opts.to_vec();
    let mut b = [0u8; 4];
    all.push((OptionNumber::OBSERVE, encode_uint(obs, &mut b).to_vec()));
    if let Some(cf) = accept {
        all.push((
            OptionNumber::ACCEPT,
            encode_uint(cf.0.into(), &mut b).to_vec(),
        ));
    }
    all.sort_by_key(|(n, _)| n.0); // stable: repeated options keep their order
    let mut buf = vec![0u8; 2048];
    let mut w =
        MessageWriter::new(&mut buf, MessageType::Con, Code::GET, mid, token).map_err(bad)?;
    for (n, v) in &all {
        w.option(*n, v).map_err(bad)?;
    }
    let n = w.finish();
    buf.truncate(n);
    Ok(buf)
}

fn quiet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::Interrupted
            | io::ErrorKind::ConnectionRefused
    )
}

impl Observation {
    /// Opens a socket towards `dest` and sends the registration for the
    /// resource the `options` (Uri-Host, Uri-Path, Uri-Query) name.
    pub fn register(
        dest: SocketAddr,
        options: Vec<(OptionNumber, Vec<u8>)>,
        accept: Option<ContentFormat>,
    ) -> io::Result<Observation> {
        Observation::start(dest, options, accept, None)
    }

    /// [`Observation::register`] protected with OSCORE (see the module
    /// docs); `ctx`'s sender sequence number is reserved in its store
    /// before each protected request.
    pub fn register_oscore(
        dest: SocketAddr,
        options: Vec<(OptionNumber, Vec<u8>)>,
        accept: Option<ContentFormat>,
        ctx: Context,
    ) -> io::Result<Observation> {
        Observation::start(dest, options, accept, Some(ctx))
    }

    fn start(
        dest: SocketAddr,
        options: Vec<(OptionNumber, Vec<u8>)>,
        accept: Option<ContentFormat>,
        ctx: Option<Context>,
    ) -> io::Result<Observation> {
        let bind: SocketAddr = if dest.is_ipv4() {
            (IpAddr::from([0u8; 4]), 0).into()
        } else {
            (IpAddr::from(Ipv6Addr::UNSPECIFIED), 0).into()
        };
        let sock = UdpSocket::bind(bind)?;
        sock.connect(dest)?;
        let token: [u8; 4] = rand::random();
        let mid: u16 = rand::random();
        let mut reg = get(mid, &token, 0, &options, accept)?;
        let oscore = match ctx {
            Some(mut ctx) => {
                let (outer, id) = ctx.protect_request(&reg).map_err(oscore_error)?;
                reg = outer;
                Some(Secured {
                    ctx,
                    id,
                    seen: Notifications::default(),
                    echoed: false,
                })
            }
            None => None,
        };
        let mut o = Observation {
            sock,
            dest,
            token,
            mid,
            reg,
            reg_mid: mid,
            options,
            accept,
            timeout: Duration::from_secs(2),
            next_tx: Instant::now(),
            tries: 0,
            acked: false,
            answered: false,
            refused: false,
            last: None,
            buf: vec![0u8; 65536],
            oscore,
            dropped: 0,
        };
        o.transmit()?;
        Ok(o)
    }

    /// Messages with our token not returned: with OSCORE, unprotected
    /// ones, ones that did not verify, replayed and older ones.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Where the resource is.
    pub fn dest(&self) -> SocketAddr {
        self.dest
    }

    /// Whether the registration has been answered.
    pub fn answered(&self) -> bool {
        self.answered
    }

    fn transmit(&mut self) -> io::Result<()> {
        match self.sock.send(&self.reg) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => self.refused = true,
            Err(e) => return Err(e),
        }
        self.tries += 1;
        self.next_tx = Instant::now() + self.timeout;
        self.timeout *= 2;
        Ok(())
    }

    /// Waits until `until` for the next event; `Ok(None)` when that time
    /// came first. After [`ObserveEvent::NoAnswer`], [`ObserveEvent::Reset`]
    /// or [`ObserveEvent::Failed`] the observation is over (make a new one).
    pub fn next_event(&mut self, until: Instant) -> io::Result<Option<ObserveEvent>> {
        loop {
            let now = Instant::now();
            let waiting = !self.answered && !self.acked;
            if waiting && now >= self.next_tx {
                if self.tries > MAX_RETRANSMIT {
                    return Ok(Some(ObserveEvent::NoAnswer));
                }
                self.transmit()?;
            }
            if now >= until {
                return Ok(None);
            }
            let mut wait = until - now;
            if waiting {
                wait = wait.min(self.next_tx.saturating_duration_since(now));
            }
            self.sock
                .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
            if self.refused && !self.answered {
                return Ok(Some(ObserveEvent::Unreachable));
            }
            let n = match self.sock.recv(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    // before an answer: nothing listens; after one, the
                    // server went away and notifications simply stop
                    self.refused = true;
                    continue;
                }
                Err(e) if quiet(&e) => continue,
                Err(e) => return Err(e),
            };
            if let Some(ev) = self.on_datagram(n) {
                return Ok(Some(ev));
            }
        }
    }

    fn on_datagram(&mut self, n: usize) -> Option<ObserveEvent> {
        let Ok(p) = Packet::new_checked(&self.buf[..n]) else {
            return None; // not CoAP we can read: ignored
        };
        let ty = p.msg_type();
        if p.code().is_empty() {
            match ty {
                MessageType::Ack if p.message_id() == self.reg_mid => self.acked = true,
                MessageType::Rst if p.message_id() == self.reg_mid && !self.answered => {
                    return Some(ObserveEvent::Reset)
                }
                _ => {}
            }
            return None;
        }
        if !p.code().is_response() {
            return None;
        }
        if p.token() != self.token {
            // a notification of an observation we do not hold: end it
            let _ = self
                .sock
                .send(&empty_message(MessageType::Rst, p.message_id()));
            return None;
        }
        if ty == MessageType::Con {
            let _ = self
                .sock
                .send(&empty_message(MessageType::Ack, p.message_id()));
        }
        let at = Instant::now();
        let observe = p.option(OptionNumber::OBSERVE).and_then(|o| o.uint());
        let note = match self.oscore.as_mut() {
            None => note_of(&p, observe, at),
            Some(sec) => {
                if p.option(oscore::OSCORE).is_none() {
                    // an unprotected refusal of the registration ends it;
                    // nothing else unprotected is taken
                    if !self.answered && p.code().class() != 2 {
                        self.answered = true;
                        return Some(ObserveEvent::Failed(note_of(&p, observe, at)));
                    }
                    self.dropped += 1;
                    return None;
                }
                let Ok(inner) =
                    sec.ctx
                        .unprotect_notification(p.as_bytes(), &sec.id, &mut sec.seen)
                else {
                    self.dropped += 1;
                    return None;
                };
                let Ok(ip) = Packet::new_checked(&inner[..]) else {
                    self.dropped += 1;
                    return None;
                };
                let echo = ip.option(OptionNumber::ECHO).map(|e| e.value.to_vec());
                if let (Some(e), false, true) =
                    (echo, self.answered, ip.code() == Code::UNAUTHORIZED)
                {
                    if !sec.echoed {
                        return self.register_again(e).err().map(|_| ObserveEvent::NoAnswer);
                    }
                }
                note_of(&ip, observe, at)
            }
        };
        self.answered = true;
        if note.code.class() != 2 {
            return Some(ObserveEvent::Failed(note));
        }
        if let (Some(v), Some((lv, lt)), None) = (note.observe, self.last, &self.oscore) {
            if !fresher(lv, lt, v, at) {
                return None; // reordered: older than what was returned
            }
        }
        if let Some(v) = note.observe {
            self.last = Some((v, at));
        }
        Some(ObserveEvent::Notification(note))
    }

    /// The server lost its OSCORE replay window and challenged the
    /// registration with `echo` (RFC 8613 B.1.2): registers again, once,
    /// with the Echo option, under a new message ID and request.
    fn register_again(&mut self, echo: Vec<u8>) -> io::Result<()> {
        let Some(sec) = self.oscore.as_mut() else {
            return Ok(());
        };
        let mut opts = self.options.clone();
        opts.push((OptionNumber::ECHO, echo));
        self.mid = self.mid.wrapping_add(1);
        let plain = get(self.mid, &self.token, 0, &opts, self.accept)?;
        let (outer, id) = sec.ctx.protect_request(&plain).map_err(oscore_error)?;
        sec.id = id;
        sec.seen = Notifications::default();
        sec.echoed = true;
        self.reg = outer;
        self.reg_mid = self.mid;
        self.acked = false;
        self.tries = 0;
        self.timeout = Duration::from_secs(2);
        self.transmit()
    }

    /// Ends the observation with a GET carrying `Observe: 1`, waiting at
    /// most `wait` for its answer (a lost one does no harm: the next
    /// notification would get a Reset).
    pub fn deregister(mut self, wait: Duration) {
        self.mid = self.mid.wrapping_add(1);
        let Ok(mut dereg) = get(self.mid, &self.token, 1, &self.options, self.accept) else {
            return;
        };
        if let Some(sec) = self.oscore.as_mut() {
            match sec.ctx.protect_request(&dereg) {
                Ok((outer, _)) => dereg = outer,
                // nothing unprotected for a protected relation: the next
                // notification gets a Reset instead
                Err(_) => return,
            }
        }
        let _ = self.sock.send(&dereg);
        let until = Instant::now() + wait;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if self
                .sock
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .is_err()
            {
                break;
            }
            match self.sock.recv(&mut self.buf) {
                Ok(n) => {
                    if let Ok(p) = Packet::new_checked(&self.buf[..n]) {
                        if p.msg_type() == MessageType::Con {
                            let _ = self
                                .sock
                                .send(&empty_message(MessageType::Ack, p.message_id()));
                        }
                        if p.message_id() == self.mid && p.msg_type() == MessageType::Ack {
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
}
