//! An OPC UA server's connection: one thread of its own (a current-thread
//! Tokio runtime), so that a slow or dead server delays nothing but
//! itself. It asks the server for its endpoints, opens a secure channel
//! and a session on the one that matches the configured security policy
//! and mode, subscribes to every node (one monitored item each, with its
//! sampling interval), carries out the writes the node drivers hand it,
//! and after a failure starts over with a growing wait (250 ms doubled up
//! to 10 s). Every request and every connect is bounded by the device's
//! `timeout`. It keeps the counters the dashboard and `/metrics` show:
//! `polls` counts data change notifications.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use opcua_client::{
    Client, ClientBuilder, DataChangeCallback, IdentityToken, MonitoredItem, Session,
    SessionPollResult,
};
use opcua_crypto::{CertificateStore, X509};
use opcua_types::{
    AttributeId, DataValue, EndpointDescription, MessageSecurityMode, MonitoredItemCreateRequest,
    MonitoringMode, MonitoringParameters, NodeId, ReadValueId, StatusCode, TimestampsToReturn,
    UserTokenPolicy, Variant, WriteValue,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::time::{timeout, Instant};

use super::{Conversion, Mode, NodeSpec, Policy, RECONNECT_FIRST, RECONNECT_MAX};
use crate::driver::{DeviceError, Direction, Driver, EventFn, LinkState, Running};
use crate::field::{Cell, Counters, Write, WRITE_QUEUE};

/// A password, never printed.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where and how to reach a server.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The device's name (its nodes are `NAME.NODE`).
    pub name: String,
    /// `opc.tcp://host:port/path`.
    pub url: String,
    /// The security policy.
    pub policy: Policy,
    /// The message security mode.
    pub mode: Mode,
    /// The client's certificate (DER `.der` or PEM `.pem`).
    pub certificate: Option<PathBuf>,
    /// The client's private key (PEM, PKCS#1 or PKCS#8).
    pub private_key: Option<PathBuf>,
    /// The application URI the client gives (its certificate's first
    /// subjectAltName).
    pub application_uri: String,
    /// Server certificates trusted: files, and directories whose `.der`
    /// and `.pem` files are.
    pub trust: Vec<PathBuf>,
    /// Trust any server certificate (only when the config says so).
    pub trust_any: bool,
    /// User name and password; anonymous when absent.
    pub user: Option<(String, Secret)>,
    /// Most time one request, or a connect, may take.
    pub timeout: Duration,
    /// The subscription's publishing interval.
    pub publishing: Duration,
}

impl Endpoint {
    fn security(&self) -> (&'static str, MessageSecurityMode) {
        let policy = match self.policy {
            Policy::None => "None",
            Policy::Basic256Sha256 => "Basic256Sha256",
        };
        let mode = match self.mode {
            Mode::None => MessageSecurityMode::None,
            Mode::Sign => MessageSecurityMode::Sign,
            Mode::SignAndEncrypt => MessageSecurityMode::SignAndEncrypt,
        };
        (policy, mode)
    }
}

struct Node {
    spec: NodeSpec,
    id: NodeId,
    conv: Conversion,
    sampling: Duration,
    cell: Cell,
    /// Why the node has no value when the connection is up (its monitored
    /// item was refused, or it holds no number).
    why: Mutex<Option<String>>,
}

struct Shared {
    ep: Endpoint,
    nodes: Vec<Node>,
    counters: Counters,
    stop: Notify,
    /// The client's PKI directory (the trusted server certificates, and
    /// the ones it rejected), removed when the connection stops.
    pki: PathBuf,
}

impl Shared {
    fn fail(&self, why: &str) {
        self.counters
            .fail("opcua", &self.ep.name, &self.ep.url, why);
    }

    fn node_fail(&self, n: &Node, why: String) {
        n.cell.clear();
        let why = format!("{}: {why}", n.spec.node);
        self.fail(&why);
        *n.why.lock() = Some(why);
    }

    /// A data change notification of the node with client handle `handle`.
    fn data_change(&self, handle: u32, dv: DataValue) {
        let Some(n) = (handle as usize)
            .checked_sub(1)
            .and_then(|i| self.nodes.get(i))
        else {
            return;
        };
        self.counters.polls.fetch_add(1, Ordering::Relaxed);
        let t = crate::clock::now_ns();
        if let Some(st) = dv.status.filter(|s| !s.is_good()) {
            return self.node_fail(n, format!("status {st}"));
        }
        match dv.value.as_ref().map(|v| n.conv.decode(v)) {
            Some(Ok(v)) => {
                *n.why.lock() = None;
                n.cell.publish(v, t);
            }
            Some(Err(e)) => self.node_fail(n, e),
            None => self.node_fail(n, "the server sent no value".into()),
        }
    }

