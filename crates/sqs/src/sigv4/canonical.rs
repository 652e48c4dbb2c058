//! The canonical request and the string to sign of AWS Signature Version
//! 4, header form: what both sides of a signature compute alike. The
//! canonical request covers the path exactly as the client sent it.

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use sless_runtime::hex;

pub(super) const ALGORITHM: &str = "AWS4-HMAC-SHA256";

pub(super) type HmacSha256 = Hmac<Sha256>;

/// The `Authorization` header's parts: who signs (the key), the scope
/// (date, region, service), which headers are signed, and the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    pub access_key: String,
    pub date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
}

/// `YYYYMMDDTHHMMSSZ` → seconds since the Unix epoch.
pub(super) fn parse_amz_date(value: &str) -> Option<i64> {
    let b = value.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| value.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let days = sless_runtime::civil::days_from_civil(y, u32::try_from(m).ok()?, u32::try_from(d).ok()?);
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

pub(super) fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

/// RFC 3986 unreserved characters stay; everything else is %XX.
pub fn uri_encode(input: &[u8], keep_slash: bool) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(input.len());
    for &b in input {
        if unreserved(b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
    }
    out
}

/// The path as the AWS SDKs canonicalise it: dot segments removed, then
/// every byte but unreserved characters and `/` percent-encoded.
pub(super) fn canonical_uri(path: &str) -> String {
    // The common case, `/sqs/{tenant}/…` in plain characters, is its own form.
    if path.starts_with('/')
        && path.bytes().all(|b| unreserved(b) || b == b'/')
        && !path.split('/').any(|s| s == "." || s == "..")
    {
        return path.to_owned();
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut normalized = segments.join("/");
    if !normalized.starts_with('/') {
        normalized.insert(0, '/');
    }
    if path.ends_with('/') && !normalized.ends_with('/') {
        normalized.push('/');
    }
    uri_encode(normalized.as_bytes(), true)
}

pub(super) fn canonical_query(query: Option<&str>) -> String {
    if query.is_none_or(str::is_empty) {
        return String::new();
    }
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(k, v)| (uri_encode(k.as_bytes(), false), uri_encode(v.as_bytes(), false)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

pub(super) fn canonical_header_value(headers: &HeaderMap, name: &str) -> String {
    // The common case: one value without runs of spaces to fold.
    let mut values = headers.get_all(name).iter();
    if let (Some(only), None) = (values.next(), values.next())
        && let Ok(text) = only.to_str()
        && !text.contains("  ")
        && !text.contains(|c: char| c.is_ascii_whitespace() && c != ' ')
    {
        return text.trim_matches(' ').to_owned();
    }
    headers
        .get_all(name)
        .iter()
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Signing keys kept per thread, by secret: a key changes once a day per
/// secret and scope, and deriving one takes four HMACs.
const SIGNING_KEYS_KEPT: usize = 1024;

/// A derived key and the scope (date, region, service) it was derived for.
struct SigningKey {
    scope: (String, String, String),
    key: [u8; 32],
}

thread_local! {
    static SIGNING_KEYS: std::cell::RefCell<std::collections::HashMap<String, SigningKey>> =
        std::cell::RefCell::default();
}

/// The signing key of `secret` for the scope of `auth`.
pub(super) fn signing_key(secret: &str, auth: &Authorization) -> [u8; 32] {
    SIGNING_KEYS.with(|keys| {
        let mut keys = keys.borrow_mut();
        // Looked up by the secret alone, so a hit allocates nothing.
        if let Some(kept) = keys.get(secret)
            && (kept.scope.0 == auth.date && kept.scope.1 == auth.region && kept.scope.2 == auth.service)
        {
            return kept.key;
        }
        let k_date = hmac(format!("AWS4{secret}").as_bytes(), auth.date.as_bytes());
        let k_region = hmac(&k_date, auth.region.as_bytes());
        let k_service = hmac(&k_region, auth.service.as_bytes());
        let key = hmac(&k_service, b"aws4_request");
        if keys.len() >= SIGNING_KEYS_KEPT && !keys.contains_key(secret) {
            keys.clear();
        }
        let scope = (auth.date.clone(), auth.region.clone(), auth.service.clone());
        keys.insert(secret.to_owned(), SigningKey { scope, key });
        key
    })
}

/// A request as received.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
}

/// The hex SHA-256 of a body: what the canonical request always names. A
/// header claiming another hash would let a captured signature carry any
/// body. (SQS, unlike S3, has no unsigned payloads: a client that signed
/// `UNSIGNED-PAYLOAD` gets a signature mismatch.)
pub(super) fn payload_hash(body: &[u8]) -> String {
    hex::encode(&Sha256::digest(body))
}

/// The signing key and string to sign of `request`, as `auth` describes it,
/// with the body's `payload_hash`.
pub(super) fn signing_input(
    request: &Request<'_>,
    auth: &Authorization,
    secret: &str,
    amz_date: &str,
    payload_hash: &str,
) -> ([u8; 32], String) {
    let mut canonical_request = String::with_capacity(512);
    for part in [
        request.method,
        &canonical_uri(request.path),
        &canonical_query(request.query),
    ] {
        canonical_request.push_str(part);
        canonical_request.push('\n');
    }
    for name in &auth.signed_headers {
        canonical_request.push_str(name);
        canonical_request.push(':');
        canonical_request.push_str(&canonical_header_value(request.headers, name));
        canonical_request.push('\n');
    }
    canonical_request.push('\n');
    canonical_request.push_str(&auth.signed_headers.join(";"));
    canonical_request.push('\n');
    canonical_request.push_str(payload_hash);
    let scope = format!("{}/{}/{}/aws4_request", auth.date, auth.region, auth.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex::encode(&Sha256::digest(canonical_request.as_bytes()))
    );
    (signing_key(secret, auth), string_to_sign)
}

/// `SystemTime` → `YYYYMMDDTHHMMSSZ`.
pub fn amz_date(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replace(['-', ':'], "")
}

pub(super) fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}
