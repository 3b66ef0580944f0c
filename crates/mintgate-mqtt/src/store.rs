//! Where the publish queue keeps its messages between restarts.
//!
//! [`RedbStore`] keeps them in a `redb` database (`queue.redb` in the state
//! folder): a table of unacknowledged messages by id, a table of each
//! topic's next seq, and a table of metadata (publisher id, next id, the
//! first seq of a new topic). Durability rules:
//! - [`Store::append`] commits durably (fsync) before it returns: a message
//!   the queue accepted survives `kill -9` and power loss.
//! - [`Store::ack`] only notes acknowledged messages; [`Store::flush`]
//!   removes them in one durable commit (the queue driver calls it every
//!   100 ms and on shutdown), so acknowledging costs no disk write per
//!   message. A crash in between only brings back messages that were
//!   already acknowledged: they are sent again and the receiver drops them
//!   by sequence. Never a loss.
//!
//! Stores written before seqs were counted per topic (one seq over all
//! topics, which was also the message's key) open as they are: their
//! messages are sent again with the seq they carry, their `next_seq`
//! becomes the next id, and every topic's seqs continue from that number
//! (`seq_base`), so a receiver that saw the old numbers sees the new ones
//! above them, never below.
//!
//! Opening reads an index only (each message's id and size, its record's
//! header checked), never every payload: [`Store::load`] reads payloads in
//! chunks when the queue's turn comes to them.
//!
//! A full disk: a write that fails for want of space (or any write after
//! one, which `redb` refuses until the database is opened again) is a
//! [`StoreError`] with [`StoreError::is_disk_full`]; [`Store::revive`] opens
//! the database again (redb repairs it) when the caller tries once more. A
//! store that could not even be opened for want of space
//! ([`RedbStore::open_or_defer`]) is opened by the first `revive` that
//! succeeds, which hands what it held to the caller.
//!
//! [`MemStore`] keeps nothing across restarts (tests, and callers that want
//! the ordering without persistence).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::queue::{Numbering, QueuedMessage};

/// id -> record ([`encode_record`]).
const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
/// topic -> the topic's next seq.
const TOPIC_SEQ: TableDefinition<&str, u64> = TableDefinition::new("topic_seq");
/// `publisher`, `next_seq` (the next id; named before ids and seqs were
/// told apart), `seq_base` (the first seq of a topic not in `topic_seq`).
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// A store error, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("publish queue store {path}: {what}: {cause}")]
pub struct StoreError {
    path: String,
    what: &'static str,
    /// In the message, not a separate source: a chain would say it twice.
    cause: Box<dyn std::error::Error + Send + Sync>,
    /// Out of space (or a write refused after such a failure).
    full: bool,
}

impl StoreError {
    /// An error that did not come from the database itself.
    pub fn other(what: &'static str, msg: String) -> StoreError {
        StoreError {
            path: String::from("-"),
            what,
            cause: msg.into(),
            full: false,
        }
    }

    /// The write failed for want of space (ENOSPC, EDQUOT), or because an
    /// earlier one did: trying again later may succeed.
    pub fn is_disk_full(&self) -> bool {
        self.full
    }

    fn db(path: &Path, what: &'static str, e: redb::Error) -> StoreError {
        StoreError {
            path: path.display().to_string(),
            what,
            full: is_full(&e),
            cause: Box::new(e),
        }
    }
}

/// An I/O error that says the disk (or the user's quota) is full.
pub fn is_full_io(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// A database error from a full disk, or a write refused after an earlier
/// I/O failure (redb wants the database opened again then).
fn is_full(e: &redb::Error) -> bool {
    match e {
        redb::Error::Io(io) => is_full_io(io),
        redb::Error::PreviousIo => true,
        _ => false,
    }
}

/// What a store held when it was opened.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The publisher id (made up and saved when the store was created).
    pub publisher: String,
    /// The next numbers to assign.
    pub numbering: Numbering,
    /// Unacknowledged messages, in id order: (id, bytes of topic and
    /// payload). Their payloads are read by [`Store::load`].
    pub index: Vec<(u64, u64)>,
}

