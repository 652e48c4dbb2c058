//! SQS access keys of a tenant (seed 000, step 3), from the OS CSPRNG.

use base64::Engine;

use sless_model::queue_service::Credentials;

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// `accessKey = SQSAK{tenant}_{8 random alphanumerics}`,
/// `secretKey = base64(32 random bytes)`.
pub fn generate(tenant: &str) -> Credentials {
    // 248 = 4 * 62: rejecting bytes at or above it keeps the choice uniform.
    let mut suffix = String::with_capacity(8);
    while suffix.len() < 8 {
        for b in sless_runtime::random::bytes::<16>() {
            if b < 248 && suffix.len() < 8 {
                suffix.push(char::from(ALPHANUMERIC[usize::from(b) % ALPHANUMERIC.len()]));
            }
        }
    }
    Credentials {
        access_key: format!("SQSAK{tenant}_{suffix}"),
        secret_key: base64::engine::general_purpose::STANDARD.encode(sless_runtime::random::bytes::<32>()),
    }
}

/// The tenant's 12-digit account id, in its queue URLs and ARNs: the first
/// eight bytes of SHA-256 of its id, modulo 10^12. Derived, not stored, so
/// every replica, engine and restart agrees and it never changes. Two
/// tenants may share one (n²/2·10¹² pairs expected among n tenants: one
/// among 1.4 million); nothing is routed by it, the tenant's path or key
/// decides.
pub fn account_id(tenant: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tenant.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    format!("{:012}", u64::from_be_bytes(head) % 1_000_000_000_000)
}

/// The token a gateway presents to a tenant's engine
/// ([`crate::ENGINE_TOKEN`]): 128 random bits.
pub fn engine_token() -> String {
    sless_runtime::random::id()
}

#[cfg(test)]
mod tests {
    #[test]
    fn account_ids_are_12_digits_and_stable() {
        let acme = super::account_id("acme");
        assert_eq!(acme.len(), 12);
        assert!(acme.bytes().all(|b| b.is_ascii_digit()));
        assert_eq!(acme, super::account_id("acme"));
        assert_ne!(acme, super::account_id("acme2"));
        // Fixed by its definition: a change would move every queue URL.
        assert_eq!(super::account_id("a"), "634844962250");
    }

    use base64::Engine;

    #[test]
    fn keys_have_the_seed_format_and_differ() {
        let a = super::generate("acme");
        let b = super::generate("acme");
        let suffix = a.access_key.strip_prefix("SQSAKacme_").unwrap();
        assert_eq!(suffix.len(), 8);
        assert!(suffix.chars().all(|c| c.is_ascii_alphanumeric()));
        let secret = base64::engine::general_purpose::STANDARD.decode(&a.secret_key).unwrap();
        assert_eq!(secret.len(), 32);
        assert_ne!(a, b);
    }
}
