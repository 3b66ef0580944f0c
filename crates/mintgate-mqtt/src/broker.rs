//! Brokers: the embedded one (rumqttd, the default, so that nothing external
//! is needed) and a launcher for a private mosquitto (tests and the lab).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::conn::BrokerUrl;

/// The embedded rumqttd broker (MQTT 3.1.1 on one port, MQTT 5 on another).
///
/// rumqttd has no shutdown: its threads live until the process exits.
/// Start one per process (the lab, `mintgate broker`) and reuse it.
#[derive(Debug)]
pub struct EmbeddedBroker {
    v4: SocketAddr,
    v5: SocketAddr,
}

/// A free TCP port on `ip` (it may be taken again before it is used; the
/// callers retry or accept the small race on loopback).
pub fn free_port(ip: std::net::IpAddr) -> io::Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

#[cfg(feature = "broker")]
fn wait_listening(addr: SocketAddr, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether the process `pid` itself holds a socket listening on `addr`.
///
/// A connect that succeeds is not enough: the port was only found free,
/// and another test's socket may take it before mosquitto binds (mosquitto
/// then exits, and the connect reached the other one). On Linux the
/// answer is read from /proc: a LISTEN entry of /proc/net/tcp for the
/// address whose inode is one of the child's descriptors.
#[cfg(target_os = "linux")]
pub fn child_listens(pid: u32, addr: SocketAddr) -> bool {
    let SocketAddr::V4(v4) = addr else {
        return false;
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .map(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
            .unwrap_or(false)
    })
}

#[cfg(not(target_os = "linux"))]
pub fn child_listens(_pid: u32, addr: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Sets TCP_NODELAY on this process's listening TCP sockets bound to one of
/// `addrs`; returns how many it found.
///
/// Why: rumqttd 0.20 never sets TCP_NODELAY on the connections it accepts,
/// so a PUBACK written while an earlier one is still unacknowledged waits
/// for the client's delayed ACK (about 40 ms on Linux): windowed publishing
/// through the embedded broker ran at a bimodal 16 ms / 50 ms per 1,000
/// messages. On Linux an accepted socket inherits TCP_NODELAY from its
/// listener, so setting it on rumqttd's listeners (found among our own
/// descriptors by local address) covers every connection accepted after.
#[cfg(all(target_os = "linux", feature = "broker"))]
fn nodelay_on_listeners(addrs: &[SocketAddr]) -> io::Result<usize> {
    use std::os::fd::BorrowedFd;
    let mut found = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Some(fd) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: `fd` is one of this process's open descriptors (listed
        // just now) and is only borrowed for the checks and the one
        // setsockopt below. Should another thread close it meanwhile, the
        // calls fail with EBADF, or act on a reused number only if that is
        // again a listening socket on one of `addrs`: rumqttd's.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&bfd);
        let ours = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .is_some_and(|a| addrs.contains(&a));
        if ours && sock.is_listener().unwrap_or(false) {
            sock.set_tcp_nodelay(true)?;
            found += 1;
        }
    }
    Ok(found)
}

#[cfg(all(not(target_os = "linux"), feature = "broker"))]
fn nodelay_on_listeners(_addrs: &[SocketAddr]) -> io::Result<usize> {
    Ok(0)
}

/// What a build without the `broker` feature says when asked for the
/// embedded broker.
pub const NOT_BUILT: &str = "this mintgate was built without the embedded MQTT broker (cargo \
     feature `broker`, on by default); give an external broker's URL (`--mqtt URL`, \
     `[mqtt] broker = \"mqtt://HOST:PORT\"`) or rebuild with `--features broker`";

impl EmbeddedBroker {
    /// Starts rumqttd with MQTT 3.1.1 on `v4` and MQTT 5 on `v5` (port 0: a
    /// free port) and waits until both accept connections. Without the
    /// `broker` feature: an [`io::ErrorKind::Unsupported`] error saying
    /// [`NOT_BUILT`].
    pub fn start(v4: SocketAddr, v5: SocketAddr) -> io::Result<EmbeddedBroker> {
        #[cfg(feature = "broker")]
        return Self::start_rumqttd(v4, v5);
        #[cfg(not(feature = "broker"))]
        {
            let _ = (v4, v5);
            Err(io::Error::new(io::ErrorKind::Unsupported, NOT_BUILT))
        }
    }

    #[cfg(feature = "broker")]
    fn start_rumqttd(v4: SocketAddr, v5: SocketAddr) -> io::Result<EmbeddedBroker> {
        // Free ports are picked while both probes are held, so that the two
        // listeners never get the same one (two picks in a row may: the
        // second server then fails to bind, and MQTT 5 clients reach the
        // 3.1.1 server, which drops them).
        // Every address is bound once here first: one that is not this
        // machine's, or taken, is an error now with its cause, before rumqttd
        // (whose failure to bind shows only in its own log) starts.
        let hold = |a: SocketAddr| -> io::Result<(SocketAddr, TcpListener)> {
            let l = TcpListener::bind(a)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {a}: {e}")))?;
            Ok((l.local_addr()?, l))
        };
        if v4 == v5 && v4.port() != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the MQTT 3.1.1 and MQTT 5 listeners need different addresses, not both {v4}"
                ),
            ));
        }
        let (v4, h4) = hold(v4)?;
        let (v5, h5) = hold(v5)?;
        drop((h4, h5));
        let server = |name: &str, listen: SocketAddr| rumqttd::ServerSettings {
            name: name.into(),
            listen,
            tls: None,
            next_connection_delay_ms: 1,
            connections: rumqttd::ConnectionSettings {
                connection_timeout_ms: 60_000,
                max_payload_size: 256 * 1024,
                max_inflight_count: 100,
                auth: None,
                external_auth: None,
                dynamic_filters: true,
            },
        };
        let config = rumqttd::Config {
            id: 0,
            router: rumqttd::RouterConfig {
                max_connections: 1_000,
                max_outgoing_packet_count: 200,
                max_segment_size: 16 * 1024 * 1024,
                max_segment_count: 10,
                ..Default::default()
            },
            v4: Some([("1".to_string(), server("v4-1", v4))].into()),
            v5: Some([("1".to_string(), server("v5-1", v5))].into()),
            ..Default::default()
        };
        std::thread::Builder::new()
            .name("rumqttd".into())
            .spawn(move || {
                let mut broker = rumqttd::Broker::new(config);
                if let Err(e) = broker.start() {
                    tracing::error!("embedded broker: {e}");
                }
            })?;
        for a in [v4, v5] {
            if !wait_listening(a, Duration::from_secs(10)) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the embedded broker did not listen on {a} within 10 s"),
                ));
            }
        }
        match nodelay_on_listeners(&[v4, v5]) {
            Ok(2) => {}
            // Something answered on an address, but it is not one of
            // rumqttd's listeners: another program took the port first.
            Ok(n) if cfg!(target_os = "linux") => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "the embedded broker listens on {n} of {v4} and {v5}: \
                         another program holds the other"
                    ),
                ))
            }
            Ok(n) => tracing::warn!(
                "embedded broker: TCP_NODELAY set on {n} of its 2 listeners; \
                 acknowledgements may wait for delayed ACKs"
            ),
            Err(e) => tracing::warn!("embedded broker: setting TCP_NODELAY: {e}"),
        }
        Ok(EmbeddedBroker { v4, v5 })
    }

    /// Both listeners on free loopback ports.
    pub fn start_loopback() -> io::Result<EmbeddedBroker> {
        let lo: SocketAddr = ([127, 0, 0, 1], 0).into();
        EmbeddedBroker::start(lo, lo)
    }

    /// The MQTT 3.1.1 listener.
    pub fn addr(&self) -> SocketAddr {
        self.v4
    }

    /// The MQTT 5 listener.
    pub fn addr_v5(&self) -> SocketAddr {
        self.v5
    }

    /// `mqtt://` URL of the 3.1.1 listener.
    pub fn url(&self) -> BrokerUrl {
        BrokerUrl::from_addr(self.v4)
    }

    /// `mqtt5://` URL of the MQTT 5 listener.
    pub fn url_v5(&self) -> BrokerUrl {
        BrokerUrl::from_addr(self.v5).with_version(crate::conn::Version::V5)
    }
}