    fn clear(&self) {
        self.counters.connected.store(false, Ordering::Relaxed);
        for n in &self.nodes {
            n.cell.clear();
        }
    }
}

/// What a node write asks the connection thread.
type WriteOp = (usize, Variant);

/// A running connection; its thread stops when the last node driver
/// holding it is dropped.
pub struct Connection {
    shared: Arc<Shared>,
    writes: mpsc::Sender<Write<WriteOp>>,
    _thread: Running,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // wakes the thread even from a request in flight; the Running guard
        // then joins it
        self.shared.stop.notify_one();
    }
}

fn cfg(name: &str, why: String) -> DeviceError {
    DeviceError::Config {
        name: name.to_string(),
        why,
    }
}

/// Reads a certificate (`.der` or `.pem`).
fn read_cert(name: &str, key: &str, path: &Path) -> Result<X509, DeviceError> {
    CertificateStore::read_cert(path).map_err(|e| cfg(name, format!("{key}: {e}")))
}

/// A PKI directory of the connection's own, mode 0700, with the trusted
/// certificates in `trusted/` under the names the client looks for.
fn make_pki(ep: &Endpoint) -> Result<PathBuf, DeviceError> {
    use std::os::unix::fs::DirBuilderExt;
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mintgate-opcua-{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        ep.name
    ));
    let io = |what: &str, e: std::io::Error| DeviceError::Io {
        what: format!("{what} {}", dir.display()),
        cause: e,
    };
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| io("creating", e))?;
    for sub in ["trusted", "rejected"] {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.join(sub))
            .map_err(|e| io("creating", e))?;
    }
    let mut files = Vec::new();
    for p in &ep.trust {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| DeviceError::Io {
                what: format!("trusted_certificates: reading {}", p.display()),
                cause: e,
            })?;
            for e in entries.flatten() {
                let f = e.path();
                if matches!(f.extension().and_then(|x| x.to_str()), Some("der" | "pem")) {
                    files.push(f);
                }
            }
        } else {
            files.push(p.clone());
        }
    }
    for f in files {
        let cert = read_cert(&ep.name, "a trusted server certificate", &f)?;
        let der = cert.to_der().map_err(|e| {
            cfg(
                &ep.name,
                format!("a trusted server certificate: {}: {e}", f.display()),
            )
        })?;
        let to = dir
            .join("trusted")
            .join(CertificateStore::cert_file_name(&cert));
        std::fs::write(&to, der).map_err(|e| io("writing into", e))?;
    }
    Ok(dir)
}

impl Connection {
    /// Starts the connection of `ep` subscribing to `nodes` (each with its
    /// parsed id and sampling interval); returns one driver per node, in
    /// order. Certificates and keys are read here: a missing or unreadable
    /// one is a config error.
    pub fn start(
        ep: Endpoint,
        nodes: Vec<(NodeSpec, NodeId, Duration)>,
    ) -> Result<Vec<NodeDriver>, DeviceError> {
        if let (Some(c), Some(k)) = (&ep.certificate, &ep.private_key) {
            let cert = read_cert(&ep.name, "certificate", c)?;
            CertificateStore::read_pkey(k)
                .map_err(|e| cfg(&ep.name, format!("private_key: {e}")))?;
            cert.is_application_uri_valid(&ep.application_uri)
                .map_err(|_| {
                    cfg(
                        &ep.name,
                        format!(
                            "certificate {}: its first subjectAltName must be the URI {} \
                             (set `application_uri` to the certificate's)",
                            c.display(),
                            ep.application_uri
                        ),
                    )
                })?;
        }
        let pki = make_pki(&ep)?;
        let mut b = ClientBuilder::new()
            .application_name("mintgate")
            .application_uri(ep.application_uri.clone())
            .product_uri("urn:mintgate")
            .session_name(format!("mintgate {}", ep.name))
            .pki_dir(pki.clone())
            .create_sample_keypair(false)
            .trust_server_certs(ep.trust_any)
            .verify_server_certs(true)
            // the connection thread reconnects, with its own wait
            .session_retry_limit(0)
            .request_timeout(ep.timeout)
            .keep_alive_interval(ep.timeout.max(Duration::from_secs(1)))
            .max_failed_keep_alive_count(2);
        if let (Some(c), Some(k)) = (&ep.certificate, &ep.private_key) {
            b = b.certificate_path(c.clone()).private_key_path(k.clone());
        }
        let client = b.client().map_err(|e| cfg(&ep.name, e.join("; ")))?;
        let shared = Arc::new(Shared {
            ep,
            nodes: nodes
                .into_iter()
                .map(|(spec, id, sampling)| Node {
                    conv: Conversion::of(&spec),
                    spec,
                    id,
                    sampling,
                    cell: Cell::default(),
                    why: Mutex::new(None),
                })
                .collect(),
            counters: Counters::default(),
            stop: Notify::new(),
            pki,
        });
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let s = shared.clone();
        let thread = Running::spawn(&format!("ua-{}", shared.ep.name), move |_stop| {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async {
                    tokio::select! {
                        _ = s.stop.notified() => {}
                        _ = run(s.clone(), client, rx) => {}
                    }
                }),
                Err(e) => s.fail(&format!("cannot start the connection's runtime: {e}")),
            }
            let _ = std::fs::remove_dir_all(&s.pki);
        })?;
        let conn = Arc::new(Connection {
            shared,
            writes: tx,
            _thread: thread,
        });
        Ok((0..conn.shared.nodes.len())
            .map(|idx| NodeDriver {
                conn: conn.clone(),
                idx,
            })
            .collect())
    }
}