/// Persistence for a [`crate::queue::PubQueue`].
pub trait Store: Send {
    /// What the store held when opened.
    fn recovered(&self) -> &Recovered;
    /// Saves `msgs`, their topics' next seqs and the next id durably.
    fn append(&mut self, msgs: &[QueuedMessage], next_id: u64) -> Result<(), StoreError>;
    /// Forgets acknowledged messages, by id (made durable later by
    /// [`Store::flush`]).
    fn ack(&mut self, ids: &[u64]) -> Result<(), StoreError>;
    /// Makes every earlier [`Store::ack`] durable.
    fn flush(&mut self) -> Result<(), StoreError>;
    /// Like [`Store::flush`], as a job the caller may run on another thread
    /// (so that a sync does not stall the connection); `None` when there is
    /// nothing to do.
    fn take_flush_job(&mut self) -> Option<FlushJob> {
        None
    }
    /// Like [`Store::append`], as a job the caller may run on another
    /// thread (the connection goes on meanwhile; what `msgs` holds must not
    /// be sent before the job succeeded). `None`: done already (the
    /// default appends at once).
    fn append_job(
        &mut self,
        msgs: Vec<QueuedMessage>,
        next_id: u64,
    ) -> Result<Option<FlushJob>, StoreError> {
        self.append(&msgs, next_id).map(|()| None)
    }
    /// True when [`Store::load`] reads payloads back (the queue may then
    /// keep only some in memory).
    fn can_load(&self) -> bool {
        false
    }
    /// Up to `n` stored messages with ids from `from` on, in id order.
    fn load(&mut self, _from: u64, _n: usize) -> Result<Vec<QueuedMessage>, StoreError> {
        Ok(Vec::new())
    }
    /// After a disk-full error: opens the database again. `Ok(Some)` when
    /// it was opened for the first time (the store was deferred at start):
    /// what it holds, for the caller to take over.
    fn revive(&mut self) -> Result<Option<Recovered>, StoreError> {
        Ok(None)
    }
}

/// A deferred [`Store::flush`].
pub type FlushJob = Box<dyn FnOnce() -> Result<(), StoreError> + Send>;

/// A store that persists nothing.
#[derive(Debug, Default)]
pub struct MemStore {
    rec: Recovered,
}

impl MemStore {
    /// An empty in-memory store for `publisher`.
    pub fn new(publisher: impl Into<String>) -> MemStore {
        MemStore {
            rec: Recovered {
                publisher: publisher.into(),
                numbering: Numbering::default(),
                index: Vec::new(),
            },
        }
    }
}

