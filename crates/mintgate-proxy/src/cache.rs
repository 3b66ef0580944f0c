//! The response cache: [`mintgate_coap::cache`] (Max-Age freshness, ETag
//! revalidation, bounded entries and bytes), keyed by the upstream's
//! authority as this proxy names it.

pub use mintgate_coap::cache::{Cache, CacheKey, CacheStats, Lookup};

use crate::mapping::{Authority, CoapRequest};

/// The cache key of `req` to `authority`.
pub fn key(authority: &Authority, req: &CoapRequest) -> CacheKey {
    let origin = if authority.host.contains(':') {
        format!("[{}]:{}", authority.host, authority.port)
    } else {
        format!("{}:{}", authority.host, authority.port)
    };
    CacheKey::new(&origin, req.code, &req.options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mintgate_coap::wire::{Code, OptionNumber};

    fn req(path: &str) -> CoapRequest {
        CoapRequest {
            code: Code::GET,
            options: vec![(OptionNumber::URI_PATH, path.as_bytes().to_vec())],
            payload: vec![],
        }
    }

    #[test]
    fn key_separates_authorities_and_paths_not_etags() {
        let auth = Authority::new("127.0.0.1", 5683);
        let a = req("a");
        let mut a_etag = a.clone();
        a_etag.options.push((OptionNumber::ETAG, vec![1, 2]));
        let k = key(&auth, &a);
        assert_eq!(k, key(&Authority::new("127.0.0.1", 5683), &a));
        assert_ne!(k, key(&auth, &req("b")));
        assert_ne!(k, key(&Authority::new("::1", 5683), &a));
        assert_ne!(k, key(&Authority::new("127.0.0.1", 5684), &a));
        assert_eq!(k, key(&auth, &a_etag));
    }
}
