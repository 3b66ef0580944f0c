//! Persistence of device histories, so that a restart keeps them: one
//! append-only file per device in a directory, `NAME.hist`.
//!
//! # Format
//! An 8-byte header ([`MAGIC`]), then fixed 20-byte records: Unix
//! milliseconds (u64), the value (f64), and a CRC-32 (IEEE) of those 16
//! bytes, all little-endian. A record whose checksum fails is skipped; a
//! failed or partial tail (a crash mid-write, or the zero-filled blocks a
//! power loss can leave behind a file's last sync) is cut off before the
//! next append, never read as records. A file without the header is in
//! the old format (16-byte records, no checksum): it is read as before
//! (records that are all zero bytes, or whose value is not finite, are
//! skipped) and rewritten in the new format at its first append.
//!
//! # Durability (the sync policy)
//! - The device manager's flusher appends each device's new records once a
//!   second (one `write` per file, never on a driver's thread or the direct
//!   path's worker). A process crash (`kill -9`) loses nothing written:
//!   the page cache keeps it.
//! - Appended records are forced to disk ([`Store::sync`], `fsync`) at most
//!   every `devices.store_sync` (default 1 s) and on a clean shutdown. A
//!   power loss or kernel crash loses at most the records of that last
//!   interval; what it leaves of them is cut at the next start.
//! - A file grown past four times the history it backs is compacted, and a
//!   new or old-format file is written, through [`Store`]'s rewrite: the
//!   new contents go to `.NAME.hist.tmp`, which is synced, then renamed
//!   over `NAME.hist`, then the directory is synced. A crash at any step
//!   leaves either the old file or the new one whole; a leftover temporary
//!   file is removed when the store is opened.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::driver::DeviceError;
use crate::history::Record;

/// The first bytes of a history file in the checked format.
pub const MAGIC: [u8; 8] = *b"MGHIST\0\x02";
/// Bytes of the header.
pub const HEADER: usize = MAGIC.len();
/// Bytes per record: time, value, CRC-32.
pub const RECORD: usize = 20;
/// Bytes per record of the old format (time, value; no checksum).
pub const LEGACY_RECORD: usize = 16;
/// The default of `devices.store_sync`.
pub const DEFAULT_SYNC: Duration = Duration::from_secs(1);
/// The bounds of `devices.store_sync`.
pub const SYNC_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(3600));

/// Files whose verified length the store remembers (more are forgotten,
/// and checked again at their next append).
const MAX_TRACKED: usize = 4096;

/// Which format a file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// No bytes at all.
    Empty,
    /// The header and checked records.
    Checked,
    /// The old format: bare 16-byte records.
    Legacy,
}

/// What [`decode`] found in a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The format.
    pub format: Format,
    /// The records that checked (and whose value is finite), in file order.
    pub records: Vec<Record>,
    /// Bytes up to the end of the last record that checked (the header's
    /// end when none did): what an append keeps. Always 0 for the old
    /// format, which is rewritten whole.
    pub good_len: usize,
    /// Records before `good_len` that failed their check (damage inside
    /// the file, not a torn tail).
    pub damaged: usize,
}

impl Decoded {
    /// Bytes past the last good record that an append cuts off.
    pub fn tail(&self, file_len: usize) -> usize {
        file_len.saturating_sub(self.good_len)
    }
}

fn crc(body: &[u8]) -> u32 {
    crc32fast::hash(body)
}

/// Encodes records in the checked format, without the header.
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.len() * RECORD);
    for r in records {
        let start = out.len();
        out.extend_from_slice(&r.unix_ms.to_le_bytes());
        out.extend_from_slice(&r.value.to_le_bytes());
        let sum = crc(&out[start..]);
        out.extend_from_slice(&sum.to_le_bytes());
    }
    out
}

