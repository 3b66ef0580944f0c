//! The client side: one DTLS session on a connected UDP socket, blocking,
//! every wait bounded by a deadline.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslMethod};

use crate::session::{Progress, Session, SessionError};
use crate::{base_context, load_certs, ssl_err, CertFiles, DtlsError, Psk};

/// Settings of a coaps client.
#[derive(Clone, Debug, Default)]
pub struct ClientSettings {
    /// The identity and key to offer (PSK mode).
    pub psk: Option<Psk>,
    /// Own certificate and key (optional) and the CA the server's
    /// certificate must chain to (certificate mode).
    pub certs: CertFiles,
    /// With a CA: the name or address the server's certificate must be for
    /// (its subjectAltName, RFC 7252 9.1.3.3); usually the URI's host.
    pub server_name: Option<String>,
    /// Largest datagram the client's records may take (0: the default).
    pub mtu: u32,
}

/// A client context, reusable for many sessions (the handshake lab opens
/// thousands).
#[derive(Clone)]
pub struct ClientContext {
    ctx: SslContext,
    settings: Arc<ClientSettings>,
}

impl ClientContext {
    /// Builds the OpenSSL context. Needs a PSK or a CA to trust.
    pub fn new(settings: ClientSettings) -> Result<ClientContext, DtlsError> {
        if settings.psk.is_none() && settings.certs.ca.is_none() {
            return Err(DtlsError::Config(
                "coaps needs a pre-shared key (--psk-identity and --psk-key) or a CA \
                 certificate to verify the server with (--coaps-ca)"
                    .into(),
            ));
        }
        let mut b = SslContextBuilder::new(SslMethod::dtls())
            .map_err(ssl_err("creating the DTLS context"))?;
        base_context(&mut b)?;
        load_certs(&mut b, &settings.certs, true)?;
        if settings.certs.ca.is_none() {
            // PSK only: no certificate suites, so that the server cannot
            // pick one we could not verify
            b.set_cipher_list(
                "PSK-AES128-CCM8:PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-CCM",
            )
            .map_err(ssl_err("setting the cipher list"))?;
        }
        if let Some(psk) = settings.psk.clone() {
            b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
                // the identity goes out NUL-terminated
                if psk.identity.len() >= id_out.len() || psk.key.len() > key_out.len() {
                    return Ok(0);
                }
                id_out[..psk.identity.len()].copy_from_slice(&psk.identity);
                id_out[psk.identity.len()] = 0;
                key_out[..psk.key.len()].copy_from_slice(&psk.key);
                Ok(psk.key.len())
            });
        }
        Ok(ClientContext {
            ctx: b.build(),
            settings: Arc::new(settings),
        })
    }

    /// Runs a handshake with the server `sock` is connected to, by
    /// `deadline`.
    pub fn connect(&self, sock: UdpSocket, deadline: Instant) -> Result<DtlsClient, DtlsError> {
        let mut ssl = Ssl::new(&self.ctx).map_err(ssl_err("creating a DTLS session"))?;
        if let (Some(name), Some(_)) = (&self.settings.server_name, &self.settings.certs.ca) {
            let p = ssl.param_mut();
            match name.parse::<IpAddr>() {
                Ok(ip) => p.set_ip(ip),
                Err(_) => p.set_host(name),
            }
            .map_err(ssl_err("setting the name to verify"))?;
        }
        ssl.set_connect_state();
        let mtu = match self.settings.mtu {
            0 => crate::DEFAULT_MTU,
            m => m,
        };
        let session = Session::new(ssl, mtu).map_err(ssl_err("creating a DTLS session"))?;
        let mut c = DtlsClient {
            sock,
            session,
            buf: vec![0u8; 65536],
            plain: vec![0u8; 65536],
            inbox: VecDeque::new(),
        };
        c.handshake(deadline)?;
        Ok(c)
    }
}

/// One client session. See the [module documentation](self).
pub struct DtlsClient {
    sock: UdpSocket,
    session: Session,
    buf: Vec<u8>,
    plain: Vec<u8>,
    inbox: VecDeque<Vec<u8>>,
}

/// OpenSSL's first DTLS retransmission timer is 1 s; poll at least that
/// often while handshaking.
const HANDSHAKE_TICK: Duration = Duration::from_millis(250);

