//! OSCORE (RFC 8613) on the gateway: the `[oscore]` section, the sender
//! sequence numbers kept in files (Appendix B.1.1), and the server side the
//! pipeline calls between the CoAP message layer and the router.
//!
//! A request with an OSCORE option is verified against the context whose
//! Recipient ID is its kid ([`OscoreServer::unprotect`]); the router and the
//! handlers see the inner request, with the identity `oscore:NAME`, and the
//! answer is protected back with the request's nonce
//! ([`OscoreServer::protect`]). Failures are answered as RFC 8613 8.2 says:
//! 4.02 for a malformed option, 4.01 for an unknown context or a replay,
//! 4.00 for a ciphertext that does not verify.
//!
//! A protected GET with (inner) `Observe: 0` registers a relation bound to
//! the context and the request ([`OscoreServer::relation`], RFC 8613
//! 4.1.3.5): its first answer reuses the request's nonce like any answer,
//! each later notification is protected with a Partial IV of the server's
//! own sender sequence number (8.3), and one that cannot be (the numbers
//! used up, or reserving them in the file failed) ends the relation
//! instead of going out unprotected.
//!
//! After a restart a context whose sequence file existed has lost its
//! replay window: its first verified request is answered with a protected
//! 4.01 carrying an Echo option, and the window starts again from the
//! request that returns it (Appendix B.1.2).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use mintgate_buf::Pool;
use mintgate_coap::oscore::{self, option_of, Context, Error, Params, RequestId, SeqStore};
use mintgate_coap::server::observe::{Seal, SealFailed};
use mintgate_coap::server::ResponseBuilder;
use mintgate_coap::wire::{Code, ContentFormat, MessageType, OptionNumber, Packet};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// Sequence numbers reserved per write of a sequence file, by default.
pub const DEFAULT_SEQ_STEP: u64 = 64;

/// `[oscore]`: security contexts for OSCORE. Off while `contexts` is empty.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OscoreSection {
    /// Folder of the sender sequence number files (`NAME.seq`).
    pub state: PathBuf,
    /// Sequence numbers reserved per file write (1..=65536).
    pub seq_step: u64,
    /// The contexts, one per peer.
    pub contexts: Vec<ContextConfig>,
}

impl Default for OscoreSection {
    fn default() -> Self {
        OscoreSection {
            state: "mintgate-oscore".into(),
            seq_step: DEFAULT_SEQ_STEP,
            contexts: Vec::new(),
        }
    }
}

/// One `[[oscore.contexts]]`, also the format of a client's context file.
/// IDs, salt and ID context are hex; the Master Secret is read as hex from
/// a file or an environment variable, never written in the configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// Name: the identity handlers see (`oscore:NAME`) and the sequence
    /// file's name.
    pub name: String,
    /// File holding the Master Secret in hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_secret_file: Option<PathBuf>,
    /// Environment variable holding the Master Secret in hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_secret_env: Option<String>,
    /// Master Salt, hex (empty by default).
    pub master_salt: String,
    /// This side's Sender ID, hex (0 to 7 bytes).
    pub sender_id: String,
    /// The peer's Sender ID, hex (0 to 7 bytes).
    pub recipient_id: String,
    /// ID Context, hex; absent when not set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_context: Option<String>,
}

fn bad(key: &'static str, why: String) -> ConfigError {
    ConfigError::Value { key, why }
}

/// Hex digits (whitespace around them ignored) as bytes.
pub fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    let s = s.strip_prefix("0x").unwrap_or(s);
    if !s.len().is_multiple_of(2) {
        return Err("an odd number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("{s:?} is not hex"))
        })
        .collect()
}

impl ContextConfig {
    fn name_ok(&self) -> bool {
        !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !self.name.starts_with('.')
    }

