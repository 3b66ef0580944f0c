//! One DTLS session driven over an in-memory datagram stream.

use std::io::{self, Read, Write};
use std::sync::Arc;

use openssl::nid::Nid;
use openssl::ssl::{ErrorCode, Ssl, SslStream};

/// The in-memory datagram stream under a session: [`Read`] hands OpenSSL
/// the one datagram fed in (or `WouldBlock`), [`Write`] collects each
/// datagram OpenSSL emits. Buffers are reused.
#[derive(Default)]
pub struct DgramIo {
    inbox: Vec<u8>,
    has_in: bool,
    out: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

impl Read for DgramIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.has_in {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.has_in = false;
        // OpenSSL reads datagrams into a buffer of the largest record size;
        // a longer datagram cannot be a valid record and is cut (the record
        // layer then drops it).
        let n = self.inbox.len().min(buf.len());
        buf[..n].copy_from_slice(&self.inbox[..n]);
        Ok(n)
    }
}

impl Write for DgramIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(buf);
        self.out.push(v);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What feeding a datagram did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The handshake goes on.
    Handshaking,
    /// The handshake completed with this datagram.
    Established,
    /// Application data was delivered (this many datagrams).
    Data(usize),
    /// An established session consumed the datagram and gave nothing (a
    /// record it dropped: bad MAC, replay, or a handshake retransmission).
    Nothing,
}

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionError {
    /// The peer sent close_notify.
    Closed,
    /// A fatal error: failed handshake (wrong key, bad certificate) or an
    /// alert; the text is OpenSSL's.
    Fatal(String),
}

/// One DTLS session (either side).
pub struct Session {
    stream: SslStream<DgramIo>,
    established: bool,
    identity: Option<Arc<str>>,
}

/// `DTLS_CTRL_HANDLE_TIMEOUT` from OpenSSL's ssl.h (DTLSv1_handle_timeout
/// is a macro around SSL_ctrl and not in openssl-sys).
const DTLS_CTRL_HANDLE_TIMEOUT: libc::c_int = 74;

impl Session {
    /// Wraps `ssl` (accept or connect state already set) and sets its MTU.
    pub fn new(mut ssl: Ssl, mtu: u32) -> Result<Session, openssl::error::ErrorStack> {
        ssl.set_mtu(mtu)?;
        Ok(Session {
            stream: SslStream::new(ssl, DgramIo::default())?,
            established: false,
            identity: None,
        })
    }

    /// The handshake completed.
    pub fn is_established(&self) -> bool {
        self.established
    }

    /// The authenticated identity of the peer once established: the PSK
    /// identity it used, or the common name (else the whole subject) of its
    /// verified certificate.
    pub fn identity(&self) -> Option<&Arc<str>> {
        self.identity.as_ref()
    }

