//! Content-Format <-> Content-Type: the media types of the CoAP crate's one
//! table ([`mintgate_coap::wire::ContentFormat::NAMES`]), and
//! `application/coap-payload; cf=N` (RFC 8075 section 5.4) for the rest.
//!
//! Invariant: one table serves both directions, so a Content-Format that
//! has a media type maps there and back to itself.

/// Media types with a Content-Format: the CoAP crate's one table.
const MEDIA: &[(u16, &str)] = &mintgate_coap::wire::ContentFormat::NAMES;

/// The HTTP Content-Type for a Content-Format.
pub fn content_type_for(cf: u16) -> String {
    match MEDIA.iter().find(|(n, _)| *n == cf) {
        Some((0, _)) => "text/plain; charset=utf-8".to_owned(),
        Some((_, m)) => (*m).to_owned(),
        None => format!("application/coap-payload; cf={cf}"),
    }
}

/// The Content-Format for an HTTP media type (parameters other than
/// `charset` on text/plain and `cf` on application/coap-payload are
/// ignored). `None` when it has none.
pub fn content_format_for(media: &str) -> Option<u16> {
    let mut parts = media.split(';').map(|p| p.trim());
    let ty = parts.next()?.to_ascii_lowercase();
    let params: Vec<(String, String)> = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_ascii_lowercase(),
                v.trim().trim_matches('"').to_ascii_lowercase(),
            )
        })
        .collect();
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    match ty.as_str() {
        "text/plain" => match param("charset") {
            None | Some("utf-8") | Some("us-ascii") => Some(0),
            Some(_) => None,
        },
        "application/coap-payload" => param("cf")?.parse().ok(),
        _ => MEDIA
            .iter()
            .find(|(n, m)| *n != 0 && *m == ty)
            .map(|(n, _)| *n),
    }
}
