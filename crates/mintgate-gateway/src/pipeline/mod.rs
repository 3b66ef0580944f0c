//! The Interaction pipeline (paper 000) over UDP:
//!
//! ```text
//! socket --recvmmsg--> Network Receiver --batch--> HTP queue --batch--> handler pool --sendmmsg--> socket
//!                         |  classify, de-duplicate,                      route, handle, encode
//!                         |  Reset/5.03/replay at once                    (Send Handler runs on the
//!                                                                          handler thread: no extra hop)
//! ```
//!
//! The CoAP message layer (de-duplication, message IDs, empty ACKs and
//! separate responses, CON retransmissions, Observe relations, Block1
//! reassembly, address validation) is the sans-IO server endpoint,
//! [`mintgate_coap::server::Endpoint`]; this module is the sockets and
//! threads around it. One Network Receiver thread per listening socket; a
//! resizable pool of handler threads; one timer thread that drives the
//! endpoint's timeouts (empty ACKs, retransmissions) and the coaps
//! sessions' sweeps; the notifier thread; the Performance Observer thread.
//! Datagrams are received straight into pool blocks and responses are
//! encoded in pool blocks; nothing on the way allocates from the heap.
//!
//! A handler that panics answers 5.00 and its thread goes on (counted in
//! `mintgate_handler_panics_total`); a receiver, timer or notifier thread
//! that dies ends the process with a log line and exit status 70, so that a
//! service manager restarts it.
//!
//! Files: `gateway.rs` binds the listeners, starts and stops the threads
//! and holds the read-only [`GatewayHandle`]; `receive.rs` is the Network
//! Receiver; `workers.rs` the handler threads and their scheduling policy;
//! `timers.rs` the timer and notifier threads; `endpoint_metrics.rs` the
//! endpoint's Block1 and de-duplication tables on `/metrics`.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use mintgate_buf::Pool;
use mintgate_coap::server::observe::is_reliable;
use mintgate_coap::server::{Datagram, Endpoint, Router, Transmit};
use mintgate_sched::PipelineCounters;
use parking_lot::RwLock;

use crate::config::Config;
use crate::observe::ObserveState;
use crate::queue::HtpQueue;
use crate::udp::{self, SendBatch};
use mintgate_dtls::DtlsServer;

/// Most HTP threads the pool may have.
pub const MAX_HTP_THREADS: usize = 256;
/// Cached responses evicted per shard when the receiver finds no block.
const EVICT_CHUNK: usize = 64;
/// Exit status of a process whose pipeline thread died (EX_SOFTWARE).
const EXIT_THREAD_DIED: i32 = 70;

/// Why the gateway could not start. The I/O cause is the error's source,
/// not part of its message: `{:#}` (anyhow's chain) prints it once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot bind udp {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start thread")]
    Thread(#[from] io::Error),
    /// The `coaps+tcp` TLS configuration could not be built.
    #[error("coaps+tcp: {0}")]
    Tls(String),
    /// A CoAP-over-TCP listener could not be bound.
    #[error("cannot bind coap+tcp {addrs:?}")]
    BindTcp {
        /// The addresses (`coap.tcp_bind`).
        addrs: Vec<SocketAddr>,
        /// The cause.
        source: io::Error,
    },
    /// The configuration is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The coaps keys or certificates cannot be used.
    #[error("coaps: {0}")]
    Dtls(mintgate_dtls::DtlsError),
    /// An OSCORE context cannot be used (its Master Secret or sequence
    /// file).
    #[error("oscore: {0}")]
    Oscore(String),
}

