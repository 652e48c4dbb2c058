//! Worker identity under mTLS: the SPIFFE URI SAN
//! `spiffe://TRUST_DOMAIN/ENVIRONMENT/worker/WORKER_ID` of the client
//! certificate, which must name the `worker_id` of the request.

use x509_parser::extensions::GeneralName;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityPolicy {
    /// Plaintext on loopback: the caller is trusted as the id it states.
    Loopback,
    Spiffe {
        trust_domain: String,
        environment: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("a client certificate is required")]
    NoCertificate,
    #[error("the client certificate has no worker SPIFFE id of this trust domain and environment")]
    NoWorkerId,
    #[error("the client certificate is not the identity of this worker_id")]
    Mismatch,
}

impl IdentityPolicy {
    /// Checks that the leaf certificate `leaf_der` (if any) is `worker_id`'s.
    pub fn check(&self, leaf_der: Option<&[u8]>, worker_id: &str) -> Result<(), IdentityError> {
        let Self::Spiffe {
            trust_domain,
            environment,
        } = self
        else {
            return Ok(());
        };
        let der = leaf_der.ok_or(IdentityError::NoCertificate)?;
        let prefix = format!("spiffe://{trust_domain}/{environment}/worker/");
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| IdentityError::NoWorkerId)?;
        let san = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .ok_or(IdentityError::NoWorkerId)?;
        let ids: Vec<&str> = san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) => uri.strip_prefix(prefix.as_str()),
                _ => None,
            })
            .collect();
        match ids.as_slice() {
            [] => Err(IdentityError::NoWorkerId),
            [id] if *id == worker_id => Ok(()),
            _ => Err(IdentityError::Mismatch),
        }
    }
}