impl Store for MemStore {
    fn recovered(&self) -> &Recovered {
        &self.rec
    }
    fn append(&mut self, _: &[QueuedMessage], _: u64) -> Result<(), StoreError> {
        Ok(())
    }
    fn ack(&mut self, _: &[u64]) -> Result<(), StoreError> {
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The persistent store, a `redb` database in a state folder.
pub struct RedbStore {
    /// `None`: not open (deferred at start for want of space, or closed
    /// after a write failed; [`Store::revive`] opens it).
    db: Option<Arc<Database>>,
    /// Set by a job whose write failed for want of space.
    broken: Arc<std::sync::atomic::AtomicBool>,
    dir: PathBuf,
    path: PathBuf,
    /// Never opened yet (deferred at start).
    deferred: bool,
    rec: Recovered,
    /// Acknowledged sequences not yet removed from the database.
    acked: Vec<u64>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish()
    }
}

/// Stored value: topic length (u16, big-endian), topic, payload, preceded
/// by 0, 0, FLAGS when the message is retained ([`RETAIN`]) or bare
/// ([`BARE`]: FLAGS is then followed by its seq and ts, u64 big-endian
/// each, which a bare payload does not carry). No topic is empty, so
/// records written before the flags existed read as they were.
fn encode_record(m: &QueuedMessage) -> Vec<u8> {
    let t = m.topic.as_bytes();
    let mut v = Vec::with_capacity(21 + t.len() + m.payload.len());
    if m.retain || m.bare {
        let f = if m.retain { RETAIN } else { 0 } | if m.bare { BARE } else { 0 };
        v.extend_from_slice(&[0, 0, f]);
        if m.bare {
            v.extend_from_slice(&m.seq.to_be_bytes());
            v.extend_from_slice(&m.ts.to_be_bytes());
        }
    }
    v.extend_from_slice(&(t.len() as u16).to_be_bytes());
    v.extend_from_slice(t);
    v.extend_from_slice(&m.payload);
    v
}

/// The message with key `id`; its seq and ts are the ones its envelope
/// carries, or the record's for a bare one (the id itself and 0 for a
/// payload that is neither, which this crate never writes).
fn decode_record(id: u64, v: &[u8]) -> Option<QueuedMessage> {
    let (h, v) = flags(v)?;
    let n = u16::from_be_bytes([*v.first()?, *v.get(1)?]) as usize;
    let topic = std::str::from_utf8(v.get(2..2 + n)?).ok()?.to_owned();
    let payload = v.get(2 + n..)?.to_vec();
    let (seq, ts) = match h.bare {
        Some(st) => st,
        None => crate::payload::decode(&payload).map_or((id, 0), |e| (e.seq, e.ts)),
    };
    Some(QueuedMessage {
        id,
        seq,
        topic,
        payload,
        retain: h.retain,
        bare: h.bare.is_some(),
        ts,
    })
}

/// What a record's header says.
struct Header {
    retain: bool,
    /// (seq, ts) of a bare message.
    bare: Option<(u64, u64)>,
}

/// The header of a record, and the record after it.
fn flags(v: &[u8]) -> Option<(Header, &[u8])> {
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    match v {
        [0, 0, f, rest @ ..] if *f & !(RETAIN | BARE) == 0 && *f != 0 => {
            let retain = *f & RETAIN != 0;
            if *f & BARE == 0 {
                return Some((Header { retain, bare: None }, rest));
            }
            let st = (u64_at(rest, 0)?, u64_at(rest, 8)?);
            Some((
                Header {
                    retain,
                    bare: Some(st),
                },
                rest.get(16..)?,
            ))
        }
        [0, 0, ..] => None,
        _ => Some((
            Header {
                retain: false,
                bare: None,
            },
            v,
        )),
    }
}

/// The record flag of a retained message.
const RETAIN: u8 = 1;
/// The record flag of a bare message (its seq and ts follow).
const BARE: u8 = 2;

/// Whether `v` is a well-formed record (its header and topic), without
/// copying its payload.
fn record_ok(v: &[u8]) -> bool {
    let Some((_, v)) = flags(v) else {
        return false;
    };
    let Some(n) = v
        .get(..2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    else {
        return false;
    };
    v.get(2..2 + n)
        .is_some_and(|t| std::str::from_utf8(t).is_ok())
}

fn read_u64(v: Option<redb::AccessGuard<'_, &'static [u8]>>) -> Option<u64> {
    v.and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
        .map(u64::from_be_bytes)
}

impl RedbStore {
    /// Opens (or creates) the store in folder `dir`. A new store gets a
    /// publisher id `default_publisher` if given, else a random one. Fails
    /// with a clear error if another process has the same folder open.
    pub fn open(dir: &Path, default_publisher: Option<&str>) -> Result<RedbStore, StoreError> {
        let path = dir.join("queue.redb");
        let (db, rec) = open_db(dir, &path, default_publisher)?;
        Ok(RedbStore {
            db: Some(Arc::new(db)),
            broken: Default::default(),
            dir: dir.to_path_buf(),
            path,
            deferred: false,
            rec,
            acked: Vec::new(),
        })
    }

    /// Like [`RedbStore::open`], but a store that cannot be opened for want
    /// of space is returned unopened (empty, publisher id
    /// `default_publisher` or a random one; every write fails as disk full
    /// until [`Store::revive`] opens it).
    pub fn open_or_defer(
        dir: &Path,
        default_publisher: Option<&str>,
    ) -> Result<RedbStore, StoreError> {
        match RedbStore::open(dir, default_publisher) {
            Err(e) if e.is_disk_full() => {
                tracing::warn!(
                    "{e}; the MQTT publish queue refuses messages until there is space again"
                );
                Ok(RedbStore {
                    db: None,
                    broken: Default::default(),
                    dir: dir.to_path_buf(),
                    path: dir.join("queue.redb"),
                    deferred: true,
                    rec: Recovered {
                        publisher: default_publisher
                            .map(str::to_owned)
                            .unwrap_or_else(random_publisher_id),
                        ..Recovered::default()
                    },
                    acked: Vec::new(),
                })
            }
            r => r,
        }
    }

    /// Whether the database is open.
    pub fn is_open(&self) -> bool {
        self.db.is_some()
    }

    /// The open database, or a disk-full error when it is not open.
    fn db(&self) -> Result<&Arc<Database>, StoreError> {
        self.db.as_ref().ok_or_else(|| StoreError {
            path: self.path.display().to_string(),
            what: "writing",
            cause: "not open since a write failed for want of space".into(),
            full: true,
        })
    }
}

/// Opens (or creates) the database at `path` in `dir` and reads its
/// numbering and index.
fn open_db(
    dir: &Path,
    path: &Path,
    default_publisher: Option<&str>,
) -> Result<(Database, Recovered), StoreError> {
    {
        let err = |what: &'static str| move |e: redb::Error| StoreError::db(path, what, e);
        std::fs::create_dir_all(dir).map_err(|e| StoreError {
            path: dir.display().to_string(),
            what: "creating the state folder",
            full: is_full_io(&e),
            cause: Box::new(e),
        })?;
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError {
                path: path.display().to_string(),
                what: "opening",
                cause: "the queue is in use by another process (one process per state folder: \
                        `--state DIR` of publish, `[mqtt] state` of serve)"
                    .into(),
                full: false,
            },
            e => err("opening")(e.into()),
        })?;
        let tx = db
            .begin_write()
            .map_err(|e| err("starting a transaction")(e.into()))?;
        let rec = {
            let mut meta = tx
                .open_table(META)
                .map_err(|e| err("opening the meta table")(e.into()))?;
            let publisher = match meta
                .get("publisher")
                .map_err(|e| err("reading the publisher id")(e.into()))?
            {
                Some(v) => String::from_utf8_lossy(v.value()).into_owned(),
                None => String::new(),
            };
            let created = publisher.is_empty();
            let publisher = if created {
                let p = default_publisher
                    .map(str::to_owned)
                    .unwrap_or_else(random_publisher_id);
                meta.insert("publisher", p.as_bytes())
                    .map_err(|e| err("saving the publisher id")(e.into()))?;
                p
            } else {
                publisher
            };
            let next_id = read_u64(
                meta.get("next_seq")
                    .map_err(|e| err("reading next_seq")(e.into()))?,
            )
            .unwrap_or(1);
            let stored_base = read_u64(
                meta.get("seq_base")
                    .map_err(|e| err("reading seq_base")(e.into()))?,
            );
            let seq_base = match stored_base {
                Some(b) => b,
                None => {
                    // A new store starts every topic at 1; one from before
                    // per-topic seqs continues above the numbers it used.
                    let b = if created { 1 } else { next_id.max(1) };
                    meta.insert("seq_base", b.to_be_bytes().as_slice())
                        .map_err(|e| err("saving seq_base")(e.into()))?;
                    b
                }
            };
            let mut topic_next = std::collections::HashMap::new();
            let seqs = tx
                .open_table(TOPIC_SEQ)
                .map_err(|e| err("opening the topic table")(e.into()))?;
            for item in seqs.iter().map_err(|e| err("reading topics")(e.into()))? {
                let (k, v) = item.map_err(|e| err("reading topics")(e.into()))?;
                topic_next.insert(k.value().to_owned(), v.value());
            }
            let msgs = tx
                .open_table(MESSAGES)
                .map_err(|e| err("opening the messages table")(e.into()))?;
            // The index only: one record at a time, no payload kept.
            let mut index = Vec::new();
            for item in msgs.iter().map_err(|e| err("reading messages")(e.into()))? {
                let (k, v) = item.map_err(|e| err("reading messages")(e.into()))?;
                let id = k.value();
                let v = v.value();
                if !record_ok(v) {
                    return Err(StoreError {
                        path: path.display().to_string(),
                        what: "reading messages",
                        cause: format!("record {id} is corrupt").into(),
                        full: false,
                    });
                }
                // the size the queue counts: topic and payload
                let head = flags(v).map_or(0, |(_, rest)| v.len() - rest.len()) + 2;
                index.push((id, v.len().saturating_sub(head) as u64));
            }
            Recovered {
                publisher,
                numbering: Numbering {
                    next_id: next_id.max(index.last().map_or(1, |&(id, _)| id + 1)),
                    topic_next,
                    seq_base,
                },
                index,
            }
        };
        tx.commit().map_err(|e| err("committing")(e.into()))?;
        Ok((db, rec))
    }
}