    /// The context's parameters, with the Master Secret read from its file
    /// or variable. Relative files are taken from `base`.
    pub fn params(&self, base: &Path) -> Result<Params, ConfigError> {
        if !self.name_ok() {
            return Err(bad(
                "oscore.contexts.name",
                format!(
                    "{:?}: 1..=64 of letters, digits, '-', '_', '.' (not first)",
                    self.name
                ),
            ));
        }
        let n = &self.name;
        let secret_text = match (&self.master_secret_file, &self.master_secret_env) {
            (Some(f), None) => {
                let f = base.join(f);
                fs::read_to_string(&f).map_err(|e| {
                    bad(
                        "oscore.contexts.master_secret_file",
                        format!("{n}: {}: {e}", f.display()),
                    )
                })?
            }
            (None, Some(v)) => std::env::var(v).map_err(|_| {
                bad(
                    "oscore.contexts.master_secret_env",
                    format!("{n}: the environment variable {v} is not set"),
                )
            })?,
            _ => {
                return Err(bad(
                    "oscore.contexts.master_secret_file",
                    format!("{n}: give exactly one of master_secret_file and master_secret_env"),
                ))
            }
        };
        let hex =
            |key: &'static str, v: &str| parse_hex(v).map_err(|e| bad(key, format!("{n}: {e}")));
        let p = Params {
            master_secret: hex("oscore.contexts.master_secret_file", &secret_text)?,
            master_salt: hex("oscore.contexts.master_salt", &self.master_salt)?,
            sender_id: hex("oscore.contexts.sender_id", &self.sender_id)?,
            recipient_id: hex("oscore.contexts.recipient_id", &self.recipient_id)?,
            id_context: self
                .id_context
                .as_deref()
                .map(|c| hex("oscore.contexts.id_context", c))
                .transpose()?,
        };
        if p.master_secret.len() < 16 {
            return Err(bad(
                "oscore.contexts.master_secret_file",
                format!(
                    "{n}: the master secret has {} bytes, give at least 16",
                    p.master_secret.len()
                ),
            ));
        }
        p.validate()
            .map_err(|e| bad("oscore.contexts", format!("{n}: {e}")))?;
        Ok(p)
    }

    /// Reads a client's context file (TOML, the keys of one
    /// `[[oscore.contexts]]`); its Master Secret file is relative to it.
    pub fn from_file(path: &Path) -> Result<ContextConfig, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut c: ContextConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if c.name.is_empty() {
            c.name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
        }
        Ok(c)
    }
}

impl OscoreSection {
    /// Whether any context is configured.
    pub fn enabled(&self) -> bool {
        !self.contexts.is_empty()
    }

    /// Checks the keys (Master Secrets are read at start).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=65536).contains(&self.seq_step) {
            return Err(bad(
                "oscore.seq_step",
                format!("{} is not in 1..=65536", self.seq_step),
            ));
        }
        if self.enabled() && self.state.as_os_str().is_empty() {
            return Err(bad(
                "oscore.state",
                "give a folder for the sequence numbers".into(),
            ));
        }
        for (i, c) in self.contexts.iter().enumerate() {
            if self.contexts[..i].iter().any(|o| o.name == c.name) {
                return Err(bad(
                    "oscore.contexts.name",
                    format!("{:?} is used twice", c.name),
                ));
            }
            let key =
                |c: &ContextConfig| (c.recipient_id.to_ascii_lowercase(), c.id_context.clone());
            if self.contexts[..i].iter().any(|o| key(o) == key(c)) {
                return Err(bad(
                    "oscore.contexts.recipient_id",
                    format!(
                        "{}: another context has the same recipient_id and id_context",
                        c.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A sender sequence number in a file: the limit below which numbers may
/// have been used, written to a temporary file, synced and renamed over
/// the old one, and the folder synced, before any number under it is used.
///
/// One process at a time: the store holds an exclusive lock (`flock`) on
/// `NAME.seq.lock` beside the file while it is open, so that two processes
/// never take numbers from the same file (their reservations would overlap,
/// and two messages would be sealed with the same nonce).
#[derive(Debug)]
pub struct FileSeqStore {
    path: PathBuf,
    _lock: fs::File,
}

impl FileSeqStore {
    /// The store at `path`, and the number to start from (0 when the file
    /// does not exist); `existed` says whether it did. Fails when another
    /// process (or another store in this one) has it open.
    pub fn open(path: PathBuf) -> std::io::Result<(FileSeqStore, u64, bool)> {
        use std::os::fd::AsRawFd as _;
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("seq.lock"))?;
        // SAFETY: flock on a descriptor this function owns; no memory is
        // passed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.kind() == std::io::ErrorKind::WouldBlock {
                std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another process: a context's sequence numbers serve one \
                         user at a time (two would reuse nonces)",
                        path.display()
                    ),
                )
            } else {
                e
            });
        }
        let (start, existed) = match fs::read_to_string(&path) {
            Ok(s) => (
                s.trim().parse::<u64>().map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: not a sequence number", path.display()),
                    )
                })?,
                true,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, false),
            Err(e) => return Err(e),
        };
        Ok((FileSeqStore { path, _lock: lock }, start, existed))
    }
}