/// A whole file: the header, then the records.
pub fn encode_file(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + records.len() * RECORD);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&encode(records));
    out
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Decodes a history file of either format. Never fails: what does not
/// check is skipped (inside the file) or left out of `good_len` (at its
/// end).
pub fn decode(bytes: &[u8]) -> Decoded {
    if bytes.is_empty() {
        return Decoded {
            format: Format::Empty,
            records: Vec::new(),
            good_len: 0,
            damaged: 0,
        };
    }
    let Some(body) = bytes.strip_prefix(&MAGIC) else {
        return decode_legacy(bytes);
    };
    let mut records = Vec::with_capacity(body.len() / RECORD);
    let mut good_len = HEADER;
    let mut bad_since_good = 0;
    let mut damaged = 0;
    for (i, c) in body.chunks_exact(RECORD).enumerate() {
        let stored = u32::from_le_bytes([c[16], c[17], c[18], c[19]]);
        if crc(&c[..16]) != stored {
            bad_since_good += 1;
            continue;
        }
        damaged += bad_since_good;
        bad_since_good = 0;
        good_len = HEADER + (i + 1) * RECORD;
        let value = f64::from_bits(le_u64(&c[8..16]));
        if value.is_finite() {
            records.push(Record {
                unix_ms: le_u64(&c[..8]),
                value,
            });
        }
    }
    Decoded {
        format: Format::Checked,
        records,
        good_len,
        damaged,
    }
}

/// The old format: whole 16-byte records (a torn tail ignored), skipping
/// all-zero ones (a zero-filled tail; no clock reads 0) and values that
/// are not finite (never written: a damaged file).
fn decode_legacy(bytes: &[u8]) -> Decoded {
    let records = bytes
        .chunks_exact(LEGACY_RECORD)
        .filter(|c| c.iter().any(|&b| b != 0))
        .filter_map(|c| {
            let value = f64::from_bits(le_u64(&c[8..]));
            value.is_finite().then_some(Record {
                unix_ms: le_u64(c),
                value,
            })
        })
        .collect();
    Decoded {
        format: Format::Legacy,
        records,
        good_len: 0,
        damaged: 0,
    }
}

/// A step of a rewrite, after which a test can make it fail as a crash
/// there would.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The temporary file is written, not yet synced.
    Written,
    /// It is synced, not yet renamed.
    Synced,
    /// It is renamed over the file, the directory not yet synced.
    Renamed,
}

#[derive(Default)]
struct State {
    /// Per file, the length this store last wrote or verified: an append
    /// to a file of that length needs no check.
    ends: HashMap<String, u64>,
    /// Files appended to since the last sync.
    dirty: HashSet<String>,
    #[cfg(test)]
    fail_after: Option<Step>,
}

/// A directory of history files.
#[derive(Clone)]
pub struct Store {
    dir: PathBuf,
    sync_every: Duration,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .field("sync_every", &self.sync_every)
            .finish()
    }
}

fn io(what: &str, p: &Path, source: std::io::Error) -> DeviceError {
    DeviceError::Io {
        what: format!("{what} {}", p.display()),
        cause: source,
    }
}

fn not_found(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
}

/// `devices.store_sync` as a duration, checked against [`SYNC_RANGE`].
pub fn parse_sync(s: &str) -> Result<Duration, String> {
    let d = crate::parse::duration(s)?;
    let (lo, hi) = SYNC_RANGE;
    if d < lo || d > hi {
        return Err(format!("{s} is outside 1s..=1h"));
    }
    Ok(d)
}

