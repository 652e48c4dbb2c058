//! A connector's `tls` object (upstream's `TLSConfig`), shared by the Kafka
//! client (as librdkafka file settings) and the HTTP clients (Trino): files
//! are read only from the egress policy's TLS directory, where the operator
//! mounts the Secrets a `…SecretRef` names.

use serde::Deserialize;
use sless_model::dataflow::SecretRef;

use crate::ConnectorError;
use crate::component::inline;
use crate::egress::EgressPolicy;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub insecure_skip_verify: bool,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub ca_file: Option<String>,
    pub cert_secret_ref: Option<SecretRef>,
    pub key_secret_ref: Option<SecretRef>,
    pub ca_secret_ref: Option<SecretRef>,
}

/// Longest TLS file read: a CA bundle is tens of kilobytes.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// What an HTTPS client trusts and presents beside the public roots.
#[derive(Default)]
pub struct HttpTls {
    pub roots: Vec<reqwest::Certificate>,
    pub identity: Option<reqwest::Identity>,
    /// No certificate check (`insecureSkipVerify` without a CA file).
    pub insecure: bool,
}

impl TlsConfig {
    /// The files of this config for an HTTPS client.
    pub fn http(&self, egress: &EgressPolicy) -> Result<HttpTls, ConnectorError> {
        let read = |file: &Option<String>, secret: &Option<SecretRef>, field: &str| -> Result<_, ConnectorError> {
            if file.is_none() && secret.is_none() {
                return Ok(None);
            }
            let path = egress.tls_file(inline(file.as_deref(), secret, field)?, field)?;
            let unreadable = || ConnectorError::Config(format!("{field}: the file cannot be read"));
            if std::fs::metadata(&path).map_err(|_| unreadable())?.len() > MAX_PEM_BYTES {
                return Err(ConnectorError::Config(format!(
                    "{field}: the file is longer than 1 MiB"
                )));
            }
            std::fs::read(&path).map(Some).map_err(|_| unreadable())
        };
        let mut tls = HttpTls::default();
        if let Some(pem) = read(&self.ca_file, &self.ca_secret_ref, "tls.caFile")? {
            tls.roots = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|_| ConnectorError::Config("tls.caFile holds no PEM certificate".into()))?;
        }
        let cert = read(&self.cert_file, &self.cert_secret_ref, "tls.certFile")?;
        let key = read(&self.key_file, &self.key_secret_ref, "tls.keyFile")?;
        match (cert, key) {
            (Some(mut cert), Some(key)) => {
                cert.extend_from_slice(&key);
                tls.identity = Some(reqwest::Identity::from_pem(&cert).map_err(|_| {
                    ConnectorError::Config("tls.certFile and tls.keyFile are not a PEM certificate and key".into())
                })?);
            }
            (None, None) => {}
            _ => {
                return Err(ConnectorError::Config(
                    "tls.certFile and tls.keyFile go together".into(),
                ));
            }
        }
        // A CA file wins over insecureSkipVerify, as upstream has it.
        tls.insecure = self.insecure_skip_verify && tls.roots.is_empty();
        Ok(tls)
    }
}
