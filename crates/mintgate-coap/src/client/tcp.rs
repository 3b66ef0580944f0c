//! The client side of one CoAP connection over a reliable transport (RFC
//! 8323: TCP or TLS, or WebSockets), sans-IO.
//!
//! [`ClientConnection::new`] queues our CSM; [`ClientConnection::request`]
//! queues a request frame with a fresh token (held to the server's
//! Max-Message-Size once its CSM has come, 1152 before); the caller writes
//! [`ClientConnection::output`] to the socket and feeds what it reads to
//! [`ClientConnection::receive`], which answers Ping with Pong, takes the
//! server's CSM, and returns responses by token. No retransmission and no
//! message IDs: the transport is reliable. Frames are held to our own
//! Max-Message-Size, so the input buffer is bounded.
//!
//! Over WebSockets ([`ClientConnection::websocket`]) a frame has no length
//! field: each is one binary WebSocket message, taken from
//! [`ClientConnection::next_message`] and fed back whole to
//! [`ClientConnection::receive_message`].

use std::fmt;

use crate::wire::tcp::{frame_len, FrameError, Outbox, DEFAULT_MAX_MESSAGE_SIZE};
use crate::wire::{Code, Framing, OptionNumber, RawOption, Signal, TcpPacket, TcpRepr};

/// A response as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpResponse {
    /// The token of the request it answers.
    pub token: Vec<u8>,
    /// The code.
    pub code: Code,
    /// The options, in message order.
    pub options: Vec<(OptionNumber, Vec<u8>)>,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Why the connection cannot go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectionError {
    /// The server sent a malformed frame or one over our Max-Message-Size.
    Malformed(FrameError),
    /// A frame larger than our Max-Message-Size.
    TooLarge(u64),
    /// The server aborted the connection (its diagnostic text).
    Aborted(String),
    /// The server released the connection.
    Released,
    /// A request larger than the server's Max-Message-Size.
    RequestTooLarge {
        /// Encoded size.
        size: usize,
        /// The server's limit.
        max: u32,
    },
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionError::Malformed(e) => write!(f, "malformed message from the server: {e}"),
            ConnectionError::TooLarge(n) => {
                write!(f, "the server sent a {n}-byte message, more than we take")
            }
            ConnectionError::Aborted(why) => write!(f, "the server aborted the connection: {why}"),
            ConnectionError::Released => f.write_str("the server released the connection"),
            ConnectionError::RequestTooLarge { size, max } => write!(
                f,
                "request of {size} bytes exceeds the server's Max-Message-Size of {max}"
            ),
        }
    }
}

impl std::error::Error for ConnectionError {}

/// The client side of one RFC 8323 connection.
pub struct ClientConnection {
    framing: Framing,
    max_message_size: u32,
    peer_max: u32,
    peer_csm: bool,
    peer_block_wise: bool,
    next_token: u64,
    inbuf: Vec<u8>,
    out: Outbox,
}

impl ClientConnection {
    /// A connection that takes frames of up to `max_message_size` bytes;
    /// our CSM is the first output.
    pub fn new(max_message_size: u32, token_seed: u64) -> ClientConnection {
        ClientConnection::with_framing(Framing::Stream, max_message_size, token_seed)
    }

    /// As [`ClientConnection::new`], over WebSockets (RFC 8323 section 4).
    pub fn websocket(max_message_size: u32, token_seed: u64) -> ClientConnection {
        ClientConnection::with_framing(Framing::WebSocket, max_message_size, token_seed)
    }

    fn with_framing(framing: Framing, max_message_size: u32, token_seed: u64) -> ClientConnection {
        let mut out = Outbox::new();
        Signal::Csm {
            max_message_size: Some(max_message_size),
            block_wise: true,
        }
        .emit_vec(framing, &[], out.buf());
        out.end_message();
        ClientConnection {
            framing,
            max_message_size,
            peer_max: DEFAULT_MAX_MESSAGE_SIZE,
            peer_csm: false,
            peer_block_wise: false,
            next_token: token_seed,
            inbuf: Vec::new(),
            out,
        }
    }

