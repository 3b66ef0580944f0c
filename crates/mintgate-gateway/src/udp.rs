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
    let mut storage = socket2::SockAddrStorage::zeroed();
    // SAFETY: ss is a sockaddr_storage of `len` valid bytes filled by the
    // kernel; the storage is one too (view_as's requirement), and SockAddr::new
    // reads only its first `len` bytes.
    let sa = unsafe {
        *storage.view_as::<libc::sockaddr_storage>() = *ss;
        SockAddr::new(storage, len)
    };
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

/// Most datagrams one `UDP_SEGMENT` send carries (the kernel's limit is 64
/// on older kernels).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one `UDP_SEGMENT` send carries (an IP datagram's payload).
const GSO_MAX_BYTES: usize = 65_000;
/// Largest datagram sent segmented: the kernel refuses segments that do
/// not fit the path MTU, and 1,400 fits Ethernet with room for tunnels.
const GSO_MAX_SEGMENT: usize = 1_400;

/// Room for one `cmsghdr` carrying a `u16`, aligned for it.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct SegmentCmsg([u8; 32]);

/// Reusable send state: up to `batch` messages of two iovecs each.
///
/// On a coaps listener ([`SendBatch::with_dtls`]) each message is encrypted
/// by its peer's DTLS session when pushed and the record is queued instead.
///
/// Where the kernel supports UDP generic segmentation offload, a flush
/// sends the messages for one peer that have the same length (the last
/// may be shorter) as one `UDP_SEGMENT` message: the same datagrams reach
/// the peer, but the stack is walked once for them instead of once each.
/// The first refusal (an old kernel) turns it off for this batch for good.
pub struct SendBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 2]>,
    cmsgs: Vec<SegmentCmsg>,
    /// Send order: message indices grouped by peer.
    order: Vec<usize>,
    /// Per header: how many messages it carries.
    segs: Vec<usize>,
    gso: bool,
    offloaded: u64,
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
            cmsgs: vec![SegmentCmsg([0; 32]); batch],
            order: Vec::with_capacity(batch),
            segs: Vec::with_capacity(batch),
            gso: cfg!(target_os = "linux"),
            offloaded: 0,
            addrs: Vec::with_capacity(batch),
            msgs: Vec::with_capacity(batch),
            batch,
            dtls: None,
            records: Vec::new(),
            spare: Vec::new(),
            plain: Vec::new(),
        }
    }

    /// Segmentation offload on (the default on Linux, where the kernel
    /// takes it) or off (every datagram its own message).
    pub fn with_gso(mut self, on: bool) -> SendBatch {
        self.gso = on && cfg!(target_os = "linux");
        self
    }

    /// Datagrams sent so far inside segmented (`UDP_SEGMENT`) messages.
    pub fn offloaded(&self) -> u64 {
        self.offloaded
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
    /// Returns (sent, failed) in datagrams; failed datagrams are dropped,
    /// not retried.
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
            self.cmsgs.resize(n, SegmentCmsg([0; 32]));
        }
        // group by peer; the index breaks ties, so a peer's datagrams keep
        // their order without a stable sort's scratch buffer
        self.order.clear();
        self.order.extend(0..n);
        if self.gso && n > 1 {
            let addrs = &self.addrs;
            self.order.sort_unstable_by(|&a, &b| {
                addr_key(&addrs[a]).cmp(addr_key(&addrs[b])).then(a.cmp(&b))
            });
        }
        for (slot, &i) in self.order.iter().enumerate() {
            let (head, tail) = self.parts(i);
            self.iovs[slot] = [
                libc::iovec {
                    iov_base: head.as_ptr() as *mut _,
                    iov_len: head.len(),
                },
                libc::iovec {
                    iov_base: tail.as_ptr() as *mut _,
                    iov_len: tail.len(),
                },
            ];
        }
        let (mut sent, mut failed) = (0usize, 0usize);
        let mut slot = 0;
        while slot < n {
            // headers from `slot` on, one per run of same-peer, same-size
            // datagrams (one per datagram without offload)
            self.segs.clear();
            let mut h = 0;
            let mut s = slot;
            while s < n {
                let k = self.run_len(s, n);
                let i = self.order[s];
                let seg = self.len_of(s);
                let hdr = &mut self.hdrs[h];
                hdr.msg_len = 0;
                hdr.msg_hdr.msg_name = self.addrs[i].as_ptr() as *mut _;
                hdr.msg_hdr.msg_namelen = self.addrs[i].len();
                // the run's iovecs are consecutive: [head, tail] per datagram
                hdr.msg_hdr.msg_iov = self.iovs[s].as_mut_ptr();
                hdr.msg_hdr.msg_iovlen = (2 * k) as _;
                hdr.msg_hdr.msg_flags = 0;
                if k > 1 {
                    let c = &mut self.cmsgs[h];
                    hdr.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
                    // SAFETY: CMSG_SPACE(2) <= 32 bytes, the buffer is
                    // 8-aligned, and CMSG_FIRSTHDR of a header whose control
                    // area is that buffer points into it.
                    unsafe {
                        hdr.msg_hdr.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as _;
                        let cm = libc::CMSG_FIRSTHDR(&hdr.msg_hdr);
                        (*cm).cmsg_level = libc::SOL_UDP;
                        (*cm).cmsg_type = libc::UDP_SEGMENT;
                        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg as u16);
                    }
                } else {
                    hdr.msg_hdr.msg_control = std::ptr::null_mut();
                    hdr.msg_hdr.msg_controllen = 0;
                }
                self.segs.push(k);
                h += 1;
                s += k;
            }
            let mut off = 0;
            while off < h {
                // SAFETY: hdrs[off..h] point at iovecs, addresses, control
                // buffers and blocks alive in self.
                let r = unsafe {
                    libc::sendmmsg(
                        sock.as_raw_fd(),
                        self.hdrs.as_mut_ptr().add(off),
                        (h - off) as u32,
                        0,
                    )
                };
                if r > 0 {
                    let segs = &self.segs[off..off + r as usize];
                    let done: usize = segs.iter().sum();
                    self.offloaded += segs.iter().filter(|&&k| k > 1).sum::<usize>() as u64;
                    sent += done;
                    slot += done;
                    off += r as usize;
                    continue;
                }
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                let refused = matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
                );
                if self.segs[off] > 1 && self.gso && refused {
                    // a kernel or device without UDP_SEGMENT: send the rest
                    // one datagram per message from now on
                    self.gso = false;
                    break;
                }
                // skip the datagram that failed (e.g. unreachable peer) and go on
                failed += self.segs[off];
                slot += self.segs[off];
                off += 1;
            }
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

    /// Head and tail of queued message `i` (a plain message, or a record).
    fn parts(&self, i: usize) -> (&[u8], &[u8]) {
        match self.msgs.get(i) {
            Some(m) => (&m.head, m.tail_bytes()),
            None => (&self.records[i], &[]),
        }
    }

    /// Length of the datagram in send slot `s`.
    fn len_of(&self, s: usize) -> usize {
        self.iovs[s][0].iov_len + self.iovs[s][1].iov_len
    }

    /// How many datagrams from send slot `s` go in one message: 1 without
    /// offload; otherwise the run for the same peer whose lengths equal the
    /// first's, the last possibly shorter, within the kernel's bounds.
    fn run_len(&self, s: usize, n: usize) -> usize {
        if !self.gso {
            return 1;
        }
        let seg = self.len_of(s);
        if seg == 0 || seg > GSO_MAX_SEGMENT {
            return 1;
        }
        let peer = addr_key(&self.addrs[self.order[s]]);
        let (mut k, mut bytes) = (1, seg);
        while s + k < n && k < GSO_MAX_SEGMENTS {
            let len = self.len_of(s + k);
            if addr_key(&self.addrs[self.order[s + k]]) != peer
                || len > seg
                || len == 0
                || bytes + len > GSO_MAX_BYTES
            {
                break;
            }
            k += 1;
            bytes += len;
            if len < seg {
                break; // a shorter one can only be the last
            }
        }
        k
    }
}

