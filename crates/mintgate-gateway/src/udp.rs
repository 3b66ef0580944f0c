//! Batched UDP receive and send (recvmmsg/sendmmsg) straight into and out of
//! pool blocks, with scatter-gather for head + payload.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use mintgate_buf::BlockMut;
use mintgate_coap::server::Outgoing;
use mintgate_dtls::DtlsServer;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Binds a UDP socket; `[::]` also accepts IPv4 (v4-mapped).
pub fn bind(addr: SocketAddr, recv_buf: usize, send_buf: usize) -> io::Result<UdpSocket> {
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    // best effort: the kernel caps these at net.core.[rw]mem_max
    let _ = s.set_recv_buffer_size(recv_buf);
    let _ = s.set_send_buffer_size(send_buf);
    s.bind(&addr.into())?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    Ok(s.into())
}

fn to_socket_addr(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: ss is a sockaddr_storage of `len` valid bytes filled by the kernel.
    let sa = unsafe { SockAddr::new(*ss, len) };
    // v4-mapped peers on a dual-stack socket stay mapped: that is the form
    // the same socket needs to answer them.
    sa.as_socket()
}

/// Reusable receive state for one socket: headers, iovecs and addresses for
/// `batch` datagrams (allocated once).
pub struct RecvBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    addrs: Vec<libc::sockaddr_storage>,
}

// SAFETY: the raw pointers inside point into this struct's own vectors or
// into blocks passed to `recv`, and are rewritten before every call.
unsafe impl Send for RecvBatch {}

/// One received datagram.
pub struct Received {
    /// The sender.
    pub peer: SocketAddr,
    /// Its length (the block's data region is set to it).
    pub len: usize,
    /// The datagram was larger than the block and was cut.
    pub truncated: bool,
}

impl RecvBatch {
    /// State for up to `batch` datagrams per call.
    pub fn new(batch: usize) -> RecvBatch {
        RecvBatch {
            // SAFETY: all-zero is a valid mmsghdr/iovec/sockaddr_storage.
            hdrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            iovs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            addrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
        }
    }

    /// Receives up to `blocks.len()` datagrams, each into its block, whose
    /// data region is set to the datagram. Results go to `out`. With
    /// `blocking`, waits for the first one (up to the socket's read
    /// timeout); without, returns `WouldBlock` at once when none is queued.
    pub fn recv(
        &mut self,
        sock: &UdpSocket,
        blocks: &mut [BlockMut],
        out: &mut Vec<Received>,
        blocking: bool,
    ) -> io::Result<usize> {
        let flags = if blocking {
            libc::MSG_WAITFORONE
        } else {
            libc::MSG_DONTWAIT
        };
        let n = blocks.len().min(self.hdrs.len());
        for (i, block) in blocks.iter_mut().enumerate().take(n) {
            let buf = block.whole_block_mut();
            self.iovs[i] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: hdrs[..n] point at live iovecs/addresses/blocks set above.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as u32,
                flags,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let r = r as usize;
        for (i, block) in blocks.iter_mut().enumerate().take(r) {
            let h = &self.hdrs[i];
            let truncated = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let len = (h.msg_len as usize).min(block.capacity());
            block.set_data(0..len);
            let peer = to_socket_addr(&self.addrs[i], h.msg_hdr.msg_namelen)
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            out.push(Received {
                peer,
                len,
                truncated,
            });
        }
        Ok(r)
    }
}

/// Reusable send state: up to `batch` messages of two iovecs each.
///
/// On a coaps listener ([`SendBatch::with_dtls`]) each message is encrypted
/// by its peer's DTLS session when pushed and the record is queued instead.
pub struct SendBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 2]>,
    addrs: Vec<SockAddr>,
    msgs: Vec<Outgoing>,
    batch: usize,
    dtls: Option<Arc<DtlsServer>>,
    /// Encrypted records waiting (coaps), and spare buffers for them.
    records: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    plain: Vec<u8>,
}

// SAFETY: as for RecvBatch; the pointers are rebuilt on every flush.
unsafe impl Send for SendBatch {}

impl SendBatch {
    /// Room for `batch` messages per system call.
    pub fn new(batch: usize) -> SendBatch {
        let batch = batch.max(1);
        SendBatch {
            hdrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            iovs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            addrs: Vec::with_capacity(batch),
            msgs: Vec::with_capacity(batch),
            batch,
            dtls: None,
            records: Vec::new(),
            spare: Vec::new(),
            plain: Vec::new(),
        }
    }

