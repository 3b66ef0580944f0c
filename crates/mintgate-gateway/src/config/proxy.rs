//! `[proxy]`: the HTTP -> CoAP proxy's section, owned by mintgate-proxy
//! (beside the configuration it becomes) and embedded here as it is.

pub use mintgate_proxy::section::{ProxyOscore, ProxyReverse, ProxySection};
