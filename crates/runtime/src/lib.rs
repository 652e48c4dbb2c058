//! What every sless process shares, below every other sless crate: random
//! values from the OS, stopping the parts of a process together, the one
//! retry backoff, the process-wide TLS provider, HTTP serving within
//! connection bounds, the token bucket of rate limits, and locks a panic
//! does not poison.

pub mod backoff;
pub mod civil;
pub mod hex;
pub mod http;
pub mod random;
pub mod rate;
pub mod shutdown;
pub mod sync;
pub mod tls;
