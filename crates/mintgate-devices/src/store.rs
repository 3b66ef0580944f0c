//! Persistence of device histories, so that a restart keeps them: one
//! append-only file per device in a directory, `NAME.hist`, of fixed
//! 16-byte records (Unix milliseconds as u64, value as f64, little-endian).
//!
//! A record format this plain needs no database: appends are one `write`
//! per flush, a torn last record (a crash mid-write) is ignored on load,
//! and a file grown past four times the history it backs is rewritten
//! (to a temporary file, then renamed over) with only what is kept.
//! Writes happen on the device manager's flusher thread, never on a
//! driver's thread or the direct path's worker.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::driver::DeviceError;
use crate::history::Record;

/// Bytes per record.
pub const RECORD: usize = 16;

/// A directory of history files.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

fn io(what: &str, p: &Path, source: std::io::Error) -> DeviceError {
    DeviceError::Io {
        what: format!("{what} {}", p.display()),
        cause: source,
    }
}

/// Encodes records.
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.len() * RECORD);
    for r in records {
        out.extend_from_slice(&r.unix_ms.to_le_bytes());
        out.extend_from_slice(&r.value.to_le_bytes());
    }
    out
}

/// Decodes whole records, ignoring a torn tail and skipping records whose
/// value is not finite (never written by us: a damaged file).
pub fn decode(bytes: &[u8]) -> Vec<Record> {
    bytes
        .chunks_exact(RECORD)
        .filter_map(|c| {
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(&c[..8]);
            b.copy_from_slice(&c[8..]);
            let value = f64::from_le_bytes(b);
            value.is_finite().then_some(Record {
                unix_ms: u64::from_le_bytes(a),
                value,
            })
        })
        .collect()
}

impl Store {
    /// Opens (creating it if needed) the directory.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, DeviceError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
        Ok(Store { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.hist"))
    }

    /// The last `keep` records of device `name` (none if it has no file).
    pub fn load(&self, name: &str, keep: usize) -> Result<Vec<Record>, DeviceError> {
        let p = self.file(name);
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("reading", &p, e)),
        };
        let mut v = decode(&bytes);
        let skip = v.len().saturating_sub(keep);
        v.drain(..skip);
        Ok(v)
    }

    /// Appends records to device `name`'s file; when the file then holds
    /// more than four times `keep` records, rewrites it with the last
    /// `keep`.
    pub fn append(&self, name: &str, records: &[Record], keep: usize) -> Result<(), DeviceError> {
        if records.is_empty() {
            return Ok(());
        }
        let p = self.file(name);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .map_err(|e| io("opening", &p, e))?;
        // a torn record from a crash would shift every later one: pad the
        // file back to a whole number of records first
        let len = f.metadata().map_err(|e| io("reading", &p, e))?.len();
        let torn = (len % RECORD as u64) as usize;
        if torn != 0 {
            f.set_len(len - torn as u64)
                .map_err(|e| io("truncating", &p, e))?;
        }
        f.write_all(&encode(records))
            .map_err(|e| io("writing", &p, e))?;
        let total = (len as usize - torn) / RECORD + records.len();
        if total > keep.max(1) * 4 {
            let kept = self.load(name, keep)?;
            let tmp = self.dir.join(format!(".{name}.hist.tmp"));
            std::fs::write(&tmp, encode(&kept)).map_err(|e| io("writing", &tmp, e))?;
            std::fs::rename(&tmp, &p).map_err(|e| io("renaming", &tmp, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tmp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("mintgate-store-{}-{tag}", std::process::id()))
    }

    #[test]
    fn appends_load_and_compact() {
        let d = tmp("basic");
        let _ = std::fs::remove_dir_all(&d);
        let s = Store::open(&d).unwrap();
        assert!(s.load("t", 10).unwrap().is_empty());
        let recs: Vec<Record> = (0..30)
            .map(|i| Record {
                unix_ms: i,
                value: i as f64 / 2.0,
            })
            .collect();
        for chunk in recs.chunks(7) {
            s.append("t", chunk, 5).unwrap();
        }
        // compacted: never more than 4 x 5 records on disk
        let len = std::fs::metadata(d.join("t.hist")).unwrap().len() as usize;
        assert!(len <= 20 * RECORD, "{len}");
        assert_eq!(s.load("t", 5).unwrap(), recs[25..].to_vec());
        // a torn tail (crash mid-write) is ignored, then repaired
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.join("t.hist"))
            .unwrap();
        f.write_all(&[1, 2, 3]).unwrap();
        assert_eq!(s.load("t", 5).unwrap(), recs[25..].to_vec());
        let more = [Record {
            unix_ms: 99,
            value: 9.0,
        }];
        s.append("t", &more, 5).unwrap();
        assert_eq!(s.load("t", 2).unwrap(), vec![recs[29], more[0]]);
        let _ = std::fs::remove_dir_all(&d);
    }

    proptest! {
        #[test]
        fn decode_never_panics_and_round_trips(
            junk in proptest::collection::vec(any::<u8>(), 0..100),
            recs in proptest::collection::vec((any::<u64>(), -1e12f64..1e12), 0..40),
        ) {
            let _ = decode(&junk);
            let recs: Vec<Record> = recs.into_iter().map(|(unix_ms, value)| Record { unix_ms, value }).collect();
            prop_assert_eq!(decode(&encode(&recs)), recs);
        }
    }
}
