//! Listener configuration of the control plane (seed 002 §6), validated at
//! start: plaintext only on loopback, mTLS anywhere else.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::identity::IdentityPolicy;
use super::worker::ServiceConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Disabled,
    Mtls,
}

/// Command-line flags of the control plane, shared by `sless dev` and `sless serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControlPlaneArgs {
    /// Address of the worker gRPC control plane.
    #[arg(
        id = "control_plane_listen",
        value_name = "ADDR",
        long = "control-plane-listen",
        env = "SLESS_CONTROL_PLANE_LISTEN",
        default_value = "127.0.0.1:8443"
    )]
    pub listen: SocketAddr,
    /// Interval at which workers send heartbeats.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub heartbeat_interval: Duration,
    /// Session lifetime without renewal; at least 3 heartbeat intervals.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "35s")]
    pub session_ttl: Duration,
    /// Age after which a runtime report is no longer trusted; at least one heartbeat interval.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub max_stale_age: Duration,
    /// Largest gRPC message in either direction.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Most proxy counters in one runtime report.
    #[arg(long, default_value_t = 100_000)]
    pub max_runtime_counters: usize,
    /// `disabled` (loopback only) or `mtls`.
    #[arg(long = "control-plane-tls", value_enum, default_value = "disabled")]
    pub tls: TlsMode,
    /// PEM server certificate chain (mtls).
    #[arg(long = "control-plane-cert")]
    pub server_cert: Option<PathBuf>,
    /// PEM server private key (mtls).
    #[arg(long = "control-plane-key")]
    pub server_key: Option<PathBuf>,
    /// PEM CA bundle that signs worker certificates (mtls).
    #[arg(long = "control-plane-client-ca")]
    pub client_ca: Option<PathBuf>,
    /// SPIFFE trust domain of worker ids (mtls).
    #[arg(long)]
    pub spiffe_trust_domain: Option<String>,
    /// SPIFFE environment segment of worker ids (mtls).
    #[arg(long)]
    pub spiffe_environment: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("plaintext control plane must listen on loopback, not {0}; use --control-plane-tls mtls")]
    PlaintextOffLoopback(SocketAddr),
    #[error("--session-ttl must be at least 3 × --heartbeat-interval")]
    SessionTtlTooShort,
    #[error("--max-stale-age must be at least --heartbeat-interval")]
    StaleAgeTooShort,
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    #[error("mtls needs {0}")]
    Missing(&'static str),
    #[error("{0} must be a non-empty path segment without '/'")]
    BadSegment(&'static str),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
}

/// PEM material for an mTLS listener.
#[derive(Debug, Clone)]
pub struct TlsMaterial {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Vec<u8>,
}

/// A validated control-plane configuration.
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    pub listen: SocketAddr,
    pub max_message_bytes: usize,
    pub service: ServiceConfig,
    pub identity: IdentityPolicy,
    pub tls: Option<TlsMaterial>,
}

fn segment(value: Option<&String>, flag: &'static str) -> Result<String, ConfigError> {
    let v = value.ok_or(ConfigError::Missing(flag))?;
    if v.is_empty() || v.contains('/') {
        return Err(ConfigError::BadSegment(flag));
    }
    Ok(v.clone())
}

fn read(path: Option<&PathBuf>, flag: &'static str) -> Result<Vec<u8>, ConfigError> {
    let path = path.ok_or(ConfigError::Missing(flag))?;
    std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })
}

impl ControlPlaneArgs {
    pub fn validate(&self) -> Result<ControlPlaneConfig, ConfigError> {
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::NotPositive("--heartbeat-interval"));
        }
        if self.max_message_bytes == 0 {
            return Err(ConfigError::NotPositive("--max-message-bytes"));
        }
        if self.max_runtime_counters == 0 {
            return Err(ConfigError::NotPositive("--max-runtime-counters"));
        }
        if self.session_ttl < self.heartbeat_interval * 3 {
            return Err(ConfigError::SessionTtlTooShort);
        }
        if self.max_stale_age < self.heartbeat_interval {
            return Err(ConfigError::StaleAgeTooShort);
        }
        let (identity, tls) = match self.tls {
            TlsMode::Disabled => {
                if !self.listen.ip().is_loopback() {
                    return Err(ConfigError::PlaintextOffLoopback(self.listen));
                }
                (IdentityPolicy::Loopback, None)
            }
            TlsMode::Mtls => (
                IdentityPolicy::Spiffe {
                    trust_domain: segment(self.spiffe_trust_domain.as_ref(), "--spiffe-trust-domain")?,
                    environment: segment(self.spiffe_environment.as_ref(), "--spiffe-environment")?,
                },
                Some(TlsMaterial {
                    cert: read(self.server_cert.as_ref(), "--control-plane-cert")?,
                    key: read(self.server_key.as_ref(), "--control-plane-key")?,
                    client_ca: read(self.client_ca.as_ref(), "--control-plane-client-ca")?,
                }),
            ),
        };
        Ok(ControlPlaneConfig {
            listen: self.listen,
            max_message_bytes: self.max_message_bytes,
            service: ServiceConfig {
                heartbeat_interval: self.heartbeat_interval,
                session_ttl: self.session_ttl,
                max_stale_age: self.max_stale_age,
                max_runtime_counters: self.max_runtime_counters,
                ..ServiceConfig::default()
            },
            identity,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cp: ControlPlaneArgs,
    }

    fn args(extra: &[&str]) -> ControlPlaneArgs {
        Cli::parse_from(std::iter::once("t").chain(extra.iter().copied())).cp
    }

    #[test]
    fn defaults_are_valid_loopback_plaintext() {
        let config = args(&[]).validate().unwrap();
        assert_eq!(config.identity, IdentityPolicy::Loopback);
        assert!(config.tls.is_none());
        assert_eq!(config.service.session_ttl, Duration::from_secs(35));
    }

    #[test]
    fn rules() {
        let err = |extra: &[&str]| args(extra).validate().unwrap_err().to_string();
        assert!(err(&["--control-plane-listen", "0.0.0.0:8443"]).contains("loopback"));
        assert!(err(&["--session-ttl", "29s"]).contains("3 ×"));
        assert!(err(&["--max-stale-age", "5s"]).contains("--heartbeat-interval"));
        assert!(err(&["--max-message-bytes", "0"]).contains("positive"));
        assert!(err(&["--control-plane-tls", "mtls"]).contains("--spiffe-trust-domain"));
        assert!(
            err(&[
                "--control-plane-tls",
                "mtls",
                "--spiffe-trust-domain",
                "a/b",
                "--spiffe-environment",
                "p"
            ])
            .contains("segment")
        );
        assert!(
            err(&[
                "--control-plane-tls",
                "mtls",
                "--spiffe-trust-domain",
                "sless.test",
                "--spiffe-environment",
                "p",
                "--control-plane-cert",
                "/nonexistent/cert.pem"
            ])
            .contains("cannot read")
        );
    }
}
