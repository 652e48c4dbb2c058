//! Verifying a request's signature, as the gateway does: the
//! `Authorization` header parsed within bounds, the scope and the time
//! checked before the body is read, then the signature over the body.

use axum::http::HeaderMap;
use hmac::Mac;

use super::canonical::{
    ALGORITHM, Authorization, HmacSha256, Request, decode_hex, parse_amz_date, payload_hash, signing_input,
};

/// Accepted clock skew between the client and the gateway.
pub const MAX_SKEW_SECONDS: i64 = 15 * 60;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("Request is missing Authentication Token")]
    Missing,
    #[error("Authorization header is malformed: {0}")]
    Malformed(&'static str),
    #[error("Signature expired or not yet valid: the request time is more than 15 minutes from the server time")]
    Expired,
    #[error("The request signature we calculated does not match the signature you provided.")]
    Mismatch,
    #[error("Credential should be scoped to a valid region, not '{0}'.")]
    WrongRegion(String),
    #[error("Credential should be scoped to correct service: 'sqs'.")]
    WrongService,
    #[error("The provided 'x-amz-content-sha256' header does not match what was computed.")]
    ContentSha256Mismatch,
}

/// The only service a signature may be scoped to.
const SERVICE: &str = "sqs";
/// Longest `Authorization` header parsed; real ones are a few hundred bytes.
const MAX_AUTHORIZATION: usize = 4096;
/// Most signed headers.
const MAX_SIGNED_HEADERS: usize = 64;

pub fn parse_authorization(headers: &HeaderMap) -> Result<Authorization, AuthError> {
    let value = headers
        .get("authorization")
        .ok_or(AuthError::Missing)?
        .to_str()
        .map_err(|_| AuthError::Malformed("not ASCII"))?;
    if value.len() > MAX_AUTHORIZATION {
        return Err(AuthError::Malformed("the header is too long"));
    }
    let rest = value
        .strip_prefix(ALGORITHM)
        .ok_or(AuthError::Malformed("only AWS4-HMAC-SHA256 is supported"))?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        match part.trim().split_once('=') {
            Some(("Credential", v)) => credential = Some(v),
            Some(("SignedHeaders", v)) => signed = Some(v),
            Some(("Signature", v)) => signature = Some(v),
            _ => {}
        }
    }
    let credential = credential.ok_or(AuthError::Malformed("no Credential"))?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [access_key, date, region, service, "aws4_request"] = scope.as_slice() else {
        return Err(AuthError::Malformed(
            "Credential must be KEY/DATE/REGION/SERVICE/aws4_request",
        ));
    };
    let signed_headers: Vec<String> = signed
        .ok_or(AuthError::Malformed("no SignedHeaders"))?
        .split(';')
        .map(str::to_owned)
        .collect();
    if signed_headers.len() > MAX_SIGNED_HEADERS {
        return Err(AuthError::Malformed("too many signed headers"));
    }
    if !signed_headers.iter().any(|h| h == "host") {
        return Err(AuthError::Malformed("the host header must be signed"));
    }
    Ok(Authorization {
        access_key: (*access_key).to_owned(),
        date: (*date).to_owned(),
        region: (*region).to_owned(),
        service: (*service).to_owned(),
        signed_headers,
        signature: signature.ok_or(AuthError::Malformed("no Signature"))?.to_owned(),
    })
}

/// The checks of `auth` that need neither the body nor the secret: the
/// scope (SQS, a region's name) and the request time within
/// [`MAX_SKEW_SECONDS`] of `now` (Unix seconds). The gateway runs them
/// before it reads a body. Any region is accepted: the signing key is
/// derived from it, so a signature still proves the secret and binds the
/// region it names, and clients keep their SDK's default region.
pub fn check_scope_and_time(headers: &HeaderMap, auth: &Authorization, now: i64) -> Result<(), AuthError> {
    if auth.service != SERVICE {
        return Err(AuthError::WrongService);
    }
    let region_name = |r: &str| {
        (1..=32).contains(&r.len())
            && r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if !region_name(&auth.region) {
        return Err(AuthError::WrongRegion(auth.region.chars().take(32).collect()));
    }
    request_time(headers, auth, now).map(drop)
}

/// The request's `X-Amz-Date`, checked against the credential's day and `now`.
pub(super) fn request_time<'h>(headers: &'h HeaderMap, auth: &Authorization, now: i64) -> Result<&'h str, AuthError> {
    let amz_date = headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or(AuthError::Malformed("no X-Amz-Date header"))?;
    let signed_at = parse_amz_date(amz_date).ok_or(AuthError::Malformed("X-Amz-Date is not YYYYMMDDTHHMMSSZ"))?;
    if !amz_date.starts_with(&auth.date) {
        return Err(AuthError::Malformed("the credential date is not the X-Amz-Date day"));
    }
    if (now - signed_at).abs() > MAX_SKEW_SECONDS {
        return Err(AuthError::Expired);
    }
    Ok(amz_date)
}

/// Verifies `auth` over `request` with `secret`, at time `now` (Unix
/// seconds): [`check_scope_and_time`], the declared payload hash and the
/// signature.
pub fn verify(request: &Request<'_>, auth: &Authorization, secret: &str, now: i64) -> Result<(), AuthError> {
    check_scope_and_time(request.headers, auth, now)?;
    // The body is hashed once: for this check and for the signature.
    let payload_hash = payload_hash(request.body);
    // A declared payload hash must be the body's (as AWS checks it).
    if let Some(declared) = request.headers.get("x-amz-content-sha256")
        && declared.as_bytes() != b"UNSIGNED-PAYLOAD"
        && !declared.to_str().is_ok_and(|d| d.eq_ignore_ascii_case(&payload_hash))
    {
        return Err(AuthError::ContentSha256Mismatch);
    }
    verify_signature(request, auth, secret, &payload_hash, now)
}

/// The time and signature checks of [`verify`], whatever the scope.
pub(super) fn verify_signature(
    request: &Request<'_>,
    auth: &Authorization,
    secret: &str,
    payload_hash: &str,
    now: i64,
) -> Result<(), AuthError> {
    let amz_date = request_time(request.headers, auth, now)?;
    let (k_signing, string_to_sign) = signing_input(request, auth, secret, amz_date, payload_hash);
    let claimed = decode_hex(&auth.signature).ok_or(AuthError::Mismatch)?;
    let mut mac = HmacSha256::new_from_slice(&k_signing).expect("HMAC takes any key length");
    mac.update(string_to_sign.as_bytes());
    // Constant-time comparison.
    mac.verify_slice(&claimed).map_err(|_| AuthError::Mismatch)
}
