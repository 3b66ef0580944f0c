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

/// Sends the first `n` (<= [`BATCH`]) of `msgs`, each `len` bytes, on the
/// connected, non-blocking socket `fd`; returns how many went out.
pub fn send_batch(fd: RawFd, msgs: &mut [Box<[u8]>], len: usize, n: usize) -> io::Result<usize> {
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