impl DtlsClient {
    /// A PSK or certificate session on `sock` (connected to the server),
    /// handshaken by `deadline`. For many sessions build a
    /// [`ClientContext`] once.
    pub fn connect(
        sock: UdpSocket,
        settings: ClientSettings,
        deadline: Instant,
    ) -> Result<DtlsClient, DtlsError> {
        ClientContext::new(settings)?.connect(sock, deadline)
    }

    fn flush(&mut self) -> Result<(), DtlsError> {
        let mut err = None;
        let sock = &self.sock;
        self.session.drain(&mut |d| {
            if let Err(e) = sock.send(d) {
                err.get_or_insert(e);
            }
        });
        match err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    fn handshake(&mut self, deadline: Instant) -> Result<(), DtlsError> {
        let mut p = self.session.handshake().map_err(handshake_err)?;
        self.flush()?;
        let mut heard = false;
        while p != Progress::Established {
            let now = Instant::now();
            if now >= deadline {
                // DTLS drops a record that fails its MAC check without an
                // alert (RFC 6347 4.1.2.7): a server that answered but
                // never sent its Finished could not decrypt ours
                return Err(if heard {
                    DtlsError::Handshake(
                        "the server answered but did not complete the handshake: \
                         wrong pre-shared key (or identity), or it refused our certificate"
                            .into(),
                    )
                } else {
                    DtlsError::Timeout
                });
            }
            let wait = (deadline - now).min(HANDSHAKE_TICK);
            self.sock
                .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
            match self.sock.recv(&mut self.buf) {
                Ok(n) => {
                    heard = true;
                    let inbox = &mut self.inbox;
                    p = self
                        .session
                        .feed(&self.buf[..n], &mut self.plain, &mut |pt| {
                            inbox.push_back(pt.to_vec())
                        })
                        .map_err(handshake_err)?;
                    if matches!(p, Progress::Data(_)) {
                        p = Progress::Established;
                    }
                }
                Err(e) if is_timeout(&e) => self.session.handle_timeout(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            self.flush()?;
        }
        Ok(())
    }

    /// The negotiated cipher suite (OpenSSL's name).
    pub fn cipher(&self) -> Option<&'static str> {
        self.session.cipher()
    }

    /// The UDP socket (connected to the server).
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Encrypts and sends one CoAP datagram.
    pub fn send(&mut self, plaintext: &[u8]) -> Result<(), DtlsError> {
        self.session.write(plaintext).map_err(session_err)?;
        self.flush()
    }

    /// Encrypts and sends one CoAP datagram given in two parts.
    pub fn send_parts(&mut self, head: &[u8], tail: &[u8]) -> Result<(), DtlsError> {
        if tail.is_empty() {
            return self.send(head);
        }
        let mut v = Vec::with_capacity(head.len() + tail.len());
        v.extend_from_slice(head);
        v.extend_from_slice(tail);
        self.send(&v)
    }

    /// Waits up to `timeout` for one decrypted CoAP datagram; copies it into
    /// `out` and returns its length. `Ok(None)` on timeout.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<Option<usize>, DtlsError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pt) = self.inbox.pop_front() {
                let n = pt.len().min(out.len());
                out[..n].copy_from_slice(&pt[..n]);
                return Ok(Some(n));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.sock
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
            match self.sock.recv(&mut self.buf) {
                Ok(n) => {
                    let inbox = &mut self.inbox;
                    self.session
                        .feed(&self.buf[..n], &mut self.plain, &mut |pt| {
                            inbox.push_back(pt.to_vec())
                        })
                        .map_err(session_err)?;
                    self.flush()?;
                }
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends close_notify.
    pub fn close(mut self) {
        self.session.close();
        let _ = self.flush();
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn handshake_err(e: SessionError) -> DtlsError {
    match e {
        SessionError::Closed => DtlsError::Handshake("the server closed the session".into()),
        SessionError::Fatal(t) => DtlsError::Handshake(t),
    }
}

fn session_err(e: SessionError) -> DtlsError {
    match e {
        SessionError::Closed => DtlsError::Closed,
        SessionError::Fatal(t) => DtlsError::Handshake(t),
    }
}
