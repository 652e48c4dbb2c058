//! A test certificate authority (rcgen): certificates made at test time.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Self { params, key, pem }
    }

    /// (certificate PEM, key PEM) signed by this CA.
    pub fn issue(&self, dns: &[&str], uris: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI(uri.to_string().try_into().unwrap()));
        }
        let issuer = Issuer::from_params(&self.params, &self.key);
        (params.signed_by(&key, &issuer).unwrap().pem(), key.serialize_pem())
    }
}
