//! Certificates made at start, in memory only, for a control plane and its
//! one in-process worker on loopback (`sless dev`): the same mTLS and SPIFFE
//! identity rule as production, so no other local process can register a
//! worker and watch snapshots that carry every tenant's keys.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::config::TlsMaterial;
use super::identity::IdentityPolicy;

const TRUST_DOMAIN: &str = "sless.local";
const ENVIRONMENT: &str = "dev";
/// The server name in the control plane's certificate.
const SERVER_NAME: &str = "localhost";

#[derive(Debug, thiserror::Error)]
#[error("cannot make the control plane's certificates: {0}")]
pub struct PkiError(#[from] rcgen::Error);

/// The control plane's side and the worker's side of one run's mTLS.
pub struct LocalPki {
    pub server: TlsMaterial,
    pub identity: IdentityPolicy,
    pub worker: ClientTlsConfig,
}

impl LocalPki {
    /// A fresh CA, a server certificate and a client certificate for `worker_id`.
    pub fn new(worker_id: &str) -> Result<Self, PkiError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sless dev control plane CA");
        let ca_pem = ca_params.self_signed(&ca_key)?.pem();
        let issuer = Issuer::from_params(&ca_params, &ca_key);

        let server_key = KeyPair::generate()?;
        let server = CertificateParams::new(vec![SERVER_NAME.to_owned()])?.signed_by(&server_key, &issuer)?;

        let worker_key = KeyPair::generate()?;
        let mut worker_params = CertificateParams::new(Vec::<String>::new())?;
        let uri = format!("spiffe://{TRUST_DOMAIN}/{ENVIRONMENT}/worker/{worker_id}");
        worker_params.subject_alt_names.push(SanType::URI(uri.try_into()?));
        let worker = worker_params.signed_by(&worker_key, &issuer)?;

        Ok(Self {
            server: TlsMaterial {
                cert: server.pem().into_bytes(),
                key: server_key.serialize_pem().into_bytes(),
                client_ca: ca_pem.clone().into_bytes(),
            },
            identity: IdentityPolicy::Spiffe {
                trust_domain: TRUST_DOMAIN.into(),
                environment: ENVIRONMENT.into(),
            },
            worker: ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca_pem))
                .identity(Identity::from_pem(worker.pem(), worker_key.serialize_pem()))
                .domain_name(SERVER_NAME),
        })
    }
}
