//! The few system calls std and mio do not offer: the file-descriptor limit,
//! batched datagram I/O on a connected socket, and per-thread CPU time.

use std::io;
use std::os::fd::RawFd;
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

/// Receive buffers for one `recvmmsg`, allocated once.
pub struct RecvBatch {
    bufs: Box<[[u8; RX_BUF]; BATCH]>,
    lens: [usize; BATCH],
}

impl RecvBatch {
    /// Zeroed buffers.
    pub fn new() -> RecvBatch {
        RecvBatch {
            bufs: Box::new([[0; RX_BUF]; BATCH]),
            lens: [0; BATCH],
        }
    }

    /// Receives up to [`BATCH`] datagrams from the connected, non-blocking
    /// socket `fd`; returns how many (at least 1) or the error (`WouldBlock`
    /// when none is waiting).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        // SAFETY: all-zero is a valid iovec/mmsghdr (null pointers, zero lengths).
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        let mut hdr: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for ((v, h), b) in iov.iter_mut().zip(hdr.iter_mut()).zip(self.bufs.iter_mut()) {
            v.iov_base = b.as_mut_ptr().cast();
            v.iov_len = RX_BUF;
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at one live iovec over a live buffer of
        // RX_BUF bytes; the kernel writes at most that much into each.
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
        for (l, h) in self.lens.iter_mut().zip(hdr.iter()).take(n) {
            *l = (h.msg_len as usize).min(RX_BUF);
        }
        Ok(n)
    }

    /// Datagram `i` of the last [`RecvBatch::recv`].
    pub fn get(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }
}

/// Whether UDP generic segmentation offload works here: 0 unknown, 1 yes,
/// 2 no (then every batch goes by `sendmmsg`).
static GSO: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sends the first `n` (<= [`BATCH`]) of `msgs`, each `len` bytes, on the
/// connected, non-blocking socket `fd`; returns how many went out.
///
/// With `gso`, the batch (all requests have the same length) leaves in one
/// `sendmsg` with a `UDP_SEGMENT` of `len`, which the kernel splits into
/// ordinary datagrams before delivery: the server gets the same datagrams,
/// but all of them in its socket at once (burst arrivals).
pub fn send_batch(
    fd: RawFd,
    msgs: &mut [Box<[u8]>],
    len: usize,
    n: usize,
    gso: bool,
) -> io::Result<usize> {
    let n = n.min(BATCH).min(msgs.len());
    if gso && n > 1 && n * len <= 65_000 && GSO.load(std::sync::atomic::Ordering::Relaxed) != 2 {
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
    send_mmsg(fd, msgs, len, n)
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
fn send_mmsg(fd: RawFd, msgs: &mut [Box<[u8]>], len: usize, n: usize) -> io::Result<usize> {
    let n = n.min(BATCH).min(msgs.len());
    // SAFETY: all-zero is a valid iovec/mmsghdr (null pointers, zero lengths).
    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
    let mut hdr: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for ((v, h), m) in iov
        .iter_mut()
        .zip(hdr.iter_mut())
        .zip(msgs.iter_mut())
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
