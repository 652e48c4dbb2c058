//! The HashiCorp go-plugin side of the provider: the magic cookie check,
//! AutoMTLS (`PLUGIN_CLIENT_CERT`), the handshake line, and the health,
//! controller, broker and stdio services a go-plugin host calls.

use std::pin::Pin;
use std::sync::Arc;

use base64::Engine as _;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::proto::health::{self, health_server::Health};
use crate::proto::plugin::{
    self as go, grpc_broker_server::GrpcBroker, grpc_controller_server::GrpcController, grpc_stdio_server::GrpcStdio,
};

pub const MAGIC_COOKIE_KEY: &str = "TF_PLUGIN_MAGIC_COOKIE";
pub const MAGIC_COOKIE_VALUE: &str = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2";

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("PLUGIN_CLIENT_CERT holds no PEM certificate")]
    ClientCert,
    #[error("cannot make the plugin certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS setup failed: {0}")]
    Tls(#[from] rustls::Error),
}

/// The server certificate of this plugin run, and its TLS configuration.
pub struct AutoMtls {
    pub server_cert_der: Vec<u8>,
    pub config: Arc<rustls::ServerConfig>,
}

/// Accepts exactly the certificate Terraform put in `PLUGIN_CLIENT_CERT`.
/// (Go's self-signed CA certificate there is not a valid end-entity
/// certificate for WebPKI, so chain building does not apply.)
#[derive(Debug)]
struct ExactClientCert {
    expected: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for ExactClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.expected.as_ref() {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify(message, cert, dss, rustls::crypto::verify_tls12_signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify(message, cert, dss, rustls::crypto::verify_tls13_signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        let mut schemes = self.provider.signature_verification_algorithms.supported_schemes();
        schemes.push(SignatureScheme::ECDSA_NISTP521_SHA512);
        schemes
    }
}

type Verify = fn(
    &[u8],
    &CertificateDer<'_>,
    &DigitallySignedStruct,
    &rustls::crypto::WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error>;

impl ExactClientCert {
    fn verify(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
        ring: Verify,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme == SignatureScheme::ECDSA_NISTP521_SHA512 {
            verify_p521(message, cert, dss)
        } else {
            ring(message, cert, dss, &self.provider.signature_verification_algorithms)
        }
    }
}

/// go-plugin's client certificates use P-521, which ring cannot verify:
/// check the handshake signature with a pure-Rust P-521 implementation.
fn verify_p521(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use p521::ecdsa::signature::Verifier;
    let bad = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature);
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| bad())?;
    let key =
        p521::ecdsa::VerifyingKey::from_sec1_bytes(&parsed.public_key().subject_public_key.data).map_err(|_| bad())?;
    let signature = p521::ecdsa::Signature::from_der(dss.signature()).map_err(|_| bad())?;
    key.verify(message, &signature).map_err(|_| bad())?;
    Ok(HandshakeSignatureValid::assertion())
}

/// The DER of the first certificate in a PEM text.
fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .ok()
        .filter(|d| !d.is_empty())
}

impl AutoMtls {
    /// A fresh self-signed certificate for `localhost`, requiring the host's
    /// certificate from `client_cert_pem`.
    pub fn new(client_cert_pem: &str) -> Result<Self, PluginError> {
        let expected = CertificateDer::from(pem_to_der(client_cert_pem).ok_or(PluginError::ClientCert)?);
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?;
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        params.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
            rcgen::KeyUsagePurpose::KeyCertSign,
        ];
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.self_signed(&key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(ExactClientCert { expected, provider }))
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            server_cert_der: cert.der().to_vec(),
            config: Arc::new(config),
        })
    }
}

/// The line go-plugin reads from stdout: core version 1, protocol 6, the
/// address, grpc, and the server certificate (unpadded base64 DER).
pub fn handshake_line(addr: std::net::SocketAddr, server_cert_der: Option<&[u8]>) -> String {
    let cert = server_cert_der
        .map(|d| base64::engine::general_purpose::STANDARD_NO_PAD.encode(d))
        .unwrap_or_default();
    format!("1|6|tcp|{addr}|grpc|{cert}")
}

pub struct HealthService;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        _: Request<health::HealthCheckRequest>,
    ) -> Result<Response<health::HealthCheckResponse>, Status> {
        Ok(Response::new(health::HealthCheckResponse {
            status: health::health_check_response::ServingStatus::Serving as i32,
        }))
    }
}

/// Ends the plugin when the host asks.
pub struct Controller(pub watch::Sender<bool>);

#[tonic::async_trait]
impl GrpcController for Controller {
    async fn shutdown(&self, _: Request<go::Empty>) -> Result<Response<go::Empty>, Status> {
        self.0.send_replace(true);
        Ok(Response::new(go::Empty {}))
    }
}

type Pending<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A stream that stays open, empty, until shutdown: this provider brokers
/// no connections and forwards no stdio.
fn idle<T: Send + 'static>(mut stop: watch::Receiver<bool>) -> Pending<T> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<T, Status>>(1);
    tokio::spawn(async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
        drop(tx);
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

pub struct Broker(pub watch::Receiver<bool>);

#[tonic::async_trait]
impl GrpcBroker for Broker {
    type StartStreamStream = Pending<go::ConnInfo>;

    async fn start_stream(
        &self,
        _: Request<Streaming<go::ConnInfo>>,
    ) -> Result<Response<Self::StartStreamStream>, Status> {
        Ok(Response::new(idle(self.0.clone())))
    }
}

pub struct Stdio(pub watch::Receiver<bool>);

#[tonic::async_trait]
impl GrpcStdio for Stdio {
    type StreamStdioStream = Pending<go::StdioData>;

    async fn stream_stdio(&self, _: Request<go::Empty>) -> Result<Response<Self::StreamStdioStream>, Status> {
        Ok(Response::new(idle(self.0.clone())))
    }
}
