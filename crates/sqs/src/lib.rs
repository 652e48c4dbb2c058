//! The SQS data plane: the queue engine (a tenant's backend), the two wire
//! protocols, and the SigV4-verifying gateway in front of the engines.

pub mod credentials;
pub mod engine;
pub mod gateway;
pub mod protocol;

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
