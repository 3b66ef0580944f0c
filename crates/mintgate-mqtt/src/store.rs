//! Where the publish queue keeps its messages between restarts.
//!
//! [`RedbStore`] keeps them in a `redb` database (`queue.redb` in the state
//! folder): a table of unacknowledged messages by sequence and a table of
//! metadata (publisher id, next sequence). Durability rules:
//! - [`Store::append`] commits durably (fsync) before it returns: a message
//!   the queue accepted survives `kill -9` and power loss.
//! - [`Store::ack`] only notes acknowledged messages; [`Store::flush`]
//!   removes them in one durable commit (the queue driver calls it every
//!   100 ms and on shutdown), so acknowledging costs no disk write per
//!   message. A crash in between only brings back messages that were
//!   already acknowledged: they are sent again and the receiver drops them
//!   by sequence. Never a loss.
//!
//! [`MemStore`] keeps nothing across restarts (tests, and callers that want
//! the ordering without persistence).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableTable, TableDefinition};

use crate::queue::QueuedMessage;

const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// A store error, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("publish queue store {path}: {what}: {source}")]
pub struct StoreError {
    path: String,
    what: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl StoreError {
    /// An error that did not come from the database itself.
    pub fn other(what: &'static str, msg: String) -> StoreError {
        StoreError {
            path: String::from("-"),
            what,
            source: msg.into(),
        }
    }
}

/// What a store held when it was opened.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The publisher id (made up and saved when the store was created).
    pub publisher: String,
    /// The next sequence to assign.
    pub next_seq: u64,
    /// Unacknowledged messages, in sequence order.
    pub unacked: Vec<QueuedMessage>,
}

