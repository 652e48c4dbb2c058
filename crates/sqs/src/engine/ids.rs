//! Message ids and receipt handles. A receipt names the message's sequence
//! and the random nonce of the receive that took it, so a handle of another
//! receive never matches. Both are drawn when a command is made, never when
//! it is applied: every replica of it must apply the same.

use base64::Engine as _;

use crate::error::SqsError;

/// A version-4 UUID from the OS's randomness.
pub(super) fn random_uuid() -> String {
    let h = sless_runtime::hex::encode(&sless_runtime::random::bytes::<16>());
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// A receive's nonce: 96 random bits, in hex.
pub(super) fn random_nonce() -> String {
    sless_runtime::hex::encode(&sless_runtime::random::bytes::<12>())
}

pub(super) fn receipt_for(seq: u64, nonce: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{seq}:{nonce}"))
}

pub(super) fn receipt_seq(handle: &str) -> Result<u64, SqsError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(handle)
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|text| text.split_once(':').and_then(|(seq, _)| seq.parse().ok()))
        .ok_or_else(|| {
            SqsError::receipt_handle_is_invalid(format!(
                "The input receipt handle \"{handle}\" is not a valid receipt handle."
            ))
        })
}
