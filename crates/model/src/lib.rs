//! The API's domain types: desired specs, observed statuses, names and
//! their validation. Shared by the REST API, the operator's webhook, the
//! platforms and the Terraform provider, so every entry point applies the
//! same rules. It depends on no other sless crate.

pub mod dataflow;
pub mod name;
pub mod queue_service;

use std::fmt;

/// One problem with one field of a request, addressed by a dotted path such
/// as `transformations[1].config.fields`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: "required".into(),
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A value outside a closed set; lists the accepted values.
    pub fn not_supported(field: impl Into<String>, got: &str, supported: &[&str]) -> Self {
        Self {
            field: field.into(),
            message: format!("unsupported value {got:?}; supported values: {}", supported.join(", ")),
        }
    }
}

/// Every problem found in one request, in document order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    pub fn push(&mut self, error: FieldError) {
        self.0.push(error);
    }

    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl From<FieldError> for ValidationErrors {
    fn from(error: FieldError) -> Self {
        Self(vec![error])
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for ValidationErrors {}
