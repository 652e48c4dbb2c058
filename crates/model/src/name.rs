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
    fn rejects_non_labels() {
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "ä", &"x".repeat(64)] {
            let err = DnsLabel::parse(bad, "name").unwrap_err();
            assert_eq!(err.field, "name", "{bad:?}");
        }
    }
}