/// A publisher id for a new store: `mg-` and 8 random hex digits.
pub fn random_publisher_id() -> String {
    format!("mg-{:08x}", rand::random::<u32>())
}

impl Store for RedbStore {
    fn recovered(&self) -> &Recovered {
        &self.rec
    }

    fn append(&mut self, msgs: &[QueuedMessage], next_id: u64) -> Result<(), StoreError> {
        let r = append_durably(self.db()?, &self.path, msgs, next_id);
        self.note(r)
    }

    fn append_job(
        &mut self,
        msgs: Vec<QueuedMessage>,
        next_id: u64,
    ) -> Result<Option<FlushJob>, StoreError> {
        let db = self.db()?.clone();
        let path = self.path.clone();
        let broken = self.broken.clone();
        Ok(Some(Box::new(move || {
            mark(&broken, append_durably(&db, &path, &msgs, next_id))
        })))
    }

    fn ack(&mut self, ids: &[u64]) -> Result<(), StoreError> {
        // Kept in memory until the next flush: a crash before it brings the
        // messages back (sent again, dropped by the receiver), never loses one.
        self.acked.extend_from_slice(ids);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let Some(db) = self.db.clone() else {
            return Ok(()); // kept for when it opens again
        };
        let seqs = std::mem::take(&mut self.acked);
        let r = remove_durably(&db, &self.path, &seqs);
        if r.is_err() {
            self.acked = seqs;
        }
        self.note(r)
    }