/// Persistence for a [`crate::queue::PubQueue`].
pub trait Store: Send {
    /// What the store held when opened.
    fn recovered(&self) -> &Recovered;
    /// Saves `msgs` and the next sequence durably.
    fn append(&mut self, msgs: &[QueuedMessage], next_seq: u64) -> Result<(), StoreError>;
    /// Forgets acknowledged messages (made durable later by [`Store::flush`]).
    fn ack(&mut self, seqs: &[u64]) -> Result<(), StoreError>;
    /// Makes every earlier [`Store::ack`] durable.
    fn flush(&mut self) -> Result<(), StoreError>;
    /// Like [`Store::flush`], as a job the caller may run on another thread
    /// (so that a sync does not stall the connection); `None` when there is
    /// nothing to do.
    fn take_flush_job(&mut self) -> Option<FlushJob> {
        None
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
                next_seq: 1,
                unacked: Vec::new(),
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
    db: Arc<Database>,
    path: PathBuf,
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

/// Stored value: topic length (u16, big-endian), topic, payload.
fn encode_record(m: &QueuedMessage) -> Vec<u8> {
    let t = m.topic.as_bytes();
    let mut v = Vec::with_capacity(2 + t.len() + m.payload.len());
    v.extend_from_slice(&(t.len() as u16).to_be_bytes());
    v.extend_from_slice(t);
    v.extend_from_slice(&m.payload);
    v
}

fn decode_record(seq: u64, v: &[u8]) -> Option<QueuedMessage> {
    let n = u16::from_be_bytes([*v.first()?, *v.get(1)?]) as usize;
    let topic = std::str::from_utf8(v.get(2..2 + n)?).ok()?.to_owned();
    Some(QueuedMessage {
        seq,
        topic,
        payload: v.get(2 + n..)?.to_vec(),
    })
}

impl RedbStore {
    /// Opens (or creates) the store in folder `dir`. A new store gets a
    /// publisher id `default_publisher` if given, else a random one. Fails
    /// with a clear error if another process has the same folder open.
    pub fn open(dir: &Path, default_publisher: Option<&str>) -> Result<RedbStore, StoreError> {
        let path = dir.join("queue.redb");
        let err = |what: &'static str| {
            let p = path.display().to_string();
            move |e: redb::Error| StoreError {
                path: p,
                what,
                source: Box::new(e),
            }
        };
        std::fs::create_dir_all(dir).map_err(|e| StoreError {
            path: dir.display().to_string(),
            what: "creating the state folder",
            source: Box::new(e),
        })?;
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError {
                path: path.display().to_string(),
                what: "opening",
                source: "the queue is in use by another process (one publisher per --state folder)"
                    .into(),
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
            let publisher = if publisher.is_empty() {
                let p = default_publisher
                    .map(str::to_owned)
                    .unwrap_or_else(random_publisher_id);
                meta.insert("publisher", p.as_bytes())
                    .map_err(|e| err("saving the publisher id")(e.into()))?;
                p
            } else {
                publisher
            };
            let next_seq = meta
                .get("next_seq")
                .map_err(|e| err("reading next_seq")(e.into()))?
                .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                .map(u64::from_be_bytes)
                .unwrap_or(1);
            let msgs = tx
                .open_table(MESSAGES)
                .map_err(|e| err("opening the messages table")(e.into()))?;
            let mut unacked = Vec::new();
            for item in msgs.iter().map_err(|e| err("reading messages")(e.into()))? {
                let (k, v) = item.map_err(|e| err("reading messages")(e.into()))?;
                let seq = k.value();
                let m = decode_record(seq, v.value()).ok_or_else(|| StoreError {
                    path: path.display().to_string(),
                    what: "reading messages",
                    source: format!("record {seq} is corrupt").into(),
                })?;
                unacked.push(m);
            }
            Recovered {
                publisher,
                next_seq: next_seq.max(unacked.last().map_or(1, |m| m.seq + 1)),
                unacked,
            }
        };
        tx.commit().map_err(|e| err("committing")(e.into()))?;
        Ok(RedbStore {
            db: Arc::new(db),
            path,
            rec,
            acked: Vec::new(),
        })
    }

    fn err(&self, what: &'static str) -> impl FnOnce(redb::Error) -> StoreError + '_ {
        move |e| StoreError {
            path: self.path.display().to_string(),
            what,
            source: Box::new(e),
        }
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

    fn append(&mut self, msgs: &[QueuedMessage], next_seq: u64) -> Result<(), StoreError> {
        let tx = self
            .db
            .begin_write()
            .map_err(|e| self.err("starting a transaction")(e.into()))?;
        {
            let mut t = tx
                .open_table(MESSAGES)
                .map_err(|e| self.err("opening the messages table")(e.into()))?;
            for m in msgs {
                t.insert(m.seq, encode_record(m).as_slice())
                    .map_err(|e| self.err("appending")(e.into()))?;
            }
            let mut meta = tx
                .open_table(META)
                .map_err(|e| self.err("opening the meta table")(e.into()))?;
            meta.insert("next_seq", next_seq.to_be_bytes().as_slice())
                .map_err(|e| self.err("saving next_seq")(e.into()))?;
        }
        // Durability::Immediate is the default: the commit syncs.
        tx.commit()
            .map_err(|e| self.err("committing an append")(e.into()))?;
        Ok(())
    }

    fn ack(&mut self, seqs: &[u64]) -> Result<(), StoreError> {
        // Kept in memory until the next flush: a crash before it brings the
        // messages back (sent again, dropped by the receiver), never loses one.
        self.acked.extend_from_slice(seqs);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let seqs = std::mem::take(&mut self.acked);
        remove_durably(&self.db, &self.path, &seqs)
    }

    fn take_flush_job(&mut self) -> Option<FlushJob> {
        if self.acked.is_empty() {
            return None;
        }
        let seqs = std::mem::take(&mut self.acked);
        let db = self.db.clone();
        let path = self.path.clone();
        Some(Box::new(move || remove_durably(&db, &path, &seqs)))
    }
}

/// Removes `seqs` in one durable commit.
fn remove_durably(db: &Database, path: &Path, seqs: &[u64]) -> Result<(), StoreError> {
    if seqs.is_empty() {
        return Ok(());
    }
    let err = |what: &'static str| {
        move |e: redb::Error| StoreError {
            path: path.display().to_string(),
            what,
            source: Box::new(e),
        }
    };
    let tx = db
        .begin_write()
        .map_err(|e| err("starting a transaction")(e.into()))?;
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
            let mut q = PubQueue::new(publisher.clone(), 1);
            let ms: Vec<_> = (0..5)
                .map(|i| q.enqueue("a/b", &format!("{i}"), 7))
                .collect();
            s.append(&ms, q.next_seq()).unwrap();
            let m = q.poll_transmit().unwrap();
            assert!(q.on_ack(m.seq));
            s.ack(&[m.seq]).unwrap();
            s.flush().unwrap();
            // Not flushed: may or may not survive, either is correct.
            let m = q.poll_transmit().unwrap();
            assert!(q.on_ack(m.seq));
            s.ack(&[m.seq]).unwrap();
        }
        let s = RedbStore::open(&dir, Some("ignored")).unwrap();
        let r = s.recovered();
        assert_eq!(r.publisher, publisher);
        assert_eq!(r.next_seq, 6);
        let seqs: Vec<u64> = r.unacked.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5], "drop flushes the last ack");
        assert_eq!(r.unacked[0].topic, "a/b");
        let e = crate::payload::decode(&r.unacked[0].payload).unwrap();
        assert_eq!((e.seq, e.msg.as_str()), (3, "2"));
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
        let m = QueuedMessage {
            seq: 1,
            topic: "t/x".into(),
            payload: b"{}".to_vec(),
        };
        let r = encode_record(&m);
        assert_eq!(decode_record(1, &r), Some(m));
        for cut in 0..5 {
            assert_eq!(decode_record(1, &r[..cut]), None, "cut {cut}");
        }
    }
}
