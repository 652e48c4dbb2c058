//! The SQS data plane: the queue engine (a tenant's backend), the two wire
//! protocols, and the SigV4-verifying gateway in front of the engines. What
//! the engine and the gateway share is here, at the crate's top: the error
//! type, the engine token's header, request ids and the clock; the gateway
//! imports nothing from `engine/`.

pub mod client;
pub mod credentials;
pub mod engine;
pub mod error;
pub mod gateway;
pub mod link;
pub mod protocol;
pub mod sigv4;

use std::time::{SystemTime, UNIX_EPOCH};

/// The header in which the gateway presents an engine's token: the
/// contract between the two.
pub const ENGINE_TOKEN: &str = "x-sless-engine-token";

/// A request's id, as SQS answers it (`x-amzn-RequestId`).
pub fn request_id() -> String {
    sless_runtime::hex::encode(&sless_runtime::random::bytes::<16>())
}

/// The clock of the engine and the gateway: milliseconds since the Unix
/// epoch (0 before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Region of queue ARNs (seed 000's `aws.region`) unless configured
/// otherwise. Signatures may be scoped to any region's name.
pub const DEFAULT_REGION: &str = "ru-msk-1";

/// Whether `name` has the shape of a region's name: 1–32 of `a-z 0-9 -`.
pub fn is_region_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// [`is_region_name`] as a command-line value parser.
pub fn region_arg(name: &str) -> Result<String, String> {
    if is_region_name(name) {
        Ok(name.to_owned())
    } else {
        Err("a region's name is 1 to 32 of a-z, 0-9 and -".into())
    }
}