impl Store {
    /// Opens (creating it if needed) the directory, removing temporary
    /// files a crash left in the middle of a rewrite. Syncs every
    /// [`DEFAULT_SYNC`]; see [`Store::with_sync_every`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, DeviceError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
        let entries = std::fs::read_dir(&dir).map_err(|e| io("listing", &dir, e))?;
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".hist.tmp") {
                let p = e.path();
                match std::fs::remove_file(&p) {
                    Ok(()) => {
                        tracing::info!(path = %p.display(), "removed an unfinished history rewrite")
                    }
                    Err(e) => return Err(io("removing", &p, e)),
                }
            }
        }
        Ok(Store {
            dir,
            sync_every: DEFAULT_SYNC,
            state: Arc::default(),
        })
    }

    /// The same store, synced at most every `every` (see the module's
    /// sync policy).
    pub fn with_sync_every(mut self, every: Duration) -> Store {
        self.sync_every = every;
        self
    }

    /// How often appended records are synced.
    pub fn sync_every(&self) -> Duration {
        self.sync_every
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.hist"))
    }

    fn tmp_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!(".{name}.hist.tmp"))
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, DeviceError> {
        let p = self.file(name);
        match std::fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(io("reading", &p, e)),
        }
    }

    /// The last `keep` records of device `name` (none if it has no file).
    pub fn load(&self, name: &str, keep: usize) -> Result<Vec<Record>, DeviceError> {
        let Some(bytes) = self.read(name)? else {
            return Ok(Vec::new());
        };
        let d = decode(&bytes);
        if d.damaged > 0 || d.tail(bytes.len()) > 0 {
            tracing::warn!(
                device = name,
                damaged = d.damaged,
                tail_bytes = d.tail(bytes.len()),
                "history file: records that fail their checksum are skipped"
            );
        }
        let mut v = d.records;
        let skip = v.len().saturating_sub(keep);
        v.drain(..skip);
        Ok(v)
    }

    fn remember(&self, name: &str, end: u64) {
        let mut st = self.state.lock();
        if st.ends.len() >= MAX_TRACKED && !st.ends.contains_key(name) {
            st.ends.clear();
        }
        st.ends.insert(name.to_string(), end);
    }

    /// Appends records to device `name`'s file. A file this store has not
    /// written yet is checked first: a torn or zero-filled tail is cut, an
    /// old-format file rewritten in the checked format. When the file then
    /// holds more than four times `keep` records, it is rewritten with the
    /// last `keep`. The records reach the disk at the next [`Store::sync`]
    /// (a rewrite syncs at once).
    pub fn append(&self, name: &str, records: &[Record], keep: usize) -> Result<(), DeviceError> {
        if records.is_empty() {
            return Ok(());
        }
        let keep = keep.max(1);
        let p = self.file(name);
        let mut f = match OpenOptions::new().append(true).open(&p) {
            Ok(f) => f,
            Err(e) if not_found(&e) => return self.rewrite(name, records, keep),
            Err(e) => return Err(io("opening", &p, e)),
        };
        let len = f.metadata().map_err(|e| io("reading", &p, e))?.len();
        let known = self.state.lock().ends.get(name).copied();
        let end = if known == Some(len) {
            len
        } else {
            let bytes = self.read(name)?.unwrap_or_default();
            let d = decode(&bytes);
            match d.format {
                Format::Checked => {
                    let good = d.good_len as u64;
                    if good < len {
                        tracing::warn!(
                            device = name,
                            bytes = len - good,
                            "history file: cutting a torn or zero-filled tail"
                        );
                        f.set_len(good).map_err(|e| io("truncating", &p, e))?;
                    }
                    good
                }
                Format::Empty | Format::Legacy => {
                    if d.format == Format::Legacy {
                        tracing::info!(
                            device = name,
                            "history file: rewriting in the checked format"
                        );
                    }
                    drop(f);
                    let mut all = d.records;
                    all.extend_from_slice(records);
                    let skip = all.len().saturating_sub(keep);
                    return self.rewrite(name, &all[skip..], keep);
                }
            }
        };
        let bytes = encode(records);
        if let Err(e) = f.write_all(&bytes) {
            // a partial write leaves a tail the next append checks and cuts
            self.state.lock().ends.remove(name);
            return Err(io("writing", &p, e));
        }
        let end = end + bytes.len() as u64;
        self.remember(name, end);
        self.state.lock().dirty.insert(name.to_string());
        let total = (end as usize).saturating_sub(HEADER) / RECORD;
        if total > keep.saturating_mul(4) {
            let kept = self.load(name, keep)?;
            self.rewrite(name, &kept, keep)?;
        }
        Ok(())
    }

    /// Replaces device `name`'s file with `records` (at most the last
    /// `keep`), durably: written to a temporary file, synced, renamed over
    /// the file, the directory synced.
    fn rewrite(&self, name: &str, records: &[Record], keep: usize) -> Result<(), DeviceError> {
        let skip = records.len().saturating_sub(keep);
        let bytes = encode_file(&records[skip..]);
        let (p, tmp) = (self.file(name), self.tmp_file(name));
        // forgotten until done: a failure at any step leaves a file that
        // the next append checks again
        self.state.lock().ends.remove(name);
        let mut f = File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
        f.write_all(&bytes).map_err(|e| io("writing", &tmp, e))?;
        #[cfg(test)]
        self.fault(Step::Written)?;
        f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
        drop(f);
        #[cfg(test)]
        self.fault(Step::Synced)?;
        std::fs::rename(&tmp, &p).map_err(|e| io("renaming", &tmp, e))?;
        #[cfg(test)]
        self.fault(Step::Renamed)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("syncing", &self.dir, e))?;
        self.remember(name, bytes.len() as u64);
        self.state.lock().dirty.remove(name);
        Ok(())
    }

    /// Forces every file appended to since the last call to disk (fsync).
    /// Returns how many files it synced; on errors, the first (the others
    /// are still tried).
    pub fn sync(&self) -> Result<usize, DeviceError> {
        let names = std::mem::take(&mut self.state.lock().dirty);
        let mut first_err = None;
        let mut synced = 0;
        for n in &names {
            let p = self.file(n);
            match File::open(&p).and_then(|f| f.sync_data()) {
                Ok(()) => synced += 1,
                Err(e) if not_found(&e) => {}
                Err(e) => {
                    // what the kernel could not write may be gone from the
                    // file: check it again before the next append
                    self.state.lock().ends.remove(n);
                    first_err.get_or_insert(io("syncing", &p, e));
                }
            }
        }
        first_err.map_or(Ok(synced), Err)
    }

    /// Makes the step fail if a test asked for it (as a crash right after
    /// it would leave the files).
    #[cfg(test)]
    fn fault(&self, step: Step) -> Result<(), DeviceError> {
        if self.state.lock().fail_after == Some(step) {
            return Err(DeviceError::Io {
                what: format!("injected fault after {step:?}"),
                cause: std::io::Error::other("test"),
            });
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn fail_after(&self, step: Option<Step>) {
        self.state.lock().fail_after = step;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mintgate-store-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn recs(from: u64, n: u64) -> Vec<Record> {
        (from..from + n)
            .map(|i| Record {
                unix_ms: 1_700_000_000_000 + i,
                value: i as f64 / 2.0,
            })
            .collect()
    }

    fn append_raw(p: &Path, bytes: &[u8]) {
        OpenOptions::new()
            .append(true)
            .open(p)
            .unwrap()
            .write_all(bytes)
            .unwrap();
    }

    fn file_len(p: &Path) -> usize {
        std::fs::metadata(p).unwrap().len() as usize
    }

    #[test]
    fn appends_load_and_compact() {
        let d = tmp("basic");
        let s = Store::open(&d).unwrap();
        assert!(s.load("t", 10).unwrap().is_empty());
        let all = recs(0, 30);
        for chunk in all.chunks(7) {
            s.append("t", chunk, 5).unwrap();
        }
        // compacted: never more than 4 x 5 records on disk
        let len = file_len(&d.join("t.hist"));
        assert!(len <= HEADER + 20 * RECORD, "{len}");
        assert_eq!(s.load("t", 5).unwrap(), all[25..].to_vec());
        let bytes = std::fs::read(d.join("t.hist")).unwrap();
        assert_eq!(&bytes[..HEADER], &MAGIC);
        assert_eq!(s.sync().unwrap(), 1, "the appends since the last rewrite");
        assert_eq!(s.sync().unwrap(), 0, "nothing new");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_torn_tail_is_ignored_then_cut() {
        let d = tmp("torn");
        let s = Store::open(&d).unwrap();
        let all = recs(0, 6);
        s.append("t", &all[..3], 100).unwrap();
        s.append("t", &all[3..], 100).unwrap();
        let p = d.join("t.hist");
        let whole = file_len(&p);
        // a crash in the middle of the last record's write
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len((whole - 7) as u64).unwrap();
        drop(f);
        // a restart: a new store reads what checks
        let s = Store::open(&d).unwrap();
        assert_eq!(s.load("t", 100).unwrap(), all[..5].to_vec());
        let more = recs(100, 2);
        s.append("t", &more, 100).unwrap();
        let mut want = all[..5].to_vec();
        want.extend_from_slice(&more);
        assert_eq!(s.load("t", 100).unwrap(), want);
        assert_eq!(file_len(&p), HEADER + 7 * RECORD, "the torn bytes were cut");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_zero_filled_tail_is_cut_not_read() {
        let d = tmp("zeros");
        let s = Store::open(&d).unwrap();
        let all = recs(0, 4);
        s.append("t", &all, 100).unwrap();
        let p = d.join("t.hist");
        // what a power loss can leave: the size grew, the data never came
        append_raw(&p, &[0u8; 3 * RECORD + 5]);
        let s = Store::open(&d).unwrap();
        assert_eq!(s.load("t", 100).unwrap(), all);
        let more = recs(50, 1);
        s.append("t", &more, 100).unwrap();
        assert_eq!(file_len(&p), HEADER + 5 * RECORD);
        let mut want = all.clone();
        want.extend_from_slice(&more);
        assert_eq!(s.load("t", 100).unwrap(), want);
        // a file of zeros only (its header lost too) holds nothing
        std::fs::write(&p, [0u8; 200]).unwrap();
        let s = Store::open(&d).unwrap();
        assert!(s.load("t", 100).unwrap().is_empty());
        s.append("t", &more, 100).unwrap();
        assert_eq!(s.load("t", 100).unwrap(), more);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_checksum_is_crc32_ieee_and_zeros_never_check() {
        // the standard check value of CRC-32 (IEEE 802.3)
        assert_eq!(crc(b"123456789"), 0xCBF4_3926);
        let zeros = [0u8; RECORD];
        assert_ne!(crc(&zeros[..16]), 0);
        let d = decode(&[&MAGIC[..], &zeros].concat());
        assert!(d.records.is_empty());
        assert_eq!(d.good_len, HEADER);
    }

    #[test]
    fn a_damaged_record_inside_is_skipped_and_the_rest_kept() {
        let all = recs(0, 5);
        let mut bytes = encode_file(&all);
        bytes[HEADER + 2 * RECORD + 3] ^= 0x40;
        let dec = decode(&bytes);
        let mut want = all.clone();
        want.remove(2);
        assert_eq!(dec.records, want);
        assert_eq!((dec.damaged, dec.good_len), (1, bytes.len()));
    }

    #[test]
    fn old_format_files_are_read_then_rewritten() {
        let d = tmp("legacy");
        let p = d.join("t.hist");
        std::fs::create_dir_all(&d).unwrap();
        let old = recs(0, 9);
        let mut bytes: Vec<u8> = old
            .iter()
            .flat_map(|r| {
                let mut b = r.unix_ms.to_le_bytes().to_vec();
                b.extend_from_slice(&r.value.to_le_bytes());
                b
            })
            .collect();
        // and the faults the old format had: a zero-filled record, a torn one
        bytes.extend_from_slice(&[0u8; 16]);
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&p, &bytes).unwrap();
        let s = Store::open(&d).unwrap();
        assert_eq!(s.load("t", 100).unwrap(), old);
        assert_eq!(s.load("t", 4).unwrap(), old[5..].to_vec());
        let more = recs(20, 2);
        s.append("t", &more, 100).unwrap();
        let now = std::fs::read(&p).unwrap();
        assert_eq!(&now[..HEADER], &MAGIC, "rewritten in the checked format");
        let mut want = old.clone();
        want.extend_from_slice(&more);
        assert_eq!(s.load("t", 100).unwrap(), want);
        assert_eq!(decode(&now).records, want);
        // a migration keeps only what the history keeps
        std::fs::write(&p, &bytes).unwrap();
        let s = Store::open(&d).unwrap();
        s.append("t", &more, 3).unwrap();
        assert_eq!(s.load("t", 100).unwrap(), [&old[8..], &more[..]].concat());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A crash after each step of a compaction leaves either the old file
    /// or the new one, whole; the next start reads it and goes on.
    #[test]
    fn a_crash_between_compaction_steps_loses_nothing_kept() {
        for step in [Step::Written, Step::Synced, Step::Renamed] {
            for power_loss in [false, true] {
                let d = tmp(&format!("crash-{step:?}-{power_loss}"));
                let p = d.join("t.hist");
                let tmpf = d.join(".t.hist.tmp");
                let s = Store::open(&d).unwrap();
                let all = recs(0, 20);
                // 20 = 4 x 5 records: no compaction yet (a new file is
                // written whole, with at most `keep`)
                s.append("t", &all[..1], 5).unwrap();
                s.append("t", &all[1..], 5).unwrap();
                assert_eq!(file_len(&p), HEADER + 20 * RECORD);
                s.fail_after(Some(step));
                let more = recs(100, 1);
                let e = s.append("t", &more, 5).unwrap_err().to_string();
                assert!(e.contains(&format!("after {step:?}")), "{e}");
                if power_loss && step == Step::Written {
                    // the temporary file was never synced: the power loss
                    // leaves it short or empty (it never had the name)
                    let f = OpenOptions::new().write(true).open(&tmpf).unwrap();
                    f.set_len(HEADER as u64 + 7).unwrap();
                }
                if power_loss && step == Step::Renamed {
                    // the directory was not synced: the rename may be lost,
                    // the old file back and the (synced) new one beside it
                    std::fs::rename(&p, &tmpf).unwrap();
                    let mut old = encode_file(&all);
                    old.extend_from_slice(&encode(&more));
                    std::fs::write(&p, &old).unwrap();
                }
                let mut want = all[16..].to_vec();
                want.extend_from_slice(&more);
                // the restart
                let s = Store::open(&d).unwrap();
                assert!(!tmpf.exists(), "{step:?}: the leftover is removed");
                assert_eq!(s.load("t", 5).unwrap(), want, "{step:?} {power_loss}");
                let next = recs(200, 1);
                s.append("t", &next, 5).unwrap();
                want.remove(0);
                want.extend_from_slice(&next);
                assert_eq!(s.load("t", 5).unwrap(), want, "{step:?} {power_loss}");
                let _ = std::fs::remove_dir_all(&d);
            }
        }
    }

    #[test]
    fn a_failed_first_write_leaves_no_file_to_misread() {
        let d = tmp("first");
        let s = Store::open(&d).unwrap();
        s.fail_after(Some(Step::Synced));
        assert!(s.append("t", &recs(0, 3), 10).is_err());
        assert!(!d.join("t.hist").exists());
        let s = Store::open(&d).unwrap();
        assert!(s.load("t", 10).unwrap().is_empty());
        s.append("t", &recs(0, 3), 10).unwrap();
        assert_eq!(s.load("t", 10).unwrap(), recs(0, 3));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn sync_period_is_bounded() {
        assert_eq!(parse_sync("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_sync("10m"), Ok(Duration::from_secs(600)));
        assert!(parse_sync("500ms").unwrap_err().contains("1s..=1h"));
        assert!(parse_sync("2h").is_err());
        assert!(parse_sync("soon").is_err());
    }

    fn record() -> impl Strategy<Value = Record> {
        (
            any::<u64>(),
            any::<f64>().prop_filter("finite", |v| v.is_finite()),
        )
            .prop_map(|(unix_ms, value)| Record { unix_ms, value })
    }

    proptest! {
        /// The record parser: never panics; keeps every record a valid file
        /// holds; a cut anywhere keeps exactly the whole records before it;
        /// zeros behind the last record are never read; junk bytes decode
        /// to records that encode back the same.
        #[test]
        fn record_parser(
            junk in proptest::collection::vec(any::<u8>(), 0..200),
            rs in proptest::collection::vec(record(), 0..40),
            cut in any::<prop::sample::Index>(),
            zeros in 0usize..100,
        ) {
            let d = decode(&junk);
            prop_assert!(d.good_len <= junk.len());
            prop_assert!(d.records.iter().all(|r| r.value.is_finite()));
            prop_assert!(d.records.len() <= junk.len() / RECORD.min(LEGACY_RECORD));
            prop_assert_eq!(decode(&encode_file(&d.records)).records, d.records.clone());

            let file = encode_file(&rs);
            let whole = decode(&file);
            prop_assert_eq!(whole.format, Format::Checked);
            prop_assert_eq!(&whole.records, &rs);
            prop_assert_eq!((whole.good_len, whole.damaged), (file.len(), 0));

            let at = cut.index(file.len() + 1);
            let part = decode(&file[..at]);
            if at >= HEADER {
                let n = (at - HEADER) / RECORD;
                prop_assert_eq!(&part.records[..], &rs[..n]);
                prop_assert_eq!(part.good_len, HEADER + n * RECORD);
            } else {
                prop_assert!(part.records.is_empty());
            }

            let mut padded = file.clone();
            padded.resize(file.len() + zeros, 0);
            let z = decode(&padded);
            prop_assert_eq!(&z.records, &rs);
            prop_assert_eq!(z.good_len, file.len());
            prop_assert_eq!(z.tail(padded.len()), zeros);
        }
    }
}
