//! A private nats-server JetStream cluster on loopback, for the tests and
//! the lab: N nodes with routes between them, each with its own file
//! store under one folder, on free ports; nodes can be killed (SIGKILL)
//! and started again on the same ports and store.
//!
//! A node counts as started only when the child itself holds its client
//! port (read from /proc, as for mosquitto in `mintgate_mqtt::broker`): a
//! port found free may be taken by another test first.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use mintgate_mqtt::broker::{child_listens, free_port};

use crate::config::Target;

/// Where a `nats-server` binary is: `MINTGATE_NATS_SERVER`, PATH, Debian's
/// `/usr/sbin`, or `go install`'s `~/go/bin`.
pub fn find_nats_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MINTGATE_NATS_SERVER") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("nats-server"))
            .find(|f| f.is_file())
    });
    let home_go = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/nats-server"));
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin/nats-server")])
        .chain(home_go)
        .find(|p| p.is_file())
}

struct Node {
    name: String,
    port: u16,
    cluster_port: u16,
    leaf_port: u16,
    child: Option<Child>,
}

/// How the nodes are set up beyond the defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// JetStream on (a file store per node).
    pub jetstream: bool,
    /// Each node also listens for leaf nodes ([`Cluster::leaf_urls`]).
    pub leafnodes: bool,
    /// Config text added to every node's (authorization, tls, a leaf
    /// node's remotes, ...).
    pub extra: String,
    /// The JetStream domain of the nodes (empty: none); [`Cluster::target`]
    /// uses it.
    pub domain: String,
    /// The nodes' server names are this and 1, 2, ... (unique among
    /// servers that meet: a hub and its leaf nodes).
    pub name_prefix: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            jetstream: true,
            leafnodes: false,
            extra: String::new(),
            name_prefix: "n".into(),
            domain: String::new(),
        }
    }
}

/// The cluster; every node is killed on drop.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    opts: Options,
    nodes: Vec<Node>,
    /// CPU seconds of the nodes killed so far (read just before).
    cpu_dead: f64,
}

impl Cluster {
    /// Starts `n` nodes (1..=5) of `bin` with their configs, logs and
    /// stores in `dir` (created), and waits until each listens.
    pub fn start(bin: &Path, dir: &Path, n: usize) -> io::Result<Cluster> {
        Cluster::start_with(bin, dir, n, Options::default())
    }