/// The bytes of a socket address, to compare and group peers.
fn addr_key(a: &SockAddr) -> &[u8] {
    // SAFETY: as_ptr points at a sockaddr_storage of which len bytes are
    // initialised, alive as long as `a`.
    unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), a.len() as usize) }
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

#[cfg(test)]
mod tests {
    use super::*;
    use mintgate_buf::{Layer, PartitionConfig, Pool};
    use mintgate_coap::server::Tail;

    fn msg(pool: &Pool, bytes: &[u8]) -> Outgoing {
        let mut b = pool.alloc(Layer::Send, bytes.len(), 0).expect("a block");
        assert!(b.append(Layer::Send, bytes));
        Outgoing {
            head: b.freeze(),
            tail: Tail::None,
        }
    }

    fn drain(sock: &UdpSocket) -> Vec<Vec<u8>> {
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = sock.recv(&mut buf) {
            got.push(buf[..n].to_vec());
        }
        got
    }

    /// Same-peer runs of equal length go out segmented; each peer still
    /// gets exactly its datagrams, each whole, in the order pushed. The
    /// same with offload off.
    #[test]
    fn every_peer_gets_its_datagrams_in_order_with_and_without_offload() {
        let pool = Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 256,
        }]);
        for gso in [true, false] {
            let tx = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let mut sb = SendBatch::new(64).with_gso(gso);
            let (mut want_a, mut want_b) = (Vec::new(), Vec::new());
            // interleaved peers; a: ten of 20 bytes, one of 7, then 20 again
            // (a run ends at a shorter one); b: sizes that change; one of
            // 1,500 bytes (never segmented)
            for i in 0..24u8 {
                let (to, want, len) = match i {
                    0..=9 => (&a, &mut want_a, 20),
                    10 => (&a, &mut want_a, 7),
                    11..=13 => (&a, &mut want_a, 20),
                    14 => (&b, &mut want_b, 1500),
                    _ => (&b, &mut want_b, 10 + usize::from(i % 3)),
                };
                let bytes: Vec<u8> = (0..len).map(|k| i.wrapping_add(k as u8)).collect();
                want.push(bytes.clone());
                let (sent, failed) =
                    sb.push(&tx, to.local_addr().expect("addr"), msg(&pool, &bytes));
                assert_eq!((sent, failed), (0, 0));
            }
            assert_eq!(sb.flush(&tx), (24, 0), "gso {gso}");
            // a's two runs of 20-byte datagrams (10 + the 7 closing it, then
            // 3) and b's equal neighbours go segmented; nothing without
            if gso {
                assert!(sb.offloaded() >= 14, "offloaded {}", sb.offloaded());
            } else {
                assert_eq!(sb.offloaded(), 0);
            }
            assert!(sb.is_empty());
            assert_eq!(drain(&a), want_a, "gso {gso}");
            assert_eq!(drain(&b), want_b, "gso {gso}");
        }
        assert_eq!(pool.outstanding(), 0, "every block back after the flush");
    }
}