impl SeqStore for FileSeqStore {
    fn persist(&mut self, limit: u64) -> std::io::Result<()> {
        let tmp = self.path.with_extension("seq.tmp");
        {
            let mut f = fs::File::create(&tmp)?;
            writeln!(f, "{limit}")?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// A context with its sequence number in `state/NAME.seq` (made when
/// missing); `existed` says whether the file was there (the context was
/// used before, by a process that may have stopped at any point).
pub fn open_context(
    cfg: &ContextConfig,
    base: &Path,
    state: &Path,
    step: u64,
) -> Result<(Context, bool), String> {
    let p = cfg.params(base).map_err(|e| e.to_string())?;
    fs::create_dir_all(state).map_err(|e| format!("{}: {e}", state.display()))?;
    let (mut store, start, existed) =
        FileSeqStore::open(state.join(format!("{}.seq", cfg.name))).map_err(|e| e.to_string())?;
    if !existed {
        // the file marks the context as used: a later start knows that its
        // replay window was lost
        store.persist(0).map_err(|e| e.to_string())?;
    }
    let ctx = Context::new(&p)
        .map_err(|e| e.to_string())?
        .with_store(Box::new(store), start, step);
    Ok((ctx, existed))
}

/// Counters of the OSCORE server.
#[derive(Debug, Default)]
pub struct OscoreStats {
    /// Requests verified.
    pub verified: AtomicU64,
    /// Refused as replays.
    pub replays: AtomicU64,
    /// Refused: the ciphertext did not verify.
    pub decrypt_failed: AtomicU64,
    /// Refused: no context for the kid.
    pub unknown_context: AtomicU64,
    /// Refused: a malformed OSCORE option or inner message.
    pub malformed: AtomicU64,
    /// Echo challenges sent (B.1.2).
    pub echo_challenges: AtomicU64,
    /// Notifications protected with a Partial IV of their own.
    pub notifications: AtomicU64,
    /// Notifications that could not be protected (their relation ended).
    pub notifications_failed: AtomicU64,
}

/// The gateway's contexts.
pub struct OscoreServer {
    contexts: Vec<(String, Mutex<Context>)>,
    stats: OscoreStats,
}

/// A verified request, to be answered through [`OscoreServer::protect`].
#[derive(Debug)]
pub struct Verified {
    /// The inner request as a whole CoAP message.
    pub message: Vec<u8>,
    /// `oscore:NAME`.
    pub identity: String,
    ctx: usize,
    request: RequestId,
}

impl OscoreServer {
    /// Opens every context of `cfg` (Master Secrets relative to `base`).
    pub fn open(cfg: &OscoreSection, base: &Path) -> Result<OscoreServer, String> {
        let mut contexts = Vec::new();
        for c in &cfg.contexts {
            let (mut ctx, existed) = open_context(c, base, &cfg.state, cfg.seq_step)?;
            if existed {
                ctx.forget_replay_window();
            }
            contexts.push((c.name.clone(), Mutex::new(ctx)));
        }
        Ok(OscoreServer {
            contexts,
            stats: OscoreStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &OscoreStats {
        &self.stats
    }

    /// Whether `p`'s OSCORE option names one of the contexts (kid and kid
    /// context); nothing is verified.
    pub fn knows(&self, p: &Packet<&[u8]>) -> bool {
        match option_of(p) {
            Some(Ok(o)) => self.contexts.iter().any(|(_, c)| c.lock().matches(&o)),
            _ => false,
        }
    }

    /// Verifies `p`, a request with an OSCORE option. `None` when it does
    /// not verify: the answer is then in `rb`.
    pub fn unprotect(
        &self,
        pool: &Pool,
        p: &Packet<&[u8]>,
        rb: &mut ResponseBuilder,
    ) -> Option<Verified> {
        let refuse = |rb: &mut ResponseBuilder, code: Code, why: &str, n: &AtomicU64| {
            n.fetch_add(1, Relaxed);
            rb.set_code(code)
                .content_format(ContentFormat::TEXT_PLAIN)
                .write(why.as_bytes());
            None
        };
        let s = &self.stats;
        let o = match option_of(p) {
            Some(Ok(o)) => o,
            _ => {
                return refuse(
                    rb,
                    Code::BAD_OPTION,
                    "malformed OSCORE option",
                    &s.malformed,
                )
            }
        };
        let Some(i) = self.contexts.iter().position(|(_, c)| c.lock().matches(&o)) else {
            return refuse(
                rb,
                Code::UNAUTHORIZED,
                "Security context not found",
                &s.unknown_context,
            );
        };
        let mut ctx = self.contexts[i].1.lock();
        match ctx.unprotect_request(p.as_bytes()) {
            Ok(u) => {
                s.verified.fetch_add(1, Relaxed);
                Some(Verified {
                    message: u.message,
                    identity: format!("oscore:{}", self.contexts[i].0),
                    ctx: i,
                    request: u.request,
                })
            }
            Err(Error::Replay) => refuse(rb, Code::UNAUTHORIZED, "Replay detected", &s.replays),
            Err(Error::Decrypt) => refuse(
                rb,
                Code::BAD_REQUEST,
                "Decryption failed",
                &s.decrypt_failed,
            ),
            Err(Error::BadOption) => refuse(
                rb,
                Code::BAD_OPTION,
                "malformed OSCORE option",
                &s.malformed,
            ),
            Err(Error::EchoRequired(req)) => {
                s.echo_challenges.fetch_add(1, Relaxed);
                let echo = ctx.echo_challenge();
                let mut plain = ResponseBuilder::in_pool(pool, 16);
                plain
                    .set_code(Code::UNAUTHORIZED)
                    .option(OptionNumber::ECHO, &echo);
                drop(ctx);
                if !self.protect_into(i, &req, plain, true, rb) {
                    rb.set_code(Code::INTERNAL_SERVER_ERROR);
                }
                None
            }
            Err(_) => refuse(
                rb,
                Code::BAD_REQUEST,
                "not a valid OSCORE request",
                &s.malformed,
            ),
        }
    }

    /// Protects the answer `plain` to `v` into `out` (which is answered
    /// 5.00 when that fails: nothing unprotected goes out).
    pub fn protect(&self, v: &Verified, plain: ResponseBuilder, out: &mut ResponseBuilder) {
        if !self.protect_into(v.ctx, &v.request, plain, false, out) {
            tracing::warn!(context = %self.contexts[v.ctx].0, "an OSCORE answer could not be protected: answered 5.00");
            out.set_code(Code::INTERNAL_SERVER_ERROR);
        }
    }

    /// What protects the notifications of an Observe relation that `v`
    /// registers: bound to its context and its request (kid, Partial IV,
    /// ID Context: the external AAD of every notification, RFC 8613 5.4).
    pub fn relation(self: &Arc<Self>, v: &Verified) -> Arc<dyn Seal> {
        Arc::new(Relation {
            server: self.clone(),
            ctx: v.ctx,
            request: v.request.clone(),
            owner: v.identity.clone(),
        })
    }

    /// Protects `plain` for the request `req` of context `i` into `out`;
    /// false when it could not be (nothing is written to `out` then).
    fn protect_into(
        &self,
        i: usize,
        req: &RequestId,
        plain: ResponseBuilder,
        fresh: bool,
        out: &mut ResponseBuilder,
    ) -> bool {
        let protected = plain
            .finish(MessageType::Ack, 0, &[])
            .map_err(|_| Error::TooLarge)
            .and_then(|o| {
                self.contexts[i]
                    .1
                    .lock()
                    .protect_response(&o.to_vec(), req, fresh)
            });
        match protected.as_deref().map(Packet::new_checked) {
            Ok(Ok(pp)) => {
                out.set_code(pp.code());
                for o in pp.options() {
                    out.option(o.number, o.value);
                }
                out.write(pp.payload());
                true
            }
            Ok(Err(_)) => false,
            Err(e) => {
                tracing::debug!(context = %self.contexts[i].0, error = %e, "OSCORE protection failed");
                false
            }
        }
    }

    /// Context names and sequence numbers, for the state page.
    pub fn describe(&self) -> Vec<(String, u64)> {
        self.contexts
            .iter()
            .map(|(n, c)| (n.clone(), c.lock().sender_seq()))
            .collect()
    }
}

/// An Observe relation registered with OSCORE: its notifications are
/// protected with the context's own sender sequence numbers as Partial IVs
/// (RFC 8613 8.3), bound to the registration request.
struct Relation {
    server: Arc<OscoreServer>,
    ctx: usize,
    request: RequestId,
    owner: String,
}

impl std::fmt::Debug for Relation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relation")
            .field("owner", &self.owner)
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl Seal for Relation {
    fn owner(&self) -> &str {
        &self.owner
    }

    fn seal(&self, plain: ResponseBuilder, out: &mut ResponseBuilder) -> Result<(), SealFailed> {
        let s = &self.server.stats;
        if self
            .server
            .protect_into(self.ctx, &self.request, plain, true, out)
        {
            s.notifications.fetch_add(1, Relaxed);
            Ok(())
        } else {
            s.notifications_failed.fetch_add(1, Relaxed);
            tracing::warn!(context = %self.owner, "an OSCORE notification could not be protected: the relation ends");
            Err(SealFailed)
        }
    }
}

/// The OSCORE option number, for callers that test for it.
pub const OPTION: OptionNumber = oscore::OSCORE;

/// The OSCORE counters.
pub fn collect(s: &OscoreStats, m: &mut crate::exposition::Exposition) {
    labelled(
        m,
        "mintgate_oscore_requests_total",
        "OSCORE requests, by result.",
        &[
            ("verified", &s.verified),
            ("replay", &s.replays),
            ("decrypt_failed", &s.decrypt_failed),
            ("unknown_context", &s.unknown_context),
            ("malformed", &s.malformed),
            ("echo_challenge", &s.echo_challenges),
        ],
    );
    labelled(
        m,
        "mintgate_oscore_notifications_total",
        "Observe notifications of OSCORE relations, by result (failed: not protectable, the relation ended).",
        &[
            ("protected", &s.notifications),
            ("failed", &s.notifications_failed),
        ],
    );
}

/// One counter family with a `result` label.
fn labelled(
    m: &mut crate::exposition::Exposition,
    name: &str,
    help: &str,
    values: &[(&str, &AtomicU64)],
) {
    m.counters(
        name,
        help,
        "result",
        values.iter().map(|(label, n)| (*label, n.load(Relaxed))),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One user of a sequence file at a time: a second open is refused
    /// while the first store lives, and allowed once it is gone.
    #[test]
    fn a_sequence_file_has_one_user_at_a_time() {
        let d = std::env::temp_dir().join(format!("mintgate-oscore-lock-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let p = d.join("c.seq");
        let (first, _, _) = FileSeqStore::open(p.clone()).unwrap();
        let e = FileSeqStore::open(p.clone()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(e.to_string().contains("in use by another process"), "{e}");
        drop(first);
        assert!(FileSeqStore::open(p).is_ok());
        let _ = fs::remove_dir_all(&d);
    }

    /// A process that stops at any point (no shutdown: the context is just
    /// dropped) comes back above every number it may have used.
    #[test]
    fn a_restart_never_reuses_a_sequence_number() {
        let d = std::env::temp_dir().join(format!("mintgate-oscore-seq-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("k"), "000102030405060708090a0b0c0d0e0f").unwrap();
        let cfg = ContextConfig {
            name: "c".into(),
            master_secret_file: Some("k".into()),
            recipient_id: "01".into(),
            ..ContextConfig::default()
        };
        let plain = [0x40, 0x01, 0, 1];
        let mut used = 0;
        for round in 0..4u64 {
            let (mut ctx, existed) = open_context(&cfg, &d, &d.join("state"), 3).unwrap();
            assert_eq!(existed, round > 0);
            assert!(
                ctx.sender_seq() >= used,
                "round {round}: {} < {used}",
                ctx.sender_seq()
            );
            for _ in 0..=round {
                ctx.protect_request(&plain).unwrap();
            }
            used = ctx.sender_seq();
        }
        let _ = fs::remove_dir_all(&d);
    }

    struct Failing;
    impl SeqStore for Failing {
        fn persist(&mut self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("disk full"))
        }
    }

    /// The notifications of a relation are protected with the context's
    /// own numbers and verify at the client; when no number can be
    /// reserved, sealing fails (counted) and nothing is written.
    #[test]
    fn a_relation_protects_notifications_or_fails_without_output() {
        use mintgate_buf::PartitionConfig;
        use mintgate_coap::oscore::Notifications;
        use mintgate_coap::wire::MessageWriter;
        let pool = Pool::new(&[PartitionConfig {
            block_size: 2048,
            blocks: 16,
        }]);
        let p = |s: &[u8], r: &[u8]| Params {
            master_secret: (1..=16).collect(),
            sender_id: s.to_vec(),
            recipient_id: r.to_vec(),
            ..Params::default()
        };
        let mut client = Context::new(&p(b"c", b"s")).unwrap();
        let ok = Context::new(&p(b"s", b"c")).unwrap();
        let failing = Context::new(&p(b"s", b"d"))
            .unwrap()
            .with_store(Box::new(Failing), 0, 1);
        let server = Arc::new(OscoreServer {
            contexts: vec![
                ("ok".into(), Mutex::new(ok)),
                ("bad".into(), Mutex::new(failing)),
            ],
            stats: OscoreStats::default(),
        });
        let mut buf = [0u8; 64];
        let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::GET, 1, b"t").unwrap();
        w.option_uint(OptionNumber::OBSERVE, 0).unwrap();
        w.option(OptionNumber::URI_PATH, b"x").unwrap();
        let n = w.finish();
        let (reg, id) = client.protect_request(&buf[..n]).unwrap();
        let mut rb = ResponseBuilder::in_pool(&pool, 16);
        let v = server
            .unprotect(&pool, &Packet::new_checked(&reg[..]).unwrap(), &mut rb)
            .expect("verifies");
        assert_eq!(v.identity, "oscore:ok");
        let rel = server.relation(&v);
        assert_eq!(rel.owner(), "oscore:ok");
        let mut seen = Notifications::default();
        for value in [b"1", b"2"] {
            let mut plain = ResponseBuilder::in_pool(&pool, 16);
            plain
                .set_code(Code::CONTENT)
                .option_uint(OptionNumber::OBSERVE, 5)
                .write(value);
            let mut out = ResponseBuilder::in_pool(&pool, 64);
            rel.seal(plain, &mut out).unwrap();
            let sent = out.finish(MessageType::Non, 7, b"t").unwrap().to_vec();
            let inner = client
                .unprotect_notification(&sent, &id, &mut seen)
                .unwrap();
            assert_eq!(Packet::new_checked(&inner[..]).unwrap().payload(), value);
        }
        assert_eq!(seen.number(), Some(1), "numbers 0 and 1 of the server");
        assert_eq!(server.stats().notifications.load(Relaxed), 2);
        // the same relation on the context whose store fails
        let bad = Arc::new(Relation {
            server: server.clone(),
            ctx: 1,
            request: v.request.clone(),
            owner: "oscore:bad".into(),
        });
        let mut plain = ResponseBuilder::in_pool(&pool, 16);
        plain.set_code(Code::CONTENT).write(b"3");
        let mut out = ResponseBuilder::in_pool(&pool, 64);
        assert_eq!(bad.seal(plain, &mut out), Err(SealFailed));
        assert!(out.payload().is_empty(), "nothing written");
        assert_eq!(server.stats().notifications_failed.load(Relaxed), 1);
    }

    #[test]
    fn hex_and_names() {
        assert_eq!(parse_hex(" 0x0aFF\n").unwrap(), vec![10, 255]);
        assert!(parse_hex("abc").is_err() && parse_hex("zz").is_err());
        let mut c = ContextConfig {
            name: "../x".into(),
            ..ContextConfig::default()
        };
        assert!(c.params(Path::new("")).is_err());
        c.name = "ok".into();
        let e = c.params(Path::new("")).unwrap_err().to_string();
        assert!(e.contains("exactly one of"), "{e}");
    }
}
