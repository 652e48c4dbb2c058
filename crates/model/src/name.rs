//! Object and tenant names: RFC 1123 DNS labels, because they become parts of
//! Kubernetes object names (`sqs-{tenant}`, `dataflow-{name}`) and URL paths.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::FieldError;

/// Maximum length of a DNS label.
pub const MAX_LEN: usize = 63;

/// [`DnsLabel::parse`]'s rule as a regular expression, for the OpenAPI
/// document (a test checks the two agree).
pub const PATTERN: &str = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";

/// A validated DNS label: 1–63 characters of `[a-z0-9-]`, starting and ending
/// with an alphanumeric character.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DnsLabel(String);

impl DnsLabel {
    /// Validates `value`; `field` names it in the error.
    pub fn parse(value: &str, field: &str) -> Result<Self, FieldError> {
        let invalid = |why: &str| FieldError::invalid(field, format!("{why} (got {value:?})"));
        if value.is_empty() {
            return Err(FieldError::required(field));
        }
        if value.len() > MAX_LEN {
            return Err(invalid("must be at most 63 characters"));
        }
        if !value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "must consist of lower-case letters, digits and '-' (a DNS label)",
            ));
        }
        if value.starts_with('-') || value.ends_with('-') {
            return Err(invalid("must start and end with a letter or digit"));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for DnsLabel {
    type Error = FieldError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value, "name")
    }
}

/// Longest tenant id. A tenant's objects live in the Kubernetes namespace
/// `sless-fn-{tenant}`, which is a DNS label too; every other name derived
/// from a tenant is shorter than that one or may be longer (a test of the
/// operator's builders checks them all at this bound).
pub const MAX_TENANT_LEN: usize = MAX_LEN - "sless-fn-".len();

/// The one tenant-id rule, which the tenants file and flags, the REST API,
/// the gateway's routes and the QueueService CRD apply: a DNS label of at
/// most [`MAX_TENANT_LEN`] characters.
pub fn tenant_id(value: &str, field: &str) -> Result<DnsLabel, FieldError> {
    let label = DnsLabel::parse(value, field)?;
    if value.len() > MAX_TENANT_LEN {
        return Err(FieldError::invalid(
            field,
            format!(
                "a tenant id must be at most {MAX_TENANT_LEN} characters, so that its Kubernetes \
                 namespace sless-fn-{{id}} is a DNS label (got {} characters)",
                value.len()
            ),
        ));
    }
    Ok(label)
}

impl From<DnsLabel> for String {
    fn from(value: DnsLabel) -> Self {
        value.0
    }
}

impl fmt::Display for DnsLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_labels() {
        for ok in ["a", "0", "orders-to-dwh", "a1-b2", &"x".repeat(63)] {
            assert_eq!(DnsLabel::parse(ok, "name").unwrap().as_str(), ok);
        }
    }

    #[test]
    fn a_tenant_id_is_a_label_whose_namespace_is_one_too() {
        for ok in ["a".to_owned(), "ab".to_owned(), "t".repeat(MAX_TENANT_LEN)] {
            assert!(tenant_id(&ok, "id").is_ok(), "{ok}");
            assert!(DnsLabel::parse(&format!("sless-fn-{ok}"), "namespace").is_ok());
        }
        let long = "t".repeat(MAX_TENANT_LEN + 1);
        assert!(tenant_id(&long, "id").unwrap_err().message.contains("at most 54"));
        assert!(DnsLabel::parse(&format!("sless-fn-{long}"), "namespace").is_err());
        for bad in ["", "-a", "A", "a_b"] {
            assert!(tenant_id(bad, "id").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rejects_non_labels() {
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "ä", &"x".repeat(64)] {
            let err = DnsLabel::parse(bad, "name").unwrap_err();
            assert_eq!(err.field, "name", "{bad:?}");
        }
    }
}
