//! SQS access keys of a tenant (seed 000, step 3), from the OS CSPRNG.

use base64::Engine;
use rand::distr::Alphanumeric;
use rand::{Rng, TryRngCore};

use crate::model::queue_service::Credentials;

/// `accessKey = SQSAK{tenant}_{8 random alphanumerics}`,
/// `secretKey = base64(32 random bytes)`.
pub fn generate(tenant: &str) -> Credentials {
    let mut rng = rand::rngs::OsRng.unwrap_err();
    let suffix: String = (&mut rng).sample_iter(Alphanumeric).take(8).map(char::from).collect();
    let mut secret = [0u8; 32];
    rng.fill(&mut secret);
    Credentials {
        access_key: format!("SQSAK{tenant}_{suffix}"),
        secret_key: base64::engine::general_purpose::STANDARD.encode(secret),
    }
}

#[cfg(test)]
mod tests {
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
