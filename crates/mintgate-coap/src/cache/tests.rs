//! The cache's rules in virtual time.

use proptest::prelude::*;

use super::*;
use crate::wire::encode_uint;

fn get(path: &str) -> Vec<(OptionNumber, Vec<u8>)> {
    vec![(OptionNumber::URI_PATH, path.as_bytes().to_vec())]
}

fn key(path: &str) -> CacheKey {
    CacheKey::new("127.0.0.1:5683", Code::GET, &get(path))
}

fn resp(code: Code, max_age: Option<u32>, etag: Option<&[u8]>, body: &str) -> Response {
    let mut options = Vec::new();
    if let Some(e) = etag {
        options.push((OptionNumber::ETAG, Bytes::copy_from_slice(e)));
    }
    if let Some(m) = max_age {
        options.push((
            OptionNumber::MAX_AGE,
            Bytes::copy_from_slice(encode_uint(m, &mut [0; 4])),
        ));
    }
    Response {
        code,
        options,
        payload: Bytes::copy_from_slice(body.as_bytes()),
    }
}

#[test]
fn fresh_until_max_age_then_miss() {
    let mut c = Cache::new(8, 1024);
    let t0 = Instant::now();
    let k = key("a");
    assert_eq!(c.lookup(&k, t0), Lookup::Miss);
    assert!(c.store(k.clone(), &resp(Code::CONTENT, Some(10), None, "x"), t0));
    match c.lookup(&k, t0 + Duration::from_secs(3)) {
        Lookup::Fresh(r, age) => {
            assert_eq!(&r.payload[..], b"x");
            assert_eq!(age, 3);
        }
        other => panic!("expected fresh, got {other:?}"),
    }
    assert_eq!(c.lookup(&k, t0 + Duration::from_secs(10)), Lookup::Miss);
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (1, 2));
}

#[test]
fn default_max_age_is_60s_and_zero_is_not_stored() {
    let mut c = Cache::new(8, 1024);
    let t0 = Instant::now();
    let k = key("a");
    assert!(c.store(k.clone(), &resp(Code::CONTENT, None, None, "x"), t0));
    assert!(matches!(
        c.lookup(&k, t0 + Duration::from_secs(59)),
        Lookup::Fresh(..)
    ));
    assert_eq!(c.lookup(&k, t0 + Duration::from_secs(60)), Lookup::Miss);
    let k2 = key("b");
    assert!(!c.store(k2.clone(), &resp(Code::CONTENT, Some(0), None, "x"), t0));
    assert_eq!(c.lookup(&k2, t0), Lookup::Miss);
}

#[test]
fn uncacheable_codes_and_big_payloads_are_not_stored() {
    let mut c = Cache::new(8, 4);
    let t0 = Instant::now();
    let k = key("a");
    assert!(!c.store(k.clone(), &resp(Code::CHANGED, Some(10), None, "x"), t0));
    assert!(!c.store(k.clone(), &resp(Code::CREATED, Some(10), None, "x"), t0));
    assert!(!c.store(k.clone(), &resp(Code::VALID, Some(10), None, ""), t0));
    assert!(!c.store(k.clone(), &resp(Code::CONTENT, Some(10), None, "12345"), t0));
    assert!(c.is_empty());
    assert!(c.store(k.clone(), &resp(Code::NOT_FOUND, Some(10), None, ""), t0));
    assert_eq!(c.len(), 1);
}

#[test]
fn key_separates_origins_paths_and_accept_not_etags_sizes_or_blocks() {
    let a = get("a");
    let with = |n: OptionNumber, v: &[u8]| {
        let mut o = a.clone();
        o.push((n, v.to_vec()));
        CacheKey::new("h:1", Code::GET, &o)
    };
    let k = CacheKey::new("h:1", Code::GET, &a);
    assert_ne!(k, CacheKey::new("h:1", Code::GET, &get("b")));
    assert_ne!(k, CacheKey::new("h:2", Code::GET, &a));
    assert_ne!(k, CacheKey::new("h:1", Code::FETCH, &a));
    assert_ne!(k, with(OptionNumber::ACCEPT, &[50]));
    for n in [
        OptionNumber::ETAG,
        OptionNumber::SIZE2,
        OptionNumber::SIZE1,
        OptionNumber::BLOCK2,
        OptionNumber::BLOCK1,
        OptionNumber::IF_NONE_MATCH,
    ] {
        assert_eq!(k, with(n, &[1]), "{n:?}");
    }
    // path order matters
    let ab = [get("a"), get("b")].concat();
    let ba = [get("b"), get("a")].concat();
    assert_ne!(
        CacheKey::new("h:1", Code::GET, &ab),
        CacheKey::new("h:1", Code::GET, &ba)
    );
}

