//! Built-in resources.

use std::sync::Arc;

use mintgate_coap::server::block::{etag, respond_block2};
use mintgate_coap::server::{Resource, Router};
use mintgate_coap::wire::{Code, ContentFormat};
use parking_lot::Mutex;

use crate::config::HandlerCost;

/// The papers' benchmark resource: `GET /request` answers `hello world`
/// (sent by reference from static memory: no payload copy).
pub fn hello() -> Resource {
    hello_with_cost(HandlerCost::None)
}

/// `/request` with a simulated cost before it answers: a blocking wait (a
/// sensor read) or CPU burnt, for the VTA experiments.
pub fn hello_with_cost(cost: HandlerCost) -> Resource {
    Resource::new("request")
        .get(move |_, rb| {
            match cost {
                HandlerCost::None => {}
                HandlerCost::Block(d) => std::thread::sleep(d),
                HandlerCost::Spin(d) => {
                    let end = std::time::Instant::now() + d;
                    while std::time::Instant::now() < end {
                        std::hint::spin_loop();
                    }
                }
            }
            rb.content_format(ContentFormat::TEXT_PLAIN)
                .static_payload(b"hello world");
        })
        .attr("rt", "mintgate.hello")
        .attr("title", "benchmark resource")
        .attr("ct", "0")
}

/// A diagnostic resource for trying every method: `PUT` stores the payload
/// (2.04), `GET` returns what was stored (2.05, with its ETag; 2.03 to a GET
/// that holds it), `POST` answers with the payload it was sent (2.04),
/// `DELETE` clears the store (2.02). A PUT may be conditional (If-Match with
/// the ETag of a GET, or If-None-Match: 4.12 when they do not hold). Payloads may come in blocks (Block1,
/// up to the gateway's `coap.block1_max_body`), and answers larger than one
/// 1024-byte message go block-wise (Block2).
pub fn echo() -> Resource {
    echo_with_block(1024)
}

/// [`echo`] answering in blocks of at most `max_block` bytes.
pub fn echo_with_block(max_block: usize) -> Resource {
    let stored: Arc<Mutex<Vec<u8>>> = Arc::default();
    let (g, p, t) = (stored.clone(), stored.clone(), stored.clone());
    Resource::new("echo")
        .get(move |req, rb| {
            let v = g.lock();
            respond_block2(req, rb, &v, max_block);
        })
        .put(move |req, rb| {
            let mut v = p.lock();
            v.clear();
            v.extend_from_slice(req.payload());
            rb.set_code(Code::CHANGED);
        })
        .post(move |req, rb| {
            rb.set_code(Code::CHANGED);
            respond_block2(req, rb, req.payload(), max_block);
        })
        .delete(move |_, rb| {
            stored.lock().clear();
            rb.set_code(Code::DELETED);
        })
        // the ETag its GET sends, for If-Match
        .etag(move || Some(etag(&t.lock()).to_vec()))
        .attr("rt", "mintgate.echo")
        .attr("title", "stores PUT, returns it on GET, echoes POST")
}

/// The router a gateway starts with when nothing else is configured:
/// `/request` and `/echo`.
pub fn default_router() -> Router {
    router_for(&crate::Config::default())
}

/// The built-in resources as `cfg` sets them up.
pub fn router_for(cfg: &crate::Config) -> Router {
    let mut r = Router::new();
    // a fresh router has no paths, so these cannot collide
    let _ = r.add(hello_with_cost(cfg.resources.request_cost));
    let _ = r.add(echo_with_block(cfg.coap.max_payload.clamp(16, 1024)));
    r
}
