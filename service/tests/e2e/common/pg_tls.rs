//! PostgreSQL over TLS for tests: a proxy that answers PostgreSQL's
//! SSLRequest, terminates TLS with a certificate made at test time, and
//! passes the session on to the plaintext test database. It refuses
//! clients that do not ask for TLS.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// PostgreSQL's SSLRequest code.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 4, 210, 22, 47];

pub struct TlsPostgres {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl TlsPostgres {
    pub async fn start(cert_pem: &str, key_pem: &str) -> Self {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 8];
                    if client.read_exact(&mut request).await.is_err() || request != SSL_REQUEST {
                        return;
                    }
                    if client.write_all(b"S").await.is_err() {
                        return;
                    }
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut db) = TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut db).await;
                });
            }
        });
        Self { port, task }
    }
}

/// Two servers with certificates of a test CA, one for `localhost`, one
/// naming another host; the CA's certificate is written as `ca.pem` where
/// `sless dev` in `dir` reads `sslrootcert` files.
pub async fn named_and_misnamed(dir: &std::path::Path) -> (TlsPostgres, TlsPostgres) {
    let ca = sless_testkit::tls::Ca::new("test database CA");
    let (cert, key) = ca.issue(&["localhost"], &[]);
    let named = TlsPostgres::start(&cert, &key).await;
    let (other_cert, other_key) = ca.issue(&["db.elsewhere.example"], &[]);
    let misnamed = TlsPostgres::start(&other_cert, &other_key).await;
    std::fs::create_dir_all(dir.join("tls")).unwrap();
    std::fs::write(dir.join("tls/ca.pem"), &ca.pem).unwrap();
    (named, misnamed)
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        self.task.abort();
    }
}