    /// The negotiated cipher suite's OpenSSL name.
    pub fn cipher(&self) -> Option<&'static str> {
        self.stream.ssl().current_cipher().map(|c| c.name())
    }

    /// The underlying OpenSSL session.
    pub fn ssl(&self) -> &openssl::ssl::SslRef {
        self.stream.ssl()
    }

    /// Starts (client) or continues the handshake without input.
    pub fn handshake(&mut self) -> Result<Progress, SessionError> {
        if self.established {
            return Ok(Progress::Nothing);
        }
        match self.stream.do_handshake() {
            Ok(()) => {
                self.on_established();
                Ok(Progress::Established)
            }
            Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => {
                Ok(Progress::Handshaking)
            }
            Err(e) => Err(fatal(&e)),
        }
    }

    fn on_established(&mut self) {
        self.established = true;
        let ssl = self.stream.ssl();
        let id = if let Some(cert) = ssl.peer_certificate() {
            let name = cert.subject_name();
            name.entries_by_nid(Nid::COMMONNAME)
                .next()
                .and_then(|e| e.data().to_string().ok())
                .or_else(|| {
                    let parts: Vec<String> = name
                        .entries()
                        .filter_map(|e| e.data().to_string().ok())
                        .collect();
                    (!parts.is_empty()).then(|| parts.join(","))
                })
        } else {
            ssl.psk_identity()
                .map(|i| String::from_utf8_lossy(i).into_owned())
        };
        self.identity = id.map(Arc::from);
    }

    /// Server side: starts the handshake with a second ClientHello whose
    /// cookie was already checked (see [`crate::server`]). OpenSSL's
    /// `DTLSv1_listen` reads it (the context's cookie callback approves the
    /// cookie), which sets the handshake and record sequence numbers as
    /// after its own HelloVerifyRequest (RFC 6347 4.2.1: the ServerHello
    /// is message 1 and repeats the hello's record sequence number); the
    /// handshake then goes on from that hello.
    pub fn accept_hello(&mut self, hello: &[u8]) -> Result<Progress, SessionError> {
        {
            let io = self.stream.get_mut();
            io.inbox.clear();
            io.inbox.extend_from_slice(hello);
            io.has_in = true;
        }
        // SAFETY: BIO_ADDR_new returns an owned address or null; it is
        // freed below whatever DTLSv1_listen returned, and the SSL is a
        // valid server-side object owned by the stream.
        let r = unsafe {
            let addr = BIO_ADDR_new();
            if addr.is_null() {
                -1
            } else {
                let r = DTLSv1_listen(self.stream.ssl().as_ptr(), addr);
                BIO_ADDR_free(addr);
                r
            }
        };
        self.stream.get_mut().has_in = false;
        if r != 1 {
            // leave no error behind for the next session on this thread
            let stack = openssl::error::ErrorStack::get();
            return Err(SessionError::Fatal(format!(
                "the ClientHello was not taken ({r}): {stack}"
            )));
        }
        self.handshake()
    }

    /// Feeds one received datagram. Application data goes to `app` one
    /// plaintext (one CoAP message) at a time, read into `buf`.
    pub fn feed(
        &mut self,
        datagram: &[u8],
        buf: &mut [u8],
        app: &mut dyn FnMut(&[u8]),
    ) -> Result<Progress, SessionError> {
        {
            let io = self.stream.get_mut();
            io.inbox.clear();
            io.inbox.extend_from_slice(datagram);
            io.has_in = true;
        }
        let mut progress = Progress::Nothing;
        if !self.established {
            progress = self.handshake()?;
            if progress == Progress::Handshaking {
                self.stream.get_mut().has_in = false;
                return Ok(progress);
            }
        }
        // a datagram may carry several records: read until OpenSSL wants more
        let mut n = 0;
        loop {
            match self.stream.ssl_read(buf) {
                Ok(0) => return Err(SessionError::Closed),
                Ok(len) => {
                    n += 1;
                    app(&buf[..len]);
                }
                Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => {
                    break
                }
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => return Err(SessionError::Closed),
                Err(e) => return Err(fatal(&e)),
            }
        }
        self.stream.get_mut().has_in = false;
        if n > 0 {
            Ok(Progress::Data(n))
        } else {
            Ok(progress)
        }
    }

    /// Encrypts one application datagram (one record).
    pub fn write(&mut self, plaintext: &[u8]) -> Result<(), SessionError> {
        match self.stream.ssl_write(plaintext) {
            Ok(_) => Ok(()),
            Err(e) => Err(fatal(&e)),
        }
    }

    /// Lets OpenSSL retransmit its last handshake flight if its timer ran
    /// out (DTLSv1_handle_timeout).
    pub fn handle_timeout(&mut self) {
        if self.established {
            return;
        }
        // SAFETY: a valid SSL owned by the stream; the control takes no
        // pointer argument.
        unsafe {
            openssl_sys::SSL_ctrl(
                self.stream.ssl().as_ptr(),
                DTLS_CTRL_HANDLE_TIMEOUT,
                0,
                std::ptr::null_mut(),
            );
        }
    }

    /// Sends close_notify (best effort).
    pub fn close(&mut self) {
        if self.established {
            let _ = self.stream.shutdown();
        }
    }

    /// Hands every datagram waiting to be sent to `send`, in order.
    pub fn drain(&mut self, send: &mut dyn FnMut(&[u8])) {
        let io = self.stream.get_mut();
        for v in io.out.drain(..) {
            send(&v);
            if io.spare.len() < 8 {
                io.spare.push(v);
            }
        }
    }

    /// Datagrams waiting to be sent.
    pub fn pending(&self) -> usize {
        self.stream.get_ref().out.len()
    }
}

use foreign_types::ForeignTypeRef as _;

// Not in openssl-sys: DTLSv1_listen and the BIO_ADDR it fills (OpenSSL
// 1.1.0 and later; libssl and libcrypto are linked by openssl-sys).
extern "C" {
    fn DTLSv1_listen(s: *mut openssl_sys::SSL, client: *mut libc::c_void) -> libc::c_int;
    fn BIO_ADDR_new() -> *mut libc::c_void;
    fn BIO_ADDR_free(a: *mut libc::c_void);
}

fn fatal(e: &openssl::ssl::Error) -> SessionError {
    let text = match e.ssl_error() {
        Some(stack) => stack
            .errors()
            .iter()
            .map(|x| x.reason().unwrap_or("unknown").to_string())
            .collect::<Vec<_>>()
            .join("; "),
        None => e.to_string(),
    };
    SessionError::Fatal(if text.is_empty() { e.to_string() } else { text })
}
