//! Built-in resources.

use mintgate_coap::server::{Resource, Router};
use mintgate_coap::wire::ContentFormat;

/// The papers' benchmark resource: `GET /request` answers `hello world`
/// (sent by reference from static memory: no payload copy).
pub fn hello() -> Resource {
    Resource::new("request")
        .get(|_, rb| {
            rb.content_format(ContentFormat::TEXT_PLAIN)
                .static_payload(b"hello world");
        })
        .attr("rt", "mintgate.hello")
        .attr("title", "benchmark resource")
        .attr("ct", "0")
}

/// The router a gateway starts with when nothing else is configured.
pub fn default_router() -> Router {
    let mut r = Router::new();
    // a fresh router has no paths, so this cannot collide
    let _ = r.add(hello());
    r
}