    /// Whether the server's CSM has come.
    pub fn peer_csm_received(&self) -> bool {
        self.peer_csm
    }

    /// Whether the server's CSM offered Block-wise transfer: BERT (RFC 8323
    /// section 6) may be used, as ours offers it too.
    pub fn peer_block_wise(&self) -> bool {
        self.peer_block_wise
    }

    /// The server's Max-Message-Size (1152 until its CSM).
    pub fn peer_max_message_size(&self) -> u32 {
        self.peer_max
    }

    /// Queues a request; returns its token. Options may come in any order
    /// (sorted here, repeated ones keep their order).
    pub fn request(
        &mut self,
        code: Code,
        options: &[(OptionNumber, Vec<u8>)],
        payload: &[u8],
    ) -> Result<Vec<u8>, ConnectionError> {
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token.to_be_bytes().to_vec();
        let mut opts: Vec<RawOption<'_>> = options
            .iter()
            .map(|(n, v)| RawOption {
                number: *n,
                value: v,
            })
            .collect();
        opts.sort_by_key(|o| o.number);
        let repr = TcpRepr {
            code,
            token: &token,
            options: opts,
            payload,
        };
        let size = repr.buffer_len(self.framing);
        if size > self.peer_max as usize {
            return Err(ConnectionError::RequestTooLarge {
                size,
                max: self.peer_max,
            });
        }
        repr.emit_vec(self.framing, self.out.buf()).map_err(|_| {
            ConnectionError::RequestTooLarge {
                size,
                max: self.peer_max,
            }
        })?;
        self.out.end_message();
        Ok(token)
    }

    // output, next_message and consume_output as in server/tcp.rs's
    // Connection: one-line public methods of each connection type over the
    // shared output buffer.
    /// Bytes to write to the transport (all of them, in order).
    pub fn output(&self) -> &[u8] {
        self.out.bytes()
    }

    /// The first whole message of the output (over WebSockets, one binary
    /// WebSocket message); [`ClientConnection::consume_output`] its length
    /// once sent.
    pub fn next_message(&self) -> Option<&[u8]> {
        self.out.next_message()
    }

    /// Drops the first `n` bytes of the output, written.
    pub fn consume_output(&mut self, n: usize) {
        self.out.consume(n);
    }

    /// Takes one WebSocket message (one frame, Len 0); appends the response
    /// it is, if it is one.
    pub fn receive_message(
        &mut self,
        msg: &[u8],
        responses: &mut Vec<TcpResponse>,
    ) -> Result<(), ConnectionError> {
        debug_assert_eq!(self.framing, Framing::WebSocket);
        if msg.len() > self.max_message_size as usize {
            return Err(ConnectionError::TooLarge(msg.len() as u64));
        }
        self.frame(msg, responses)
    }

    /// Takes bytes read from the transport; appends the responses found.
    pub fn receive(
        &mut self,
        data: &[u8],
        responses: &mut Vec<TcpResponse>,
    ) -> Result<(), ConnectionError> {
        self.inbuf.extend_from_slice(data);
        loop {
            let n = match frame_len(&self.inbuf).map_err(ConnectionError::Malformed)? {
                None => return Ok(()),
                Some(n) if n > self.max_message_size as u64 => {
                    return Err(ConnectionError::TooLarge(n))
                }
                Some(n) if n as usize > self.inbuf.len() => return Ok(()),
                Some(n) => n as usize,
            };
            let frame: Vec<u8> = self.inbuf.drain(..n).collect();
            self.frame(&frame, responses)?;
        }
    }