/// Reconnects forever, waiting longer after each failure (reset once a
/// session was up); writes that come while no session is up fail at once.
async fn run(s: Arc<Shared>, client: Client, mut writes: mpsc::Receiver<Write<WriteOp>>) {
    let mut wait = RECONNECT_FIRST;
    loop {
        match session(&s, &client, &mut writes).await {
            End::Stopped => return,
            End::WasUp => wait = RECONNECT_FIRST,
            End::Failed => {}
        }
        s.clear();
        let until = Instant::now() + wait;
        loop {
            tokio::select! {
                w = writes.recv() => {
                    let Some(w) = w else { return };
                    s.counters.writes.fetch_add(1, Ordering::Relaxed);
                    let why = format!(
                        "not connected: {}",
                        s.counters.last_error.lock().clone().unwrap_or_default()
                    );
                    let _ = w.reply.try_send(Err(why));
                }
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        wait = (wait * 2).min(RECONNECT_MAX);
    }
}

enum End {
    /// The node drivers are gone.
    Stopped,
    /// A session was up, then lost.
    WasUp,
    /// No session came up.
    Failed,
}

/// What a status code the server or the client gave means, for a person.
fn explain(code: StatusCode, s: &Shared) -> String {
    let ep = &s.ep;
    let hint = match code {
        StatusCode::BadUserAccessDenied
        | StatusCode::BadIdentityTokenInvalid
        | StatusCode::BadIdentityTokenRejected => match &ep.user {
            Some((u, _)) => {
                format!(": the server refused user `{u}` (wrong user name or password?)")
            }
            None => ": the server refused an anonymous session (set `user`)".into(),
        },
        StatusCode::BadCertificateUntrusted | StatusCode::BadSecurityChecksFailed => {
            // the client puts a server certificate it refused in rejected/
            let rejected: Vec<String> = std::fs::read_dir(s.pki.join("rejected"))
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            if rejected.is_empty() {
                ": a certificate is not trusted (does the server trust the gateway's?)".into()
            } else {
                format!(
                    ": the server's certificate is not trusted ({}; trust it with \
                     `server_certificate` or `trusted_certificates`)",
                    rejected.join(", ")
                )
            }
        }
        StatusCode::BadCertificateHostNameInvalid => {
            ": the server's certificate does not name the endpoint's host".into()
        }
        StatusCode::BadCertificateUriInvalid => {
            ": the server's certificate does not name its application URI".into()
        }
        StatusCode::BadCertificateTimeInvalid => {
            ": a certificate has expired or is not yet valid".into()
        }
        _ => String::new(),
    };
    format!("{code}{hint}")
}

/// One session, from discovery to its loss.
async fn session(
    s: &Arc<Shared>,
    client: &Client,
    writes: &mut mpsc::Receiver<Write<WriteOp>>,
) -> End {
    let ep = &s.ep;
    let t = ep.timeout;
    let url = ep.url.as_str();
    let c = &s.counters;
    c.connects.fetch_add(1, Ordering::Relaxed);
    // discovery: the server's endpoints, over an unsecured channel
    let eps = match timeout(t, client.get_server_endpoints_from_url(url)).await {
        Ok(Ok(eps)) => eps,
        Ok(Err(e)) => {
            s.fail(&format!(
                "getting the endpoints of {url}: {}",
                explain(e.status(), s)
            ));
            return End::Failed;
        }
        Err(_) => {
            s.fail(&format!(
                "getting the endpoints of {url}: no answer within {t:?}"
            ));
            return End::Failed;
        }
    };
    let (policy, mode) = ep.security();
    let want: EndpointDescription = (url, policy, mode, UserTokenPolicy::anonymous()).into();
    let identity = match &ep.user {
        Some((u, p)) => IdentityToken::new_user_name(u.clone(), p.0.clone()),
        None => IdentityToken::Anonymous,
    };
    let offered = || {
        eps.iter()
            .map(|e| {
                let p = e.security_policy_uri.as_ref();
                format!(
                    "{}/{:?}",
                    p.rsplit('#').next().unwrap_or(p),
                    e.security_mode
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let built = client
        .session_builder()
        .with_endpoints(eps.clone())
        .connect_to_matching_endpoint(want)
        .and_then(|b| {
            b.user_identity_token(identity)
                .build(client.certificate_store().clone())
        });
    let (session, event_loop) = match built {
        Ok(x) => x,
        Err(e) => {
            s.fail(&format!(
                "{url} has no endpoint with security {policy}/{mode:?} ({}; it offers {})",
                e.status(),
                offered()
            ));
            return End::Failed;
        }
    };
    let (ev_tx, mut ev) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        let stream = event_loop.enter();
        futures::pin_mut!(stream);
        while let Some(r) = stream.next().await {
            let end = r.is_err();
            if ev_tx.send(r).await.is_err() || end {
                break;
            }
        }
    });
    let _abort = Abort(task);
    // the secure channel and the session
    let up = timeout(t, async {
        loop {
            match ev.recv().await {
                Some(Ok(SessionPollResult::Reconnected(_))) => return Ok(()),
                Some(Ok(_)) => {}
                Some(Err(code)) => return Err(explain(code, s)),
                None => return Err("the session ended".into()),
            }
        }
    })
    .await;
    match up {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            s.fail(&format!("connecting to {url}: {e}"));
            return End::Failed;
        }
        Err(_) => {
            s.fail(&format!("connecting to {url}: no session within {t:?}"));
            return End::Failed;
        }
    }
    c.connected.store(true, Ordering::Relaxed);
    if let Err(e) = subscribe(s, &session).await {
        // a server that takes sessions but no subscription is retried
        // with the growing wait, as one that refuses sessions
        s.fail(&format!("subscribing at {url}: {e}"));
        return End::Failed;
    }
    loop {
        tokio::select! {
            e = ev.recv() => match e {
                Some(Ok(SessionPollResult::ConnectionLost(code))) => {
                    s.clear();
                    s.fail(&format!("connection to {url} lost: {}", explain(code, s)));
                }
                Some(Ok(SessionPollResult::BeginConnect)) => {
                    c.connects.fetch_add(1, Ordering::Relaxed);
                }
                Some(Ok(SessionPollResult::Reconnected(_))) => {
                    // the client transferred or recreated the subscription
                    c.connected.store(true, Ordering::Relaxed);
                }
                Some(Ok(_)) => {}
                Some(Err(code)) => {
                    s.fail(&format!("reconnecting to {url}: {}", explain(code, s)));
                    return End::WasUp;
                }
                None => return End::WasUp,
            },
            w = writes.recv() => {
                let Some(w) = w else { return End::Stopped };
                let r = write(s, &session, &w.op).await;
                if let Err(e) = &r {
                    s.fail(e);
                }
                let _ = w.reply.try_send(r);
            }
        }
    }
}

/// Aborts the session's event loop task when the session ends.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Monitored items asked for in one request.
const ITEMS_PER_REQUEST: usize = 1000;

/// One subscription with every node as a monitored item; a node the
/// server refuses is counted and shown, the others go on.
async fn subscribe(s: &Arc<Shared>, session: &Session) -> Result<(), String> {
    let ep = &s.ep;
    let t = ep.timeout;
    // a keep-alive at least every 5 s, and a lifetime of three of them
    // (Part 4, 5.13.2: the lifetime is at least three keep-alives)
    let pub_ms = ep.publishing.as_millis().max(1);
    let keep_alive = u32::try_from((5000 / pub_ms).clamp(1, 1000)).unwrap_or(1000);
    let sh = s.clone();
    let callback = DataChangeCallback::new(move |dv: DataValue, item: &MonitoredItem| {
        sh.data_change(item.client_handle(), dv);
    });
    let id = timeout(
        t,
        session.create_subscription(
            ep.publishing,
            keep_alive * 3,
            keep_alive,
            0,
            0,
            true,
            callback,
        ),
    )
    .await
    .map_err(|_| format!("no answer within {t:?}"))?
    .map_err(|e| explain(e.status(), s))?;
    let items: Vec<MonitoredItemCreateRequest> = s
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            MonitoredItemCreateRequest::new(
                ReadValueId {
                    node_id: n.id.clone(),
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                },
                MonitoringMode::Reporting,
                MonitoringParameters {
                    client_handle: u32::try_from(i + 1).unwrap_or(u32::MAX),
                    sampling_interval: n.sampling.as_secs_f64() * 1000.0,
                    queue_size: 1,
                    discard_oldest: true,
                    ..Default::default()
                },
            )
        })
        .collect();
    for (chunk_no, chunk) in items.chunks(ITEMS_PER_REQUEST).enumerate() {
        let created = timeout(
            t,
            session.create_monitored_items(id, TimestampsToReturn::Neither, chunk.to_vec()),
        )
        .await
        .map_err(|_| format!("no answer within {t:?}"))?
        .map_err(|e| explain(e.status(), s))?;
        for (k, r) in created.iter().enumerate() {
            let st = r.result.status_code;
            if !st.is_good() {
                let n = &s.nodes[chunk_no * ITEMS_PER_REQUEST + k];
                s.node_fail(n, format!("the server refused to monitor it: {st}"));
            }
        }
    }
    Ok(())
}

/// One write, bounded by the timeout.
async fn write(s: &Shared, session: &Session, op: &WriteOp) -> Result<(), String> {
    let (idx, value) = op;
    let t = s.ep.timeout;
    s.counters.writes.fetch_add(1, Ordering::Relaxed);
    let Some(n) = s.nodes.get(*idx) else {
        return Err("no such node".into());
    };
    let wv = WriteValue {
        node_id: n.id.clone(),
        attribute_id: AttributeId::Value as u32,
        value: DataValue::value_only(value.clone()),
        ..Default::default()
    };
    match timeout(t, session.write(&[wv])).await {
        Ok(Ok(codes)) => match codes.first() {
            Some(st) if st.is_good() => Ok(()),
            Some(st) => Err(format!("writing {}: {st}", n.spec.node)),
            None => Err(format!("writing {}: no result", n.spec.node)),
        },
        Ok(Err(e)) => Err(format!(
            "writing {}: {}",
            n.spec.node,
            explain(e.status(), s)
        )),
        Err(_) => Err(format!("writing {}: no answer within {t:?}", n.spec.node)),
    }
}

/// One node of an OPC UA server, as a device's driver.
pub struct NodeDriver {
    conn: Arc<Connection>,
    idx: usize,
}

impl NodeDriver {
    fn node(&self) -> &Node {
        &self.conn.shared.nodes[self.idx]
    }

    /// Hands the write of `value` to the connection thread; the receiver
    /// of its result.
    fn queue(
        &self,
        value: f64,
    ) -> Result<std::sync::mpsc::Receiver<Result<(), String>>, DeviceError> {
        let n = self.node();
        if !n.spec.writable {
            return Err(DeviceError::NotWritable);
        }
        let v = n.conv.encode(value).map_err(DeviceError::Field)?;
        crate::field::queue(&self.conn.writes, (self.idx, v))
    }
}

impl Driver for NodeDriver {
    fn kind(&self) -> &'static str {
        "opcua"
    }

    fn direction(&self) -> Direction {
        if self.node().spec.writable {
            Direction::Actuator
        } else {
            Direction::Sensor
        }
    }

    fn read(&self) -> Result<f64, DeviceError> {
        let n = self.node();
        n.cell.get().ok_or_else(|| {
            let s = &self.conn.shared;
            match n.why.lock().clone() {
                Some(why) if s.counters.connected.load(Ordering::Relaxed) => {
                    DeviceError::Field(format!("no value: {why}"))
                }
                _ => s.counters.no_value(),
            }
        })
    }

    fn write(&self, value: f64) -> Result<(), DeviceError> {
        let answer = self.queue(value)?;
        // a write may wait behind a discovery, a connect and a subscription
        let wait = self.conn.shared.ep.timeout * 3 + Duration::from_millis(100);
        crate::field::wait(answer, wait)?;
        self.node().cell.set(value);
        Ok(())
    }

    fn submit(&self, value: f64) -> Result<(), DeviceError> {
        // the connection thread counts a failure; nobody waits for it
        self.queue(value).map(drop)?;
        self.node().cell.set(value);
        Ok(())
    }

    fn start(&self, events: EventFn) -> Result<Option<Running>, DeviceError> {
        self.node().cell.hook(events);
        Ok(None)
    }

    fn link(&self) -> Option<LinkState> {
        let s = &self.conn.shared;
        Some(s.counters.state(&s.ep.name, &s.ep.url))
    }
}