#[test]
fn stale_with_etag_is_revalidated_by_a_matching_2_03() {
    let mut c = Cache::new(8, 1024);
    let t0 = Instant::now();
    let k = key("a");
    c.store(
        k.clone(),
        &resp(Code::CONTENT, Some(5), Some(b"\x01\x02"), "body"),
        t0,
    );
    let t1 = t0 + Duration::from_secs(6);
    assert_eq!(c.lookup(&k, t1), Lookup::Stale(vec![1, 2]));
    let r = c
        .revalidated(&k, &resp(Code::VALID, Some(30), Some(b"\x01\x02"), ""), t1)
        .expect("refreshed");
    assert_eq!(&r.payload[..], b"body");
    assert_eq!(r.max_age(), Some(30));
    assert!(matches!(
        c.lookup(&k, t1 + Duration::from_secs(29)),
        Lookup::Fresh(..)
    ));
    // a 2.03 with another ETag drops the entry
    let t2 = t1 + Duration::from_secs(31);
    assert_eq!(c.lookup(&k, t2), Lookup::Stale(vec![1, 2]));
    assert!(c
        .revalidated(&k, &resp(Code::VALID, Some(30), Some(b"\x09"), ""), t2)
        .is_none());
    assert_eq!(c.lookup(&k, t2), Lookup::Miss);
    assert_eq!(c.bytes(), 0);
}

#[test]
fn capacity_is_a_bound_and_oldest_goes_first() {
    let mut c = Cache::new(3, 1024);
    let t0 = Instant::now();
    for i in 0..10 {
        c.store(
            key(&format!("r{i}")),
            &resp(Code::CONTENT, Some(100), None, "x"),
            t0,
        );
        assert!(c.len() <= 3);
    }
    assert_eq!(c.len(), 3);
    assert_eq!(c.stats().evictions, 7);
    assert_eq!(c.lookup(&key("r6"), t0), Lookup::Miss);
    assert!(matches!(c.lookup(&key("r9"), t0), Lookup::Fresh(..)));
    // refreshing one key many times does not grow the queue unboundedly
    for _ in 0..1000 {
        c.store(key("r9"), &resp(Code::CONTENT, Some(100), None, "y"), t0);
    }
    assert!(c.order.len() <= 4 * 16 + 1);
    assert_eq!(c.len(), 3);
}

#[test]
fn bytes_are_a_bound_too() {
    let one = resp(Code::CONTENT, Some(100), None, &"x".repeat(100));
    let per = one.size() + key("r0").size();
    let mut c = Cache::new(100, 1024).with_max_bytes(3 * per);
    let t0 = Instant::now();
    for i in 0..5 {
        assert!(c.store(key(&format!("r{i}")), &one, t0));
        assert!(c.bytes() <= 3 * per);
    }
    assert_eq!((c.len(), c.bytes()), (3, 3 * per));
    assert_eq!(c.lookup(&key("r1"), t0), Lookup::Miss, "oldest went");
    // one response larger than the whole bound is not stored at all
    let big = resp(Code::CONTENT, Some(100), None, &"x".repeat(4 * per));
    let mut c2 = Cache::new(100, 1 << 20).with_max_bytes(3 * per);
    assert!(!c2.store(key("big"), &big, t0));
    // replacing an entry does not count it twice
    for _ in 0..10 {
        c.store(key("r4"), &one, t0);
    }
    assert_eq!(c.bytes(), 3 * per);
}

#[test]
fn zero_capacity_stores_nothing() {
    let mut c = Cache::new(0, 1024);
    let k = key("a");
    assert!(!c.store(
        k.clone(),
        &resp(Code::CONTENT, Some(10), None, "x"),
        Instant::now()
    ));
    assert_eq!(c.lookup(&k, Instant::now()), Lookup::Miss);
}

proptest! {
    /// Random stores, lookups, revalidations and invalidations over a few
    /// keys as time passes: the bounds hold and `bytes` is the sum.
    #[test]
    fn bounds_hold(ops in proptest::collection::vec((0u8..4, 0usize..8, 0usize..300, 0u32..20, any::<bool>(), 0u64..5000), 1..300)) {
        let mut c = Cache::new(5, 256).with_max_bytes(600);
        let mut now = Instant::now();
        for (op, k, len, max_age, tag, wait) in ops {
            now += Duration::from_millis(wait);
            let k = key(&format!("k{k}"));
            let etag: Option<&[u8]> = if tag { Some(b"t") } else { None };
            match op {
                0 => { c.store(k, &resp(Code::CONTENT, Some(max_age), etag, &"x".repeat(len)), now); }
                1 => { c.lookup(&k, now); }
                2 => { c.revalidated(&k, &resp(Code::VALID, Some(max_age), etag, ""), now); }
                _ => c.invalidate(&k),
            }
            prop_assert!(c.len() <= 5);
            prop_assert!(c.bytes() <= 600);
            prop_assert_eq!(c.bytes(), c.entries.values().map(|e| e.bytes).sum::<usize>());
            for (key, e) in &c.entries {
                prop_assert_eq!(c.order.iter().filter(|(k, g)| k == key && *g == e.generation).count(), 1);
            }
        }
    }
}