    fn frame(
        &mut self,
        frame: &[u8],
        responses: &mut Vec<TcpResponse>,
    ) -> Result<(), ConnectionError> {
        let p = TcpPacket::new_checked(frame, self.framing).map_err(ConnectionError::Malformed)?;
        if p.is_signal() {
            match Signal::parse(&p) {
                Ok(Signal::Csm {
                    max_message_size,
                    block_wise,
                }) => {
                    self.peer_csm = true;
                    self.peer_block_wise = block_wise;
                    if let Some(m) = max_message_size {
                        self.peer_max = m;
                    }
                }
                Ok(Signal::Ping { custody }) => {
                    Signal::Pong { custody }.emit_vec(self.framing, p.token(), self.out.buf());
                    self.out.end_message();
                }
                Ok(Signal::Pong { .. }) => {}
                Ok(Signal::Release { .. }) => return Err(ConnectionError::Released),
                Ok(Signal::Abort { diagnostic, .. }) => {
                    return Err(ConnectionError::Aborted(
                        String::from_utf8_lossy(diagnostic).into_owned(),
                    ))
                }
                Err(e) => return Err(ConnectionError::Aborted(format!("(ours) {e}"))),
            }
            return Ok(());
        }
        let code = p.code();
        if matches!(code.class(), 2 | 4 | 5) {
            responses.push(TcpResponse {
                token: p.token().to_vec(),
                code,
                options: p.options().map(|o| (o.number, o.value.to_vec())).collect(),
                payload: p.payload().to_vec(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tcp::{Connection, ConnectionConfig};
    use crate::server::{handle_request, Request, Resource, Router};
    use mintgate_buf::{PartitionConfig, Pool};
    use std::time::Instant;

    #[test]
    fn talks_to_the_server_connection() {
        let mut router = Router::new();
        router
            .add(Resource::new("a/b").put(|req, rb| {
                rb.set_code(Code::CHANGED);
                rb.write(req.payload());
            }))
            .unwrap();
        let pool = Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 8,
        }]);
        let mut serve = |req: &Request<'_>, max: usize| handle_request(&router, &pool, req, 0, max);
        let mut server = Connection::new(
            Framing::Stream,
            "127.0.0.1:9".parse().unwrap(),
            ConnectionConfig::default(),
        );
        let mut client = ClientConnection::new(4096, 7);
        let opts = vec![
            (OptionNumber::URI_PATH, b"a".to_vec()),
            (OptionNumber::CONTENT_FORMAT, vec![]),
            (OptionNumber::URI_PATH, b"b".to_vec()),
        ];
        let token = client.request(Code::PUT, &opts, b"42").unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            server.receive(Instant::now(), client.output(), &mut serve);
            let n = client.output().len();
            client.consume_output(n);
            client.receive(server.output(), &mut got).unwrap();
            let n = server.output().len();
            server.consume_output(n);
        }
        assert!(client.peer_csm_received());
        assert_eq!(client.peer_max_message_size(), 8192);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].token, token);
        assert_eq!(got[0].code, Code::CHANGED);
        assert_eq!(got[0].payload, b"42");
    }

    #[test]
    fn talks_to_the_server_connection_over_websockets() {
        let mut router = Router::new();
        router
            .add(Resource::new("r").get(|_, rb| {
                rb.write(b"hello");
            }))
            .unwrap();
        let pool = Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 8,
        }]);
        let mut serve = |req: &Request<'_>, max: usize| handle_request(&router, &pool, req, 0, max);
        let mut server = Connection::new(
            Framing::WebSocket,
            "127.0.0.1:9".parse().unwrap(),
            ConnectionConfig::default(),
        );
        let mut client = ClientConnection::websocket(4096, 7);
        let token = client
            .request(Code::GET, &[(OptionNumber::URI_PATH, b"r".to_vec())], b"")
            .unwrap();
        let mut got = Vec::new();
        // messages cross one at a time, as WebSocket messages do
        for _ in 0..3 {
            while let Some(m) = client.next_message().map(<[u8]>::to_vec) {
                assert_eq!(m[0] >> 4, 0, "Len is 0 over WebSockets");
                server.receive_message(&m, &mut serve);
                client.consume_output(m.len());
            }
            while let Some(m) = server.next_message().map(<[u8]>::to_vec) {
                client.receive_message(&m, &mut got).unwrap();
                server.consume_output(m.len());
            }
        }
        assert!(client.peer_csm_received());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].token, token);
        assert_eq!(got[0].payload, b"hello");
        // a message over our Max-Message-Size is refused whole
        let big = vec![0u8; 5000];
        assert_eq!(
            client.receive_message(&big, &mut got),
            Err(ConnectionError::TooLarge(5000))
        );
    }
}
