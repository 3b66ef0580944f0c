// Parses outside input: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]
//! The HTTP <-> CoAP mapping of RFC 8075 as pure functions: no I/O, no
//! clock, nothing async. The servers (HTTP/1.1, HTTP/2, HTTP/3) all go
//! through these.
//!
//! - Target: the default form `/hc/coap://host[:port]/path?query` (the RFC's
//!   `/hc/{+tu}` template; a percent-encoded target is accepted too) and
//!   configured reverse mappings (`/prefix/rest` to `coap://host/base/rest`,
//!   longest prefix first, on segment boundaries).
//! - Method: GET, HEAD (as GET, body dropped), POST, PUT, DELETE, FETCH,
//!   PATCH, iPATCH; anything else 501.
//! - Request headers: Content-Type -> Content-Format (415 when it has no
//!   Content-Format), Accept -> Accept, If-Match -> If-Match, If-None-Match:
//!   `*` -> If-None-Match, If-None-Match with entity tags on GET/HEAD -> ETag
//!   options (validation), Cache-Control: no-cache/no-store -> bypass the
//!   cache.
//! - Response: the status table of RFC 8075 section 7, Content-Format ->
//!   Content-Type (`application/coap-payload; cf=N` when it has no media
//!   type), Max-Age -> Cache-Control (and Retry-After on 5.03), ETag -> ETag
//!   (strong, hex), Location-Path/Location-Query -> Location (back through
//!   the reverse mapping when the location lies under it), 2.03 -> 304 when
//!   the request was conditional.
//! - OSCORE (RFC 8613 section 11): a request with the `OSCORE` header
//!   field is a protected CoAP request, forwarded with its option and body
//!   and nothing else; a response with the OSCORE option goes back with the
//!   header field and `application/oscore` ([`oscore`]).
//! - A response that cannot be understood (not a response code, a critical
//!   option this proxy does not know, a block-wise answer, a malformed
//!   option value) is 502.
//!
//! Invariant: every function here returns an error value rather than
//! panicking on any input, however malformed; [`ProxyError`] carries the
//! HTTP status to answer with.

//!
//! The parts: [`target`] (which CoAP resource a request names: `/hc/`
//! URIs, authorities, reverse mappings), [`request`] (HTTP request -> CoAP
//! request), [`oscore`] (OSCORE messages over HTTP), [`response`] (CoAP response -> HTTP response: status and
//! headers) and [`media`] (the Content-Format <-> Content-Type table). All
//! their public items are re-exported here, where callers name them.

use std::fmt;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

mod media;
mod oscore;
mod request;
mod response;
mod target;

pub use media::{content_format_for, content_type_for};
pub use oscore::{
    header_from_option, is_oscore, map_oscore_request, option_from_header, APPLICATION_OSCORE,
    OSCORE_HEADER, OSCORE_OPTION,
};
pub use request::{
    map_method, map_request, safe_for_early_data, CoapRequest, RequestInfo, MAPPED_REQUEST_HEADERS,
};
pub use response::{
    etag_from_http, etag_to_http, location_for, map_response, map_status, CoapResponse,
    ResponseContext, DEFAULT_MAX_AGE, KNOWN_RESPONSE_OPTIONS,
};
pub use target::{
    pct_decode, pct_encode, resolve_target, Authority, CoapTarget, ReverseMapping, Via, COAP_PORT,
    HC_PREFIX,
};

/// An HTTP error the proxy answers with instead of a mapped response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyError {
    /// The status.
    pub status: StatusCode,
    /// A one-line explanation, sent as the text/plain body.
    pub message: String,
    /// Seconds for a Retry-After header (429, 503).
    pub retry_after: Option<u32>,
}

impl ProxyError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ProxyError {
        ProxyError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same with a Retry-After.
    pub fn retry_after(mut self, secs: u32) -> ProxyError {
        self.retry_after = Some(secs);
        self
    }

    /// The HTTP response for this error: the status, a text/plain body with
    /// the message, Retry-After when set.
    pub fn to_response(&self) -> Response<Bytes> {
        let mut body = self.message.clone();
        body.push('\n');
        let mut r = Response::new(Bytes::from(body));
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"mintgate\""),
            );
        }
        r
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ProxyError {}

fn bad(status: StatusCode, msg: impl Into<String>) -> ProxyError {
    ProxyError::new(status, msg)
}

#[cfg(test)]
mod tests;
