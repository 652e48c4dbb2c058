//! Random values for ids, tokens and keys, always from the OS CSPRNG.

use rand::{RngCore, TryRngCore};

pub fn bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rand::rngs::OsRng.unwrap_err().fill_bytes(&mut out);
    out
}

/// A fresh 128-bit id, as hex.
pub fn id() -> String {
    crate::hex::encode(&bytes::<16>())
}