    /// Encrypts every message for its peer's session of `dtls` (a coaps
    /// listener); `None` leaves the batch plain.
    pub fn with_dtls(mut self, dtls: Option<Arc<DtlsServer>>) -> SendBatch {
        self.dtls = dtls;
        self
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Queues a message; flushes first when the batch is full. Returns
    /// (sent, failed) of any flush it did; on a coaps listener a message
    /// whose peer has no session counts as failed.
    pub fn push(&mut self, sock: &UdpSocket, peer: SocketAddr, msg: Outgoing) -> (usize, usize) {
        let mut r = if self.addrs.len() >= self.batch {
            self.flush(sock)
        } else {
            (0, 0)
        };
        let Some(dtls) = self.dtls.clone() else {
            self.addrs.push(peer.into());
            self.msgs.push(msg);
            return r;
        };
        self.plain.clear();
        self.plain.extend_from_slice(&msg.head);
        self.plain.extend_from_slice(msg.tail_bytes());
        drop(msg);
        let (records, spare, addrs) = (&mut self.records, &mut self.spare, &mut self.addrs);
        let ok = dtls.send(peer, &self.plain, &mut |rec| {
            let mut v = spare.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(rec);
            records.push(v);
            addrs.push(peer.into());
        });
        if !ok {
            r.1 += 1;
        }
        r
    }

    /// Sends everything queued with as few `sendmmsg` calls as it takes.
    /// Returns (sent, failed); failed datagrams are dropped, not retried.
    pub fn flush(&mut self, sock: &UdpSocket) -> (usize, usize) {
        let n = self.addrs.len();
        if n == 0 {
            return (0, 0);
        }
        if n > self.hdrs.len() {
            // a message can take more than one record (never on the
            // default MTU); make room
            // SAFETY: all-zero is a valid mmsghdr/iovec.
            self.hdrs.resize_with(n, || unsafe { zeroed() });
            self.iovs.resize_with(n, || unsafe { zeroed() });
        }
        for i in 0..n {
            let (head, tail): (&[u8], &[u8]) = match self.msgs.get(i) {
                Some(m) => (&m.head, m.tail_bytes()),
                None => (&self.records[i], &[]),
            };
            self.iovs[i] = [
                libc::iovec {
                    iov_base: head.as_ptr() as *mut _,
                    iov_len: head.len(),
                },
                libc::iovec {
                    iov_base: tail.as_ptr() as *mut _,
                    iov_len: tail.len(),
                },
            ];
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_name = self.addrs[i].as_ptr() as *mut _;
            h.msg_hdr.msg_namelen = self.addrs[i].len();
            h.msg_hdr.msg_iov = self.iovs[i].as_mut_ptr();
            h.msg_hdr.msg_iovlen = if tail.is_empty() { 1 } else { 2 };
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
        }
        let (mut sent, mut failed) = (0usize, 0usize);
        let mut off = 0;
        while off < n {
            // SAFETY: hdrs[off..n] point at iovecs/addresses/blocks alive in self.
            let r = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    self.hdrs.as_mut_ptr().add(off),
                    (n - off) as u32,
                    0,
                )
            };
            if r <= 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // skip the datagram that failed (e.g. unreachable peer) and go on
                failed += 1;
                off += 1;
                continue;
            }
            sent += r as usize;
            off += r as usize;
        }
        self.msgs.clear();
        self.addrs.clear();
        for v in self.records.drain(..) {
            if self.spare.len() < self.batch {
                self.spare.push(v);
            }
        }
        (sent, failed)
    }
}

/// Sends one small datagram (Reset, empty ACK) right away; on a coaps
/// listener (`dtls`), encrypted by the peer's session.
pub fn send_small(
    sock: &UdpSocket,
    dtls: Option<&DtlsServer>,
    peer: SocketAddr,
    bytes: &[u8],
) -> io::Result<()> {
    let Some(d) = dtls else {
        return sock.send_to(bytes, peer).map(|_| ());
    };
    let mut r = Ok(());
    let ok = d.send(peer, bytes, &mut |rec| {
        if let Err(e) = sock.send_to(rec, peer) {
            r = Err(e);
        }
    });
    if !ok {
        return Err(io::Error::new(
            io::ErrorKind::NotConnected,
            "no DTLS session with the peer",
        ));
    }
    r
}