    fn take_flush_job(&mut self) -> Option<FlushJob> {
        if self.acked.is_empty() || self.broken.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let db = self.db.clone()?;
        let seqs = std::mem::take(&mut self.acked);
        let path = self.path.clone();
        let broken = self.broken.clone();
        // Removals that fail for want of space are not retried: the
        // messages come back at the next start (sent again, dropped by the
        // receiver), never lost.
        Some(Box::new(move || {
            mark(&broken, remove_durably(&db, &path, &seqs))
        }))
    }

    fn can_load(&self) -> bool {
        true
    }

    fn load(&mut self, from: u64, n: usize) -> Result<Vec<QueuedMessage>, StoreError> {
        let path = self.path.as_path();
        let err = |what| at(path, what);
        let db = self.db()?;
        let tx = db
            .begin_read()
            .map_err(|e| err("starting a read")(e.into()))?;
        let t = tx
            .open_table(MESSAGES)
            .map_err(|e| err("opening the messages table")(e.into()))?;
        let mut out = Vec::new();
        for item in t
            .range(from..)
            .map_err(|e| err("reading messages")(e.into()))?
            .take(n)
        {
            let (k, v) = item.map_err(|e| err("reading messages")(e.into()))?;
            let id = k.value();
            out.push(decode_record(id, v.value()).ok_or_else(|| StoreError {
                path: path.display().to_string(),
                what: "reading messages",
                cause: format!("record {id} is corrupt").into(),
                full: false,
            })?);
        }
        Ok(out)
    }

