//! The process-wide rustls crypto provider. tonic's TLS asks rustls for the
//! process default, which rustls cannot pick when more than one provider is
//! compiled in (a test build links aws-lc-rs through a dev-dependency), so
//! sless installs ring, the provider it is built with, before any TLS use.

pub fn install_default_provider() {
    // An error means a provider is installed already: that one stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
