//! The few system calls std and mio do not offer: the file-descriptor limit,
//! batched datagram I/O on a connected socket, and per-thread CPU time.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Datagrams moved per batched system call.
pub const BATCH: usize = 32;
/// Receive buffer per datagram: an Ethernet MTU; longer responses are
/// truncated, which the classification tolerates (the header and token come
/// first).
pub const RX_BUF: usize = 1500;

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `want` is a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Ok(lim.rlim_cur)
}

/// CPU time (user + system) the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Receive buffer per message with UDP GRO: the largest UDP payload, which
/// bounds a coalesced train.
pub const GRO_BUF: usize = 65_535;

/// Asks the kernel to hand trains of equal datagrams from one sender to
/// `fd` as one message (`UDP_GRO`), or (`on` false) to stop; false where
/// the kernel refused.
///
/// On loopback this only changes anything for datagrams the peer sent as one
/// `UDP_SEGMENT` train: the kernel then queues the train once instead of
/// splitting it into datagrams on delivery, and one receive returns all of
/// it. Datagrams sent one by one arrive as before.
pub fn set_gro(fd: RawFd, on: bool) -> bool {
    set_int_option(fd, libc::SOL_UDP, libc::UDP_GRO, on.into()).is_ok()
}

/// `setsockopt` of an int-valued option.
fn set_int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` is a live c_int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Receive buffers for one `recvmmsg`, allocated once.
///
/// Invariant: after a receive returning `n`, `lens[i] <= stride` and
/// `segs[i]` is in `1..=max(lens[i], 1)` for `i < n`.
pub struct RecvBatch {
    bufs: Box<[u8]>,
    stride: usize,
    lens: [usize; BATCH],
    /// Segment length of each message: the train's datagram length when the
    /// kernel coalesced one (`UDP_GRO`), else the message's own length.
    segs: [usize; BATCH],
    gro: bool,
    /// Shared sockets: each message's sender and the local address it was
    /// sent to (`IP_PKTINFO`), which names the client.
    addressed: bool,
    from: [libc::sockaddr_in; BATCH],
    to: [u32; BATCH],
}

impl RecvBatch {
    /// Zeroed buffers: [`RX_BUF`] per message, or [`GRO_BUF`] with `gro`
    /// (for sockets where [`set_gro`] turned it on).
    pub fn new(gro: bool) -> RecvBatch {
        let stride = if gro { GRO_BUF } else { RX_BUF };
        RecvBatch {
            bufs: vec![0; stride * BATCH].into_boxed_slice(),
            stride,
            lens: [0; BATCH],
            segs: [1; BATCH],
            gro,
            addressed: false,
            // SAFETY: all-zero is a valid sockaddr_in.
            from: unsafe { std::mem::zeroed() },
            to: [0; BATCH],
        }
    }

    /// Like [`RecvBatch::new`], for a shared socket opened by
    /// [`shared_socket`]: also records each message's sender and the
    /// IPv4 address it was sent to ([`RecvBatch::addresses`]).
    pub fn addressed(gro: bool) -> RecvBatch {
        RecvBatch {
            addressed: true,
            ..RecvBatch::new(gro)
        }
    }

    /// Message `i`'s sender and the local IPv4 address it was sent to;
    /// `None` unless [`RecvBatch::addressed`] and the kernel said.
    pub fn addresses(&self, i: usize) -> Option<(SocketAddrV4, Ipv4Addr)> {
        if !self.addressed || self.from[i].sin_family != libc::AF_INET as libc::sa_family_t {
            return None;
        }
        let f = &self.from[i];
        let from = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(f.sin_addr.s_addr)),
            u16::from_be(f.sin_port),
        );
        (self.to[i] != 0).then(|| (from, Ipv4Addr::from(self.to[i])))
    }

    /// Receives up to [`BATCH`] messages from the connected, non-blocking
    /// socket `fd`; returns how many (at least 1) or the error (`WouldBlock`
    /// when none is waiting). With GRO one message may hold several
    /// datagrams: see [`RecvBatch::datagrams`].
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        // SAFETY: all-zero is a valid iovec/mmsghdr (null pointers, zero lengths).
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        let mut hdr: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        // Room for an in_pktinfo and an int cmsg per message, aligned for
        // cmsghdr.
        let mut cbufs = [[0u64; 8]; BATCH];
        let stride = self.stride;
        for ((((v, h), b), c), f) in iov
            .iter_mut()
            .zip(hdr.iter_mut())
            .zip(self.bufs.chunks_exact_mut(stride))
            .zip(cbufs.iter_mut())
            .zip(self.from.iter_mut())
        {
            v.iov_base = b.as_mut_ptr().cast();
            v.iov_len = stride;
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
            if self.gro || self.addressed {
                h.msg_hdr.msg_control = c.as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = std::mem::size_of_val(c) as _;
            }
            if self.addressed {
                f.sin_family = 0;
                h.msg_hdr.msg_name = (f as *mut libc::sockaddr_in).cast();
                h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as _;
            }
        }
        // SAFETY: every header points at one live iovec over a live buffer of
        // `stride` bytes, and with GRO or addresses at a live control buffer
        // and a live sockaddr_in of the lengths given; the kernel writes at
        // most that much into each.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                hdr.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for (i, h) in hdr.iter().enumerate().take(n) {
            let len = (h.msg_len as usize).min(stride);
            self.lens[i] = len;
            let (seg, to) = control(&h.msg_hdr);
            self.segs[i] = seg.filter(|&s| s > 0 && s < len).unwrap_or(len.max(1));
            self.to[i] = to.unwrap_or(0);
        }
        Ok(n)
    }

    /// The datagrams of message `i` of the last [`RecvBatch::recv`]: one,
    /// or every datagram of a coalesced train (the last may be shorter).
    pub fn datagrams(&self, i: usize) -> std::slice::Chunks<'_, u8> {
        let start = i * self.stride;
        self.bufs[start..start + self.lens[i]].chunks(self.segs[i])
    }
}

/// From a received message's control messages: the datagram length of a
/// coalesced train (`UDP_GRO`) and the local IPv4 address the message was
/// sent to (`IP_PKTINFO`, host order).
fn control(msg: &libc::msghdr) -> (Option<usize>, Option<u32>) {
    let (mut seg, mut to) = (None, None);
    if msg.msg_control.is_null() {
        return (seg, to);
    }
    // SAFETY: `msg` was filled in by recvmmsg; CMSG_FIRSTHDR/NXTHDR stay
    // within msg_control..msg_control + msg_controllen, and each cmsg's data
    // is as long as its type says.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(msg);
        while !cm.is_null() {
            match ((*cm).cmsg_level, (*cm).cmsg_type) {
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    let v = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>());
                    seg = usize::try_from(v).ok();
                }
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let pi =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::in_pktinfo>());
                    to = Some(u32::from_be(pi.ipi_addr.s_addr));
                }
                _ => {}
            }
            cm = libc::CMSG_NXTHDR(msg, cm);
        }
    }
    (seg, to)
}

/// A non-blocking IPv4 UDP socket on the wildcard address and an
/// ephemeral port that reports each datagram's local destination
/// (`IP_PKTINFO`): the one socket all clients of a generator thread share,
/// each sending from its own loopback address with [`send_from`]. It has
/// to be on the wildcard address to receive what is sent to all of them;
/// answers from anyone but the target are counted as unmatched.
pub fn shared_socket() -> io::Result<std::net::UdpSocket> {
    let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    set_int_option(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Sends the first `n` (<= [`BATCH`]) of `msgs`, message `i` `lens[i]`
/// bytes long, to `target` on a [`shared_socket`], message `i` from the
/// local address `srcs[i]` (`IP_PKTINFO`), in one `sendmmsg`; returns how
/// many went out.
pub fn send_from<M: AsRef<[u8]>>(
    fd: RawFd,
    target: SocketAddrV4,
    msgs: &[M],
    lens: &[usize],
    srcs: &[Ipv4Addr],
    n: usize,
) -> io::Result<usize> {
    let n = n.min(BATCH).min(msgs.len()).min(srcs.len()).min(lens.len());
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    to.sin_family = libc::AF_INET as libc::sa_family_t;
    to.sin_port = target.port().to_be();
    to.sin_addr.s_addr = u32::from(*target.ip()).to_be();
    // SAFETY: all-zero is a valid iovec/mmsghdr (null pointers, zero lengths).
    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
    let mut hdr: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    // one in_pktinfo cmsg per message, aligned for cmsghdr
    let mut cbufs = [[0u64; 4]; BATCH];
    // SAFETY: CMSG_SPACE/CMSG_LEN only compute sizes.
    let (space, clen) = unsafe {
        let sz = std::mem::size_of::<libc::in_pktinfo>() as u32;
        (libc::CMSG_SPACE(sz), libc::CMSG_LEN(sz))
    };
    for i in 0..n {
        let m = msgs[i].as_ref();
        // the kernel only reads through this pointer
        iov[i].iov_base = m.as_ptr() as *mut libc::c_void;
        iov[i].iov_len = lens[i].min(m.len());
        let h = &mut hdr[i].msg_hdr;
        h.msg_name = (&mut to as *mut libc::sockaddr_in).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as _;
        h.msg_iov = &mut iov[i];
        h.msg_iovlen = 1;
        h.msg_control = cbufs[i].as_mut_ptr().cast();
        h.msg_controllen = space as _;
        // SAFETY: msg_control points at cbufs[i], 32 bytes, more than
        // CMSG_SPACE(in_pktinfo); the cmsg header and data fit in it.
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(h);
            (*cm).cmsg_level = libc::IPPROTO_IP;
            (*cm).cmsg_type = libc::IP_PKTINFO;
            (*cm).cmsg_len = clen as _;
            let mut pi: libc::in_pktinfo = std::mem::zeroed();
            pi.ipi_spec_dst.s_addr = u32::from(srcs[i]).to_be();
            std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<libc::in_pktinfo>(), pi);
        }
    }
    // SAFETY: the first `n` headers point at live iovecs, the live `to` and
    // live control buffers; the kernel only reads them.
    let sent =
        unsafe { libc::sendmmsg(fd, hdr.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// Whether UDP generic segmentation offload works here: 0 unknown, 1 yes,
/// 2 no (then every batch goes by `sendmmsg`).
static GSO: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sends the first `n` (<= [`BATCH`]) of `msgs`, message `i` `lens[i]`
/// bytes long, on the connected, non-blocking socket `fd`; returns how many
/// went out.
///
/// With `gso` and all `n` of the same length, the batch leaves in one
/// `sendmsg` with a `UDP_SEGMENT` of `len`, which the kernel splits into
/// ordinary datagrams before delivery: the server gets the same datagrams,
/// but all of them in its socket at once (burst arrivals).
pub fn send_batch(
    fd: RawFd,
    msgs: &mut [Box<[u8]>],
    lens: &[usize],
    n: usize,
    gso: bool,
) -> io::Result<usize> {
    let n = n.min(BATCH).min(msgs.len()).min(lens.len());
    let len = lens.first().copied().unwrap_or(0);
    if gso
        && n > 1
        && n * len <= 65_000
        && lens[..n].iter().all(|&l| l == len)
        && GSO.load(std::sync::atomic::Ordering::Relaxed) != 2
    {
        match send_gso(fd, msgs, len, n) {
            Ok(sent) => {
                GSO.store(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(sent);
            }
            Err(e)
                if GSO.load(std::sync::atomic::Ordering::Relaxed) == 0
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL)
                            | Some(libc::EOPNOTSUPP)
                            | Some(libc::ENOPROTOOPT)
                            | Some(libc::EIO)
                    ) =>
            {
                GSO.store(2, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    send_mmsg(fd, msgs, lens, n)
}

/// One `sendmsg` of `n` equal segments with `UDP_SEGMENT`; all or nothing.
fn send_gso(fd: RawFd, msgs: &mut [Box<[u8]>], len: usize, n: usize) -> io::Result<usize> {
    // SAFETY: all-zero is a valid iovec/msghdr.
    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
    for (v, m) in iov.iter_mut().zip(msgs.iter_mut()).take(n) {
        v.iov_base = m.as_mut_ptr().cast();
        v.iov_len = len.min(m.len());
    }
    // cmsg buffer for one u16, aligned for cmsghdr
    let mut cbuf = [0u64; 4];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as _;
    // SAFETY: msg_control points at `cbuf`, large enough for one cmsg of a u16.
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(&msg);
        (*cm).cmsg_level = libc::SOL_UDP;
        (*cm).cmsg_type = libc::UDP_SEGMENT;
        (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), len as u16);
    }
    // SAFETY: msg points at live iovecs over live buffers and at cbuf.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n)
}

/// `sendmmsg` of the first `n` of `msgs`.
fn send_mmsg(fd: RawFd, msgs: &mut [Box<[u8]>], lens: &[usize], n: usize) -> io::Result<usize> {
    let n = n.min(BATCH).min(msgs.len()).min(lens.len());
    // SAFETY: all-zero is a valid iovec/mmsghdr (null pointers, zero lengths).
    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
    let mut hdr: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for (((v, h), m), &len) in iov
        .iter_mut()
        .zip(hdr.iter_mut())
        .zip(msgs.iter_mut())
        .zip(lens)
        .take(n)
    {
        v.iov_base = m.as_mut_ptr().cast();
        v.iov_len = len.min(m.len());
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `n` headers each point at one live iovec over a live
    // buffer of at least `iov_len` bytes; the kernel only reads them.
    let sent =
        unsafe { libc::sendmmsg(fd, hdr.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        (a, b)
    }

    fn msgs(n: usize, len: usize) -> Vec<Box<[u8]>> {
        (0..n)
            .map(|i| (0..len).map(|j| (i * 31 + j) as u8).collect())
            .collect()
    }

    /// Reads until `want` datagrams came or 2 s passed; returns them and how
    /// many messages carried them.
    fn read_all(rx: &mut RecvBatch, fd: RawFd, want: usize) -> (Vec<Vec<u8>>, usize) {
        let end = std::time::Instant::now() + Duration::from_secs(2);
        let (mut got, mut messages) = (Vec::new(), 0);
        while got.len() < want && std::time::Instant::now() < end {
            match rx.recv(fd) {
                Ok(n) => {
                    messages += n;
                    for i in 0..n {
                        got.extend(rx.datagrams(i).map(<[u8]>::to_vec));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        (got, messages)
    }

    #[test]
    fn a_gso_train_is_received_whole_with_gro_and_split_into_its_datagrams() {
        let (tx, rx_sock) = pair();
        let gro = set_gro(rx_sock.as_raw_fd(), true);
        let mut sent = msgs(7, 23);
        assert_eq!(
            send_batch(tx.as_raw_fd(), &mut sent, &[23; 7], 7, true).unwrap(),
            7
        );
        let mut rx = RecvBatch::new(gro);
        let (got, messages) = read_all(&mut rx, rx_sock.as_raw_fd(), 7);
        let want: Vec<Vec<u8>> = sent.iter().map(|m| m.to_vec()).collect();
        assert_eq!(got, want);
        if gro && GSO.load(std::sync::atomic::Ordering::Relaxed) == 1 {
            assert_eq!(messages, 1, "the train stayed one message");
        }
    }

    #[test]
    fn with_gro_datagrams_sent_one_by_one_arrive_one_by_one() {
        let (tx, rx_sock) = pair();
        let gro = set_gro(rx_sock.as_raw_fd(), true);
        let sent = msgs(5, 40);
        for m in &sent {
            tx.send(m).unwrap();
        }
        let mut rx = RecvBatch::new(gro);
        let (got, messages) = read_all(&mut rx, rx_sock.as_raw_fd(), 5);
        assert_eq!(got, sent.iter().map(|m| m.to_vec()).collect::<Vec<_>>());
        assert_eq!(messages, 5);
    }

    #[test]
    fn without_gro_a_train_arrives_as_separate_datagrams() {
        let (tx, rx_sock) = pair();
        let mut sent = msgs(4, 17);
        assert_eq!(
            send_batch(tx.as_raw_fd(), &mut sent, &[17; 4], 4, true).unwrap(),
            4
        );
        let mut rx = RecvBatch::new(false);
        let (got, messages) = read_all(&mut rx, rx_sock.as_raw_fd(), 4);
        assert_eq!(got, sent.iter().map(|m| m.to_vec()).collect::<Vec<_>>());
        assert_eq!(messages, 4);
    }
}