    fn revive(&mut self) -> Result<Option<Recovered>, StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.db.is_some() && !self.broken.load(Relaxed) {
            return Ok(None);
        }
        // redb refuses every write after a failed one: close the database
        // (once no job holds it) and open it again, which repairs it.
        if let Some(db) = self.db.take() {
            if let Err(db) = Arc::try_unwrap(db) {
                self.db = Some(db);
                return Err(StoreError {
                    path: self.path.display().to_string(),
                    what: "opening again",
                    cause: "a write is still running".into(),
                    full: true,
                });
            }
        }
        let (db, rec) = open_db(&self.dir, &self.path, Some(&self.rec.publisher))?;
        self.db = Some(Arc::new(db));
        self.broken.store(false, Relaxed);
        if std::mem::take(&mut self.deferred) {
            self.rec = rec.clone();
            return Ok(Some(rec));
        }
        Ok(None)
    }
}

impl RedbStore {
    /// Notes a failed write for want of space (the database must be opened
    /// again).
    fn note(&mut self, r: Result<(), StoreError>) -> Result<(), StoreError> {
        mark(&self.broken, r)
    }
}

/// Sets `broken` when `r` failed for want of space.
fn mark(
    broken: &std::sync::atomic::AtomicBool,
    r: Result<(), StoreError>,
) -> Result<(), StoreError> {
    if let Err(e) = &r {
        if e.is_disk_full() {
            broken.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    r
}

/// Turns a database error while doing `what` on `path` into a StoreError.
fn at<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(redb::Error) -> StoreError + 'a {
    move |e| StoreError::db(path, what, e)
}

fn begin(db: &Database, path: &Path) -> Result<redb::WriteTransaction, StoreError> {
    db.begin_write()
        .map_err(|e| at(path, "starting a transaction")(e.into()))
}

/// Saves `msgs`, their topics' next seqs and the next id in one durable
/// commit.
fn append_durably(
    db: &Database,
    path: &Path,
    msgs: &[QueuedMessage],
    next_id: u64,
) -> Result<(), StoreError> {
    let err = |what| at(path, what);
    let tx = begin(db, path)?;
    {
        let mut t = tx
            .open_table(MESSAGES)
            .map_err(|e| err("opening the messages table")(e.into()))?;
        let mut topics = tx
            .open_table(TOPIC_SEQ)
            .map_err(|e| err("opening the topic table")(e.into()))?;
        let mut next: std::collections::HashMap<&str, u64> = Default::default();
        for m in msgs {
            t.insert(m.id, encode_record(m).as_slice())
                .map_err(|e| err("appending")(e.into()))?;
            let n = next.entry(m.topic.as_str()).or_default();
            *n = (*n).max(m.seq + 1);
        }
        for (topic, n) in next {
            topics
                .insert(topic, n)
                .map_err(|e| err("saving a topic's next seq")(e.into()))?;
        }
        let mut meta = tx
            .open_table(META)
            .map_err(|e| err("opening the meta table")(e.into()))?;
        meta.insert("next_seq", next_id.to_be_bytes().as_slice())
            .map_err(|e| err("saving next_seq")(e.into()))?;
    }
    // Durability::Immediate is the default: the commit syncs.
    tx.commit()
        .map_err(|e| err("committing an append")(e.into()))?;
    Ok(())
}

/// Removes `seqs` in one durable commit.
fn remove_durably(db: &Database, path: &Path, seqs: &[u64]) -> Result<(), StoreError> {
    if seqs.is_empty() {
        return Ok(());
    }
    let err = |what| at(path, what);
    let tx = begin(db, path)?;
    {
        let mut t = tx
            .open_table(MESSAGES)
            .map_err(|e| err("opening the messages table")(e.into()))?;
        for &s in seqs {
            t.remove(s)
                .map_err(|e| err("removing an acked message")(e.into()))?;
        }
    }
    tx.commit().map_err(|e| err("committing acks")(e.into()))
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::PubQueue;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mintgate-mqtt-store-{name}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn survives_reopen_with_unacked_messages_and_numbering() {
        let dir = tmp("reopen");
        let publisher;
        {
            let mut s = RedbStore::open(&dir, None).unwrap();
            publisher = s.recovered().publisher.clone();
            assert!(publisher.starts_with("mg-"));
            assert_eq!(s.recovered().numbering, Numbering::default());
            let mut q = PubQueue::new(publisher.clone(), 1);
            let ms: Vec<_> = (0..5)
                .map(|i| q.enqueue("a/b", &format!("{i}"), 7))
                .collect();
            s.append(&ms, q.next_id()).unwrap();
            let m = q.poll_transmit().unwrap();
            assert!(q.on_ack(m.id));
            s.ack(&[m.id]).unwrap();
            s.flush().unwrap();
            // Not flushed: may or may not survive, either is correct.
            let m = q.poll_transmit().unwrap();
            assert!(q.on_ack(m.id));
            s.ack(&[m.id]).unwrap();
            let other = q.enqueue("c", "x", 7);
            s.append(&[other], q.next_id()).unwrap();
        }
        let mut s = RedbStore::open(&dir, Some("ignored")).unwrap();
        let r = s.recovered().clone();
        let unacked = s.load(0, 100).unwrap();
        assert_eq!(
            r.index.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
            unacked.iter().map(|m| m.id).collect::<Vec<_>>()
        );
        assert_eq!(r.index[0].1, (3 + unacked[0].payload.len()) as u64);
        assert_eq!(r.publisher, publisher);
        assert_eq!(r.numbering.next_id, 7);
        assert_eq!(r.numbering.seq_base, 1);
        assert_eq!(r.numbering.topic_next.get("a/b"), Some(&6));
        assert_eq!(r.numbering.topic_next.get("c"), Some(&2));
        let ids: Vec<(u64, u64)> = unacked.iter().map(|m| (m.id, m.seq)).collect();
        assert_eq!(
            ids,
            vec![(3, 3), (4, 4), (5, 5), (6, 1)],
            "drop flushes the last ack"
        );
        assert_eq!(unacked[0].topic, "a/b");
        let e = crate::payload::decode(&unacked[0].payload).unwrap();
        assert_eq!((e.seq, e.msg.as_str()), (3, "2"));
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_store_from_before_per_topic_seqs_continues_above_its_numbers() {
        // As the first version wrote it: messages keyed by one sequence over
        // all topics, `next_seq`, no topic table, no `seq_base`.
        let dir = tmp("legacy");
        std::fs::create_dir_all(&dir).unwrap();
        {
            let db = Database::create(dir.join("queue.redb")).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut meta = tx.open_table(META).unwrap();
                meta.insert("publisher", b"mg-old".as_slice()).unwrap();
                meta.insert("next_seq", 8u64.to_be_bytes().as_slice())
                    .unwrap();
                let mut t = tx.open_table(MESSAGES).unwrap();
                for (seq, topic) in [(6u64, "a"), (7, "b")] {
                    let env = crate::payload::Envelope {
                        publisher: "mg-old".into(),
                        seq,
                        ts: 1,
                        msg: "m".into(),
                    };
                    let m = QueuedMessage {
                        id: seq,
                        seq,
                        topic: topic.into(),
                        payload: env.encode(),
                        retain: false,
                        bare: false,
                        ts: 1,
                    };
                    t.insert(seq, encode_record(&m).as_slice()).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        let mut s = RedbStore::open(&dir, None).unwrap();
        let r = s.recovered().clone();
        let unacked = s.load(1, 10).unwrap();
        drop(s);
        assert_eq!(r.publisher, "mg-old");
        assert_eq!((r.numbering.next_id, r.numbering.seq_base), (8, 8));
        let got: Vec<(u64, u64, &str)> = unacked
            .iter()
            .map(|m| (m.id, m.seq, m.topic.as_str()))
            .collect();
        assert_eq!(got, vec![(6, 6, "a"), (7, 7, "b")]);
        let mut q = PubQueue::restore("mg-old", 1, r.numbering, unacked);
        // Resent first, as they were; then every topic above 7.
        assert_eq!(q.poll_transmit().map(|m| m.seq), Some(6));
        let a = q.enqueue("a", "new", 2);
        let c = q.enqueue("c", "new", 2);
        assert_eq!((a.id, a.seq, c.id, c.seq), (8, 8, 9, 8));
        // seq_base was saved: the same on the next open.
        let s = RedbStore::open(&dir, None).unwrap();
        assert_eq!(s.recovered().numbering.seq_base, 8);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A restart with a large queue: the store's index is read, the
    /// payloads come in chunks, never more than the resident bound in
    /// memory, and the messages leave in order.
    #[test]
    fn a_large_queue_is_read_back_in_order_in_bounded_chunks() {
        let dir = tmp("large");
        const N: u64 = 3000;
        {
            let mut s = RedbStore::open(&dir, Some("p")).unwrap();
            let mut q = PubQueue::new("p", 1);
            for chunk in 0..(N / 500) {
                let ms: Vec<_> = (0..500)
                    .map(|i| q.enqueue(&format!("t/{}", i % 3), &format!("{chunk}-{i}"), 1))
                    .collect();
                s.append(&ms, q.next_id()).unwrap();
            }
        }
        let mut s = RedbStore::open(&dir, None).unwrap();
        let rec = s.recovered().clone();
        assert_eq!(rec.index.len() as u64, N);
        let mut q = PubQueue::restore_index("p", 8, rec.numbering, &rec.index);
        q.set_resident(100);
        assert_eq!(q.resident(), 0, "nothing read at open");
        let (mut sent, mut loads, mut most) = (Vec::new(), 0, 0);
        let mut per_topic = [0u64; 3];
        for _ in 0..10 * N {
            while let Some((from, n)) = q.wants_load() {
                q.fill(s.load(from, n).unwrap());
                loads += 1;
            }
            most = most.max(q.resident());
            let out: Vec<_> = std::iter::from_fn(|| q.poll_transmit()).collect();
            if out.is_empty() && q.is_empty() {
                break;
            }
            for m in out {
                let k: usize = m.topic[2..].parse().unwrap();
                per_topic[k] += 1;
                assert_eq!(m.seq, per_topic[k], "each topic in order");
                sent.push(m.id);
                assert!(q.on_ack(m.id));
            }
        }
        assert_eq!(sent, (1..=N).collect::<Vec<_>>());
        assert!(most <= 100, "at most 100 payloads in memory, saw {most}");
        assert!(loads >= (N / 100) as usize, "read in chunks: {loads} reads");
        assert_eq!(q.next_seq("t/0"), per_topic[0] + 1, "numbering continues");
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn second_open_of_the_same_folder_fails_clearly() {
        let dir = tmp("lock");
        let _a = RedbStore::open(&dir, Some("x")).unwrap();
        let e = RedbStore::open(&dir, Some("x")).unwrap_err().to_string();
        assert!(e.contains("in use by another process"), "{e}");
        drop(_a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn record_codec_rejects_truncation() {
        let mut m = QueuedMessage {
            id: 1,
            seq: 1,
            topic: "t/x".into(),
            payload: b"{}".to_vec(),
            retain: false,
            bare: false,
            ts: 0,
        };
        let r = encode_record(&m);
        assert_eq!(decode_record(1, &r), Some(m.clone()));
        for cut in 0..5 {
            assert_eq!(decode_record(1, &r[..cut]), None, "cut {cut}");
        }
        m.retain = true;
        let r = encode_record(&m);
        assert!(record_ok(&r));
        assert_eq!(decode_record(1, &r), Some(m));
        for cut in 0..8 {
            assert_eq!(decode_record(1, &r[..cut]), None, "cut {cut}");
            assert!(!record_ok(&r[..cut]), "cut {cut}");
        }
        assert_eq!(
            decode_record(1, &[0, 0, 9, 0, 1, b't']),
            None,
            "unknown flag"
        );
        // bare: seq and ts kept in the record, the payload as it is
        for retain in [false, true] {
            let b = QueuedMessage {
                id: 4,
                seq: 7,
                topic: "t/x".into(),
                payload: b"22.5".to_vec(),
                retain,
                bare: true,
                ts: 1_732_550_400_123,
            };
            let r = encode_record(&b);
            assert!(record_ok(&r));
            assert_eq!(decode_record(4, &r), Some(b.clone()));
            for cut in 0..(3 + 16 + 2 + 3) {
                assert_eq!(decode_record(4, &r[..cut]), None, "cut {cut}");
                assert!(!record_ok(&r[..cut]), "cut {cut}");
            }
        }
    }
}
