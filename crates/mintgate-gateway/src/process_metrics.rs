//! The process's own figures under the names every Prometheus client
//! library exports (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! ...), and `mintgate_build_info`, read from `/proc/self` at each scrape.
//! Where `/proc` has no such file, the family is left out.

/// What `/proc/self` says about this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessFigures {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Start time, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Threads.
    pub threads: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on file descriptors.
    pub max_fds: u64,
}

/// Parses `/proc/PID/stat` (after the command name, which may hold spaces
/// and parentheses): (utime + stime ticks, starttime ticks since boot,
/// num_threads, vsize bytes, rss pages).
pub fn parse_stat(stat: &str) -> Option<(u64, u64, u64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields after the name start at field 3 (state): index = field - 3
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some((n(14)? + n(15)?, n(22)?, n(20)?, n(23)?, n(24)?))
}

/// The figures of this process, or `None` without `/proc`.
pub fn read() -> Option<ProcessFigures> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (cpu, start, threads, vsize, rss) = parse_stat(&stat)?;
    // SAFETY: sysconf only reads system constants.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        0
    };
    Some(ProcessFigures {
        cpu_seconds: cpu as f64 / tick,
        resident_bytes: rss * page,
        virtual_bytes: vsize,
        start_time_seconds: boot as f64 + start as f64 / tick,
        threads,
        open_fds,
        max_fds,
    })
}

/// The `process_*` families (when `/proc` is there) and
/// `mintgate_build_info`.
pub fn collect(m: &mut crate::exposition::Exposition) {
    if let Some(p) = read() {
        m.counter(
            "process_cpu_seconds_total",
            "User and system CPU time spent, in seconds.",
            p.cpu_seconds,
        );
        m.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            p.resident_bytes,
        );
        m.gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            p.virtual_bytes,
        );
        m.gauge(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds.",
            p.start_time_seconds,
        );
        m.gauge("process_threads", "Threads.", p.threads);
        m.gauge("process_open_fds", "Open file descriptors.", p.open_fds);
        m.gauge(
            "process_max_fds",
            "The limit on open file descriptors.",
            p.max_fds,
        );
    }
    m.info(
        "mintgate_build",
        "The build: its version (always 1).",
        &[("version", env!("CARGO_PKG_VERSION"))],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_hostile_name_parses() {
        // the name holds spaces and a ')': the fields count from the last ')'
        let stat = "4242 (my ) prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((300, 12345, 7, 104_857_600, 2560)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn this_process_has_figures_that_make_sense() {
        let p = read().expect("/proc on Linux");
        assert!(p.threads >= 1);
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes);
        assert!(p.open_fds >= 3 && p.max_fds >= p.open_fds);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86_400.0 * 365.0);
        let out = crate::exposition::render(crate::exposition::Format::Prometheus, collect);
        assert!(out.contains("\nprocess_threads "), "{out}");
        assert!(out.contains("mintgate_build_info{version=\""), "{out}");
    }
}
