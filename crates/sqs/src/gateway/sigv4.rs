//! AWS Signature Version 4, header form, as the gateway verifies it. The
//! canonical request covers the path exactly as the client sent it, with
//! the `/sqs/{tenant}` prefix, so a request cannot be replayed at another
//! tenant's path.
//!
//! Over 400 lines only with its unit tests (AWS test vectors and attacks).

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use sless_runtime::hex;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// Accepted clock skew between the client and the gateway.
pub const MAX_SKEW_SECONDS: i64 = 15 * 60;

type HmacSha256 = Hmac<Sha256>;

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

/// The parsed `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    pub access_key: String,
    pub date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
}

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

/// `YYYYMMDDTHHMMSSZ` → seconds since the Unix epoch.
fn parse_amz_date(value: &str) -> Option<i64> {
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
    // Days from civil date (proleptic Gregorian), after H. Hinnant.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

/// RFC 3986 unreserved characters stay; everything else is %XX.
fn uri_encode(input: &[u8], keep_slash: bool) -> String {
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
fn canonical_uri(path: &str) -> String {
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

fn canonical_query(query: Option<&str>) -> String {
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

fn canonical_header_value(headers: &HeaderMap, name: &str) -> String {
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

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
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
fn signing_key(secret: &str, auth: &Authorization) -> [u8; 32] {
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
fn payload_hash(body: &[u8]) -> String {
    hex::encode(&Sha256::digest(body))
}

/// The signing key and string to sign of `request`, as `auth` describes it,
/// with the body's `payload_hash`.
fn signing_input(
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
fn request_time<'h>(headers: &'h HeaderMap, auth: &Authorization, now: i64) -> Result<&'h str, AuthError> {
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
fn verify_signature(
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

/// Signs `request` as a client does: returns the `Authorization` header
/// value for `access_key`/`secret`, signing every header of `request` (which
/// must include `host` and `x-amz-date`). Used by load tools and tests.
pub fn sign(request: &Request<'_>, access_key: &str, secret: &str, region: &str) -> Option<String> {
    let amz_date = request.headers.get("x-amz-date")?.to_str().ok()?;
    let mut signed_headers: Vec<String> = request.headers.keys().map(|k| k.as_str().to_owned()).collect();
    signed_headers.sort();
    signed_headers.dedup();
    let mut auth = Authorization {
        access_key: access_key.to_owned(),
        date: amz_date.get(..8)?.to_owned(),
        region: region.to_owned(),
        service: "sqs".to_owned(),
        signed_headers,
        signature: String::new(),
    };
    let (key, string_to_sign) = signing_input(request, &auth, secret, amz_date, &payload_hash(request.body));
    auth.signature = hex::encode(&hmac(&key, string_to_sign.as_bytes()));
    Some(format!(
        "{ALGORITHM} Credential={}/{}/{}/{}/aws4_request, SignedHeaders={}, Signature={}",
        auth.access_key,
        auth.date,
        auth.region,
        auth.service,
        auth.signed_headers.join(";"),
        auth.signature
    ))
}

/// The headers of an AWS JSON 1.0 request of `action` to `url` with `body`,
/// signed now as an SDK signs them (for load tools and tests).
pub fn signed_json_headers(
    url: &str,
    action: &str,
    body: &[u8],
    access_key: &str,
    secret: &str,
    region: &str,
) -> Option<HeaderMap> {
    use axum::http::HeaderValue;
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("host", host.to_owned()),
        ("content-type", "application/x-amz-json-1.0".to_owned()),
        ("x-amz-target", format!("AmazonSQS.{action}")),
        ("x-amz-date", amz_date(std::time::SystemTime::now())),
    ] {
        headers.insert(name, HeaderValue::from_str(&value).ok()?);
    }
    let request = Request {
        method: "POST",
        path: &path,
        query: None,
        headers: &headers,
        body,
    };
    let authorization = sign(&request, access_key, secret, region)?;
    // The HTTP client sets Host itself.
    headers.remove("host");
    headers.insert("authorization", HeaderValue::from_str(&authorization).ok()?);
    Some(headers)
}

/// `SystemTime` → `YYYYMMDDTHHMMSSZ`.
pub fn amz_date(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replace(['-', ':'], "")
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    /// The example of the AWS SigV4 documentation ("GET /?Action=ListUsers"
    /// against IAM), whose signature is published.
    #[test]
    fn matches_the_documented_example() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("iam.amazonaws.com"));
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
        );
        headers.insert("x-amz-date", HeaderValue::from_static("20150830T123600Z"));
        headers.insert(
            "authorization",
            HeaderValue::from_static(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
                 SignedHeaders=content-type;host;x-amz-date, \
                 Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7",
            ),
        );
        let request = Request {
            method: "GET",
            path: "/",
            query: Some("Action=ListUsers&Version=2010-05-08"),
            headers: &headers,
            body: b"",
        };
        let auth = parse_authorization(&headers).unwrap();
        assert_eq!(auth.access_key, "AKIDEXAMPLE");
        let now = parse_amz_date("20150830T123600Z").unwrap();
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        // The published example is scoped to IAM: the gateway refuses that
        // scope, and its signature checks hold for it.
        assert_eq!(verify(&request, &auth, secret, now), Err(AuthError::WrongService));
        let empty = payload_hash(b"");
        verify_signature(&request, &auth, secret, &empty, now).unwrap();
        assert_eq!(
            verify_signature(&request, &auth, "wrong", &empty, now),
            Err(AuthError::Mismatch)
        );
        assert_eq!(
            verify_signature(&request, &auth, secret, &empty, now + 901),
            Err(AuthError::Expired)
        );
        assert_eq!(
            verify_signature(&request, &auth, secret, &empty, now - 901),
            Err(AuthError::Expired)
        );
        let other_path = Request {
            path: "/sqs/other",
            ..request
        };
        assert_eq!(
            verify_signature(&other_path, &auth, secret, &empty, now),
            Err(AuthError::Mismatch)
        );
    }

    #[test]
    fn sign_then_verify_round_trips() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("127.0.0.1:9324"));
        headers.insert("x-amz-target", HeaderValue::from_static("AmazonSQS.ListQueues"));
        let now = std::time::SystemTime::now();
        headers.insert("x-amz-date", HeaderValue::from_str(&amz_date(now)).unwrap());
        let unsigned = Request {
            method: "POST",
            path: "/sqs/acme",
            query: None,
            headers: &headers,
            body: b"{}",
        };
        let value = sign(&unsigned, "AK", "SK", "ru-msk-1").unwrap();
        let plain = headers.clone();
        headers.insert("authorization", HeaderValue::from_str(&value).unwrap());
        let request = Request {
            method: "POST",
            path: "/sqs/acme",
            query: None,
            headers: &headers,
            body: b"{}",
        };
        let auth = parse_authorization(&headers).unwrap();
        let secs = i64::try_from(now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).unwrap();
        verify(&request, &auth, "SK", secs).unwrap();
        // Any region's name is accepted; the signature binds the one named.
        for region in ["us-east-1", "eu-west-1"] {
            let unsigned = Request {
                headers: &plain,
                ..request
            };
            let value = sign(&unsigned, "AK", "SK", region).unwrap();
            let mut headers = plain.clone();
            headers.insert("authorization", HeaderValue::from_str(&value).unwrap());
            let auth = parse_authorization(&headers).unwrap();
            let request = Request {
                headers: &headers,
                ..request
            };
            verify(&request, &auth, "SK", secs).unwrap();
            let moved = Authorization {
                region: "ap-south-1".into(),
                ..auth.clone()
            };
            assert_eq!(verify(&request, &moved, "SK", secs), Err(AuthError::Mismatch));
            for bad in ["", "US-EAST-1", "eu_west", "a/b", &"x".repeat(33)] {
                let bad = Authorization {
                    region: bad.into(),
                    ..auth.clone()
                };
                assert!(
                    matches!(verify(&request, &bad, "SK", secs), Err(AuthError::WrongRegion(_))),
                    "{bad:?}"
                );
            }
        }
        // The key rotated: the signing key kept for the old secret is not
        // the new secret's, on this thread or another.
        assert_eq!(verify(&request, &auth, "SK-rotated", secs), Err(AuthError::Mismatch));
        verify(&request, &auth, "SK", secs).unwrap();
    }

    /// A captured request re-sent with another body: the signature covers
    /// the body's own hash, whatever `x-amz-content-sha256` claims.
    #[test]
    fn the_signature_binds_the_body() {
        let now = std::time::SystemTime::now();
        let secs = i64::try_from(now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).unwrap();
        let body = br#"{"QueueUrl":"q","MessageBody":"pay 1"}"#;
        let mut headers =
            signed_json_headers("http://h/sqs/acme", "SendMessage", body, "AK", "SK", "ru-msk-1").unwrap();
        headers.insert("host", HeaderValue::from_static("h"));
        let auth = parse_authorization(&headers).unwrap();
        let at = |headers: &HeaderMap, body: &[u8]| {
            let request = Request {
                method: "POST",
                path: "/sqs/acme",
                query: None,
                headers,
                body,
            };
            verify(&request, &auth, "SK", secs)
        };
        at(&headers, body).unwrap();
        let forged = br#"{"QueueUrl":"q","MessageBody":"pay 1000"}"#;
        assert_eq!(at(&headers, forged), Err(AuthError::Mismatch));
        // An unsigned header naming the original body's hash changes nothing…
        let original = payload_hash(body);
        headers.insert("x-amz-content-sha256", HeaderValue::from_str(&original).unwrap());
        assert_eq!(at(&headers, forged), Err(AuthError::ContentSha256Mismatch));
        // …nor does UNSIGNED-PAYLOAD.
        headers.insert("x-amz-content-sha256", HeaderValue::from_static("UNSIGNED-PAYLOAD"));
        assert_eq!(at(&headers, forged), Err(AuthError::Mismatch));
        at(&headers, body).unwrap();
        // A correct declared hash is accepted.
        headers.insert("x-amz-content-sha256", HeaderValue::from_str(&original).unwrap());
        at(&headers, body).unwrap();
    }

    #[test]
    fn dates_and_paths() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(parse_amz_date("2015-08-30T12:36:00Z"), None);
        assert_eq!(canonical_uri("/sqs/a/./b/../c"), "/sqs/a/c");
        assert_eq!(canonical_uri("/sqs/a b/"), "/sqs/a%20b/");
        assert_eq!(canonical_query(Some("b=2&a=1&a=0")), "a=0&a=1&b=2");
    }
}