/// Where a `mosquitto` binary is: on PATH, or Debian's `/usr/sbin`.
pub fn find_mosquitto() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("mosquitto"))
            .find(|f| f.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from("/usr/sbin/mosquitto");
        p.is_file().then_some(p)
    })
}

/// A private mosquitto on a loopback port with its own generated config and
/// persistence folder; killed on drop. [`Mosquitto::restart`] stops it
/// gracefully (SIGTERM: it saves its persistence file) and starts it again
/// on the same port.
#[derive(Debug)]
pub struct Mosquitto {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    extra: String,
}

impl Mosquitto {
    /// Starts mosquitto from `bin`, keeping its config, log and persistence
    /// in `dir` (created), on a free loopback port.
    pub fn start(bin: &Path, dir: &Path) -> io::Result<Mosquitto> {
        Mosquitto::start_with(bin, dir, "")
    }

    /// Like [`Mosquitto::start`], with `extra` config lines for its listener
    /// (TLS files, `require_certificate`, ...) and global settings
    /// (`password_file`, `acl_file`); anonymous clients stay allowed unless
    /// `extra` sets `allow_anonymous`.
    pub fn start_with(bin: &Path, dir: &Path, extra: &str) -> io::Result<Mosquitto> {
        std::fs::create_dir_all(dir)?;
        let mut last = None;
        // A port found free may be taken before mosquitto binds it: retry.
        for _ in 0..5 {
            let port = free_port([127, 0, 0, 1].into())?;
            let mut m = Mosquitto {
                bin: bin.to_owned(),
                dir: dir.to_owned(),
                port,
                child: None,
                extra: extra.to_owned(),
            };
            match m.spawn() {
                Ok(()) => return Ok(m),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("mosquitto did not start")))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let conf = self.dir.join("mosquitto.conf");
        let mut text = format!(
            "# generated by mintgate for a private test/lab broker\n\
             listener {port} 127.0.0.1\n\
             {extra}\n\
             persistence true\n\
             persistence_location {dir}/\n\
             autosave_interval 30\n\
             max_queued_messages 100000\n\
             set_tcp_nodelay true\n\
             log_dest file {dir}/mosquitto.log\n\
             log_type error\n\
             log_type warning\n",
            port = self.port,
            dir = self.dir.display(),
            extra = if self.extra.contains("allow_anonymous") {
                self.extra.clone()
            } else {
                format!("allow_anonymous true\n{}", self.extra)
            }
        );
        // Run as root (CI), mosquitto would switch to the `mosquitto` user,
        // which cannot write our folder: stay as we are.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            text.push_str("user root\n");
        }
        std::fs::write(&conf, text)?;
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    let log =
                        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "mosquitto exited ({status}) on port {}: {}",
                        self.port,
                        log.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                    )));
                }
            }
            let pid = self.child.as_ref().map(|c| c.id());
            if pid.is_some_and(|pid| child_listens(pid, addr)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("mosquitto did not listen on {addr} within 10 s"),
        ))
    }

    /// The running mosquitto's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> BrokerUrl {
        BrokerUrl::from_addr(([127, 0, 0, 1], self.port).into())
    }

    /// Stops it with SIGTERM (waiting up to 5 s, then SIGKILL).
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(c.id()) {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(
            "mosquitto on port {} did not stop within 5 s of SIGTERM (is SIGTERM blocked in this \
             process? the mask is inherited): killed, so its sessions and queued messages were \
             not saved",
            self.port
        );
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Stops it gracefully and starts it again on the same port.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        // The port can linger briefly; retry the start a few times.
        let mut last = None;
        for _ in 0..20 {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("mosquitto did not restart")))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}
