//! History files (`mintgate_devices::store::decode`), both formats.
//!
//! The input is read two ways. As a whole file: decoding never panics, the
//! records it yields are finite, fit in the input and encode back to a file
//! that decodes to them; the good length never passes the end. As the
//! bytes of records written into a valid file, which is then damaged the
//! way a crash or power loss damages one (cut at a point the input picks,
//! zero-filled behind its end, one byte flipped): a cut keeps exactly the
//! whole records before it, zeros are never read, a flipped byte loses at
//! most its own record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mintgate_devices::history::Record;
use mintgate_devices::store::{self, Format, HEADER, LEGACY_RECORD, RECORD};

fuzz_target!(|data: &[u8]| {
    let d = store::decode(data);
    assert!(d.good_len <= data.len());
    assert!(d.records.len() <= data.len() / RECORD.min(LEGACY_RECORD));
    assert!(d.records.iter().all(|r| r.value.is_finite()));
    assert_eq!(store::decode(&store::encode_file(&d.records)).records, d.records);
    if d.format == Format::Checked {
        // what an append keeps holds every record
        assert_eq!(store::decode(&data[..d.good_len]).records, d.records);
    }

    let Some((&knobs, body)) = data.split_first() else {
        return;
    };
    let recs: Vec<Record> = body
        .chunks_exact(LEGACY_RECORD)
        .map(|c| {
            let mut ms = [0u8; 8];
            let mut v = [0u8; 8];
            ms.copy_from_slice(&c[..8]);
            v.copy_from_slice(&c[8..]);
            Record {
                unix_ms: u64::from_le_bytes(ms),
                value: f64::from_le_bytes(v),
            }
        })
        .filter(|r| r.value.is_finite())
        .collect();
    let file = store::encode_file(&recs);
    let whole = store::decode(&file);
    assert_eq!(whole.records, recs);
    assert_eq!((whole.good_len, whole.damaged), (file.len(), 0));

    let at = HEADER + (knobs as usize * (file.len() - HEADER)) / 255;
    let n = (at - HEADER) / RECORD;
    assert_eq!(store::decode(&file[..at]).records, recs[..n]);

    let mut zeroed = file.clone();
    zeroed.resize(file.len() + body.len() % 97, 0);
    let z = store::decode(&zeroed);
    assert_eq!(z.records, recs);
    assert_eq!(z.good_len, file.len());

    if !recs.is_empty() {
        let mut flipped = file.clone();
        let i = HEADER + (body.len() * 31 + knobs as usize) % (file.len() - HEADER);
        flipped[i] ^= 1 << (knobs % 8);
        let f = store::decode(&flipped);
        let hit = (i - HEADER) / RECORD;
        let mut want = recs.clone();
        want.remove(hit);
        assert_eq!(f.records, want, "flipped byte {i} of record {hit}");
    }
});