struct Shared {
    cfg: Config,
    pool: Pool,
    router: RwLock<Arc<Router>>,
    listeners: Vec<UdpSocket>,
    /// Per listener: its DTLS sessions when it serves coaps.
    dtls: Vec<Option<Arc<DtlsServer>>>,
    queue: HtpQueue,
    counters: Arc<PipelineCounters>,
    /// The CoAP message layer.
    endpoint: Arc<Endpoint>,
    stop: AtomicBool,
    /// Observe (RFC 7641): changed resources (the relations are the
    /// endpoint's).
    observe: Arc<ObserveState>,
    /// Handlers that panicked (answered 5.00).
    handler_panics: AtomicU64,
    /// Extra Prometheus text from other parts of the gateway (devices,
    /// direct path), appended to `/metrics`.
    metrics_sources: RwLock<Vec<MetricsSource>>,
    /// Named sections of the dashboard's state (`/api/state`) from other
    /// parts of the process (devices, direct path, proxy, MQTT).
    state_sources: RwLock<Vec<(String, StateSource)>>,
    /// When the gateway started (uptime on the dashboard).
    started: Instant,
    /// Who may write (`[access]`).
    access: crate::access::AccessPolicy,
    /// Requests the dashboard refused.
    dashboard_refused: crate::dashboard::Refusals,
    /// CoAP over TCP (`coap.tcp_bind`): its counters, rendered when it
    /// serves.
    tcp_stats: Option<Arc<crate::coap_tcp::TcpStats>>,
    /// Observe notifications waiting for their CoAP-over-TCP and
    /// -WebSocket connections, when those listeners serve.
    outboxes: Option<Arc<crate::coap_tcp::Outboxes>>,
    /// OSCORE contexts (`[oscore]`), when any.
    oscore: Option<std::sync::Arc<crate::oscore::OscoreServer>>,
    /// The pipeline threads' last loops and the readiness checks
    /// (`/readyz`): receivers `0..listeners`, then the notifier, then the
    /// timer.
    health: crate::health::Health,
}

/// Writes metric families at each scrape ([`crate::exposition`]).
pub type MetricsSource = Arc<dyn Fn(&mut crate::exposition::Exposition) + Send + Sync>;

/// Returns one section of the dashboard's state as JSON, read from the same
/// counters the section's metrics come from.
pub type StateSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

impl Shared {
    /// Gives back buffers held by cached responses (oldest first) after an
    /// allocation failed; returns how many entries went. The cache is the
    /// only holder of blocks that can let go on demand. The pool calls this
    /// on the allocating thread, which may hold a shard's lock: shards that
    /// are busy are skipped, never waited for.
    fn reclaim(&self) -> usize {
        let freed = self.endpoint.reclaim(EVICT_CHUNK);
        self.counters.dedup_evicted.fetch_add(freed as u64, Relaxed);
        freed
    }

    /// Sends what each listener's batch holds, counting sent datagrams and
    /// send errors.
    fn flush(&self, sbs: &mut [SendBatch]) {
        for (i, sb) in sbs.iter_mut().enumerate() {
            let (s, f) = sb.flush(&self.listeners[i]);
            self.counters.sh_sent.fetch_add(s as u64, Relaxed);
            self.counters.sh_errors.fetch_add(f as u64, Relaxed);
        }
    }

    /// Sends one of the endpoint's transmissions: through its listener's
    /// batch in `sbs`, or, for a reliable connection (CoAP over TCP, TLS or
    /// WebSockets), to that connection's outbox.
    fn send(&self, sbs: &mut [SendBatch], t: Transmit) {
        if is_reliable(t.listener) {
            // only notifications come here: a connection's answers go
            // back on its own thread, and nothing to it is confirmable
            if let (Some(o), Datagram::Message(m)) = (&self.outboxes, &t.datagram) {
                o.push(t.listener, m.to_vec());
            }
        } else if let Some(sb) = sbs.get_mut(t.listener) {
            self.transmit(sb, t);
        }
    }

    /// Sends one of the endpoint's transmissions through `sb` (a message)
    /// or at once (an empty ACK or Reset).
    fn transmit(&self, sb: &mut SendBatch, t: Transmit) {
        let Some(sock) = self.listeners.get(t.listener) else {
            return;
        };
        match t.datagram {
            Datagram::Message(o) => {
                let (s, f) = sb.push(sock, t.peer, o);
                self.counters.sh_sent.fetch_add(s as u64, Relaxed);
                self.counters.sh_errors.fetch_add(f as u64, Relaxed);
            }
            Datagram::Empty(e) => {
                let d = self.dtls[t.listener].as_deref();
                if udp::send_small(sock, d, t.peer, &e).is_ok() {
                    self.counters.sh_sent.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

mod endpoint_metrics;
mod gateway;
mod receive;
mod timers;
mod workers;

pub use gateway::{Gateway, GatewayHandle};

/// Runs a pipeline thread's loop; if it panics, the process cannot go on
/// without it: log and exit non-zero, so that a service manager restarts
/// the gateway (a process that lives on without its receiver serves
/// nothing and is never restarted).
fn fatal_on_panic(what: &str, f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!(thread = what, "a pipeline thread panicked; exiting");
        std::process::exit(EXIT_THREAD_DIED);
    }
}
