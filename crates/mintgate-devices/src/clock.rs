//! The one clock of the direct path: `CLOCK_MONOTONIC` in nanoseconds, the
//! clock the kernel stamps GPIO edge events with (uAPI v2 default), so that a
//! kernel timestamp and a user-space reading can be subtracted.

/// Nanoseconds on `CLOCK_MONOTONIC` (read through the vDSO: no system call).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds since the Unix epoch (wall clock, for history records).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The smallest difference between two back-to-back [`now_ns`] readings
/// over `rounds` tries: what one timestamp costs, and the floor under every
/// latency this crate measures.
pub fn overhead_ns(rounds: usize) -> u64 {
    (0..rounds.max(1))
        .map(|_| {
            let a = now_ns();
            let b = now_ns();
            b.saturating_sub(a)
        })
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_and_cheap_enough_to_measure() {
        let a = super::now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::now_ns();
        assert!(b - a >= 2_000_000, "{a} {b}");
        assert!(super::overhead_ns(100) < 1_000_000);
        assert!(super::unix_ms() > 1_600_000_000_000);
    }
}