    /// [`Cluster::start`] with `opts`.
    pub fn start_with(bin: &Path, dir: &Path, n: usize, opts: Options) -> io::Result<Cluster> {
        if !(1..=5).contains(&n) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "1..=5 nodes"));
        }
        std::fs::create_dir_all(dir)?;
        let mut last = None;
        // A port found free may be taken before the node binds it: retry
        // with new ports.
        for _ in 0..5 {
            let mut nodes = Vec::new();
            for i in 0..n {
                nodes.push(Node {
                    name: format!("{}{}", opts.name_prefix, i + 1),
                    port: free_port([127, 0, 0, 1].into())?,
                    cluster_port: free_port([127, 0, 0, 1].into())?,
                    leaf_port: free_port([127, 0, 0, 1].into())?,
                    child: None,
                });
            }
            let mut c = Cluster {
                bin: bin.to_owned(),
                dir: dir.to_owned(),
                opts: opts.clone(),
                nodes,
                cpu_dead: 0.0,
            };
            match (0..n).try_for_each(|i| c.spawn(i)) {
                Ok(()) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("nats-server did not start")))
    }

    fn spawn(&mut self, i: usize) -> io::Result<()> {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, n)| format!("nats-route://127.0.0.1:{}", n.cluster_port))
            .collect();
        let node = &self.nodes[i];
        let store = self.dir.join(&node.name);
        let conf = self.dir.join(format!("{}.conf", node.name));
        let log = self.dir.join(format!("{}.log", node.name));
        let cluster = if self.nodes.len() > 1 {
            format!(
                "cluster {{\n  name: mintgate\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
                node.cluster_port,
                routes.join(", ")
            )
        } else {
            String::new()
        };
        let jetstream = if self.opts.jetstream {
            let domain = if self.opts.domain.is_empty() {
                String::new()
            } else {
                format!("  domain: {}\n", self.opts.domain)
            };
            format!(
                "jetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n{domain}}}\n",
                store.display()
            )
        } else {
            String::new()
        };
        let leafnodes = if self.opts.leafnodes {
            // not advertised: a leaf connects only where its remote says
            // (a test cutting that link must not see it go around)
            format!(
                "leafnodes {{\n  listen: 127.0.0.1:{}\n  no_advertise: true\n}}\n",
                node.leaf_port
            )
        } else {
            String::new()
        };
        std::fs::write(
            &conf,
            format!(
                "# generated by mintgate for a private test/lab cluster\n\
                 server_name: {name}\n\
                 listen: 127.0.0.1:{port}\n\
                 {jetstream}{cluster}{leafnodes}{extra}\n",
                name = node.name,
                port = node.port,
                extra = self.opts.extra,
            ),
        )?;
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()?;
        let addr: SocketAddr = ([127, 0, 0, 1], node.port).into();
        let pid = child.id();
        self.nodes[i].child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(c) = self.nodes[i].child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.nodes[i].child = None;
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "nats-server {} exited ({status}): {}",
                        self.nodes[i].name,
                        text.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                    )));
                }
            }
            if child_listens(pid, addr) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill(i);
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("nats-server did not listen on {addr} within 10 s"),
        ))
    }

    /// For tests: `n` nodes of the nats-server found by
    /// [`find_nats_server`], or `None` (said on stderr) when there is none
    /// and `MINTGATE_REQUIRE_PEERS` is not set; with it set, an error.
    pub fn start_for_tests(dir: &Path, n: usize) -> io::Result<Option<Cluster>> {
        Cluster::start_for_tests_with(dir, n, Options::default())
    }

    /// [`Cluster::start_for_tests`] with `opts`.
    pub fn start_for_tests_with(
        dir: &Path,
        n: usize,
        opts: Options,
    ) -> io::Result<Option<Cluster>> {
        let Some(bin) = find_nats_server() else {
            if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "nats-server is not installed and MINTGATE_REQUIRE_PEERS is set \
                     (apt-get install nats-server)",
                ));
            }
            eprintln!("skipping: nats-server is not installed (apt-get install nats-server)");
            return Ok(None);
        };
        Cluster::start_with(&bin, dir, n, opts).map(Some)
    }

    /// The nodes' client URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The nodes' leaf node URLs (`nats-leaf://`; with
    /// [`Options::leafnodes`]).
    pub fn leaf_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats-leaf://127.0.0.1:{}", n.leaf_port))
            .collect()
    }

    /// The folder of the configs, logs and stores.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Node `i`'s server name (`n1`, `n2`, ...).
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Kills node `i` with SIGKILL (no goodbye, no flush).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            self.cpu_dead += process_cpu_seconds(c.id()).unwrap_or(0.0);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// CPU seconds (user and system) the nodes have used, the killed ones
    /// included (from `/proc`; 0 where it cannot be read).
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_dead
            + self
                .nodes
                .iter()
                .filter_map(|n| n.child.as_ref())
                .filter_map(|c| process_cpu_seconds(c.id()))
                .sum::<f64>()
    }

    /// Whether node `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// Starts node `i` again, on its ports and store.
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.kill(i);
        let mut last = None;
        // Its ports may linger a moment.
        for _ in 0..20 {
            match self.spawn(i) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("nats-server did not restart")))
    }

    /// A [`Target`] of every node, the stream `stream` with one replica
    /// per node (at most 3), created on first use.
    pub fn target(&self, stream: &str) -> Result<Target, String> {
        crate::NatsSection {
            servers: self.urls(),
            stream: stream.into(),
            subject: format!("{stream}.{{topic}}"),
            replicas: self.nodes.len().min(3),
            ack_timeout_ms: 1000,
            domain: self.opts.domain.clone(),
            ..crate::NatsSection::default()
        }
        .target()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// The CPU seconds (user and system) process `pid` has used so far, from
/// `/proc/PID/stat`; `None` when it cannot be read (gone, not Linux).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (comm) STATE ...": comm may hold spaces; fields after the last
    // ')' start at the state (field 3); utime and stime are fields 14, 15
    let rest = &st[st.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let ticks = f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}

/// What a stream holds, read through one of `t`'s servers: the message
/// count, and the leader's server name.
#[derive(Clone, Debug)]
pub struct StreamState {
    /// Messages stored.
    pub messages: u64,
    /// The node leading the stream's replicas (Raft leader).
    pub leader: Option<String>,
    /// Replicas (other than the leader) that are current.
    pub current_replicas: usize,
}

/// Runs `f` on a fresh current-thread runtime (the helpers below are for
/// synchronous tests and the lab).
fn block_on<F: std::future::Future>(f: F) -> io::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

/// Waits (at most `limit`) until the stream of `t` can be created or
/// found and has a leader and all its replicas current; returns its state.
pub fn wait_stream_ready(t: &Target, limit: Duration) -> io::Result<StreamState> {
    block_on(async {
        let end = tokio::time::Instant::now() + limit;
        let mut last = String::from("not tried");
        while tokio::time::Instant::now() < end {
            match stream_state(t, true).await {
                Ok(s) if s.leader.is_some() && s.current_replicas + 1 >= t.replicas => {
                    return Ok(s)
                }
                Ok(s) => last = format!("{s:?}"),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("stream {} not ready within {limit:?}: {last}", t.stream),
        ))
    })?
}

/// The stream's state now (created first when `create`).
pub fn stream_now(t: &Target) -> io::Result<StreamState> {
    block_on(stream_state(t, false))?.map_err(io::Error::other)
}

async fn stream_state(t: &Target, create: bool) -> Result<StreamState, String> {
    let client = t
        .connect_options("mintgate-check")
        .connect(t.servers.as_slice())
        .await
        .map_err(|e| e.to_string())?;
    let js = t.context(client, Duration::from_secs(2));
    let mut stream = if create {
        js.get_or_create_stream(t.stream_config())
            .await
            .map_err(|e| e.to_string())
    } else {
        js.get_stream(&t.stream).await.map_err(|e| e.to_string())
    }?;
    let info = stream.info().await.map_err(|e| e.to_string())?;
    let (leader, current) = match &info.cluster {
        Some(c) => (
            c.leader.clone(),
            c.replicas.iter().filter(|r| r.current).count(),
        ),
        None => (None, 0),
    };
    Ok(StreamState {
        messages: info.state.messages,
        leader,
        current_replicas: current,
    })
}

/// One stored message: subject, payload, `Nats-Msg-Id`.
pub type Stored = (String, Vec<u8>, Option<String>);

/// Every message of the stream of `t`, in stream order, read directly
/// (by sequence, no consumer), once at least `at_least` came back (0: as
/// many as the stream says it holds).
///
/// Around a leader change the stream may answer from a replica that is
/// still catching up: a get says "no message", and the stream's info can
/// count fewer messages than it had (CI once read 440 of 1,500 and stopped,
/// the info it asked having counted 440). So what came back is kept, the
/// missing sequences asked again, and the target is the largest of
/// `at_least` and every count the stream gave; for at most 120 s, after
/// which what came back is returned (and each pass that fell short was
/// printed).
pub fn read_all(t: &Target, at_least: u64) -> io::Result<Vec<Stored>> {
    block_on(async {
        let client = t
            .connect_options("mintgate-check")
            .connect(t.servers.as_slice())
            .await
            .map_err(io::Error::other)?;
        let js = t.context(client, Duration::from_secs(2));
        let mut stream = js.get_stream(&t.stream).await.map_err(io::Error::other)?;
        let end = std::time::Instant::now() + Duration::from_secs(120);
        let mut got: std::collections::BTreeMap<u64, Stored> = std::collections::BTreeMap::new();
        let mut want = at_least;
        let mut last_seq = 0;
        loop {
            let info = stream.info().await.map_err(io::Error::other)?;
            let state = info.state.clone();
            let leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
            want = want.max(state.messages);
            last_seq = last_seq.max(state.last_sequence);
            if want == 0 {
                return Ok(Vec::new());
            }
            for seq in state.first_sequence.max(1)..=last_seq {
                if got.contains_key(&seq) {
                    continue;
                }
                match stream.get_raw_message(seq).await {
                    Ok(m) => {
                        let id = m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned());
                        got.insert(seq, (m.subject.to_string(), m.payload.to_vec(), id));
                    }
                    Err(e) => {
                        if e.kind() != jetstream::stream::RawMessageErrorKind::NoMessageFound {
                            return Err(io::Error::other(e));
                        }
                    }
                }
            }
            got.retain(|seq, _| *seq >= state.first_sequence);
            if got.len() as u64 >= want || std::time::Instant::now() >= end {
                return Ok(got.into_values().collect());
            }
            eprintln!(
                "read {} of {want} (stream says {} messages, {}..={}, leader {leader:?}); asking again",
                got.len(),
                state.messages,
                state.first_sequence,
                state.last_sequence
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })?
}
