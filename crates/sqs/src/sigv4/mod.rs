//! AWS Signature Version 4, header form: the canonical request both sides
//! compute (`canonical.rs`), verification as the gateway does it
//! (`verify.rs`) and signing as a client does it (`sign.rs`). The canonical
//! request covers the path exactly as the client sent it, with the
//! `/sqs/{tenant}` prefix, so a request cannot be replayed at another
//! tenant's path.

mod canonical;
mod sign;
mod verify;

pub use canonical::{Authorization, Request, amz_date, uri_encode};
pub use sign::{sign, sign_for, signed_json_headers};
pub use verify::{AuthError, MAX_SKEW_SECONDS, check_scope_and_time, parse_authorization, verify};

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::canonical::*;
    use super::verify::*;
    use axum::http::HeaderValue;

    use super::*;

    /// The S3 example of the AWS SigV4 documentation ("GET Object" of
    /// `/test.txt` with a range), whose signature is published: what the
    /// Nessie connector's object store client signs.
    #[test]
    fn signs_the_documented_s3_example() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "examplebucket.s3.amazonaws.com"),
            ("range", "bytes=0-9"),
            (
                "x-amz-content-sha256",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
            ("x-amz-date", "20130524T000000Z"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        let request = Request {
            method: "GET",
            path: "/test.txt",
            query: None,
            headers: &headers,
            body: b"",
        };
        let authorization = sign_for(
            &request,
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "us-east-1",
            "s3",
        )
        .unwrap();
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

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
