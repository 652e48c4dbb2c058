//! The SigV4 header parser and verifier on arbitrary headers and bodies:
//! never a panic, and nothing verifies without the secret.
#![no_main]

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use sless_sqs::sigv4;

fuzz_target!(|data: &[u8]| {
    // Lines "name: value" up to a blank line, then the body.
    let text = String::from_utf8_lossy(data);
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut headers = HeaderMap::new();
    for line in head.lines() {
        if let Some((name, value)) = line.split_once(':')
            && let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            )
        {
            headers.append(name, value);
        }
    }
    if let Ok(auth) = sigv4::parse_authorization(&headers) {
        let request = sigv4::Request {
            method: "POST",
            path: "/sqs/acme",
            query: head.lines().next(),
            headers: &headers,
            body: body.as_bytes(),
        };
        assert!(
            sigv4::verify(&request, &auth, "the-secret-the-fuzzer-does-not-know", 1_700_000_000).is_err()
        );
    }
});
