//! Signing a request as an SDK does, for sless's own clients (the REST
//! API's queue routes, the dataflow SQS connector), load tools and tests.

use axum::http::HeaderMap;
use sless_runtime::hex;

use super::canonical::{ALGORITHM, Authorization, Request, amz_date, hmac, payload_hash, signing_input};

/// Signs `request` as a client does: returns the `Authorization` header
/// value for `access_key`/`secret`, signing every header of `request` (which
/// must include `host` and `x-amz-date`). Used by load tools and tests.
pub fn sign(request: &Request<'_>, access_key: &str, secret: &str, region: &str) -> Option<String> {
    sign_for(request, access_key, secret, region, "sqs")
}

/// [`sign`] for AWS service `service` (`"s3"` for the Nessie connector's
/// object store). The request's `path` is as the service names the
/// resource, unencoded: the canonical form encodes it once, as S3 wants.
pub fn sign_for(request: &Request<'_>, access_key: &str, secret: &str, region: &str, service: &str) -> Option<String> {
    let amz_date = request.headers.get("x-amz-date")?.to_str().ok()?;
    let mut signed_headers: Vec<String> = request.headers.keys().map(|k| k.as_str().to_owned()).collect();
    signed_headers.sort();
    signed_headers.dedup();
    let mut auth = Authorization {
        access_key: access_key.to_owned(),
        date: amz_date.get(..8)?.to_owned(),
        region: region.to_owned(),
        service: service.to_owned(),
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
