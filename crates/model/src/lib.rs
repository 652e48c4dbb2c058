//! The API's domain types: desired specs, observed statuses, names and
//! their validation. Shared by the REST API, the operator's webhook, the
//! platforms and the Terraform provider, so every entry point applies the
//! same rules. It depends on no other sless crate.

pub mod dataflow;
pub mod name;
pub mod queue_service;

use std::fmt;

/// Deserializes an optional integer that a request may write as `64` or
/// `64.0`: JSON Schema's `integer`, which the OpenAPI document promises,
/// admits both. A fraction, or a value its type cannot hold, is refused.
pub fn whole_number<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i64>,
{
    use serde::de::Error;
    let Some(number) = <Option<serde_json::Number> as serde::Deserialize>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let whole = number.as_i64().or_else(|| {
        number
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= i64::MIN as f64 && *f < i64::MAX as f64)
            .map(|f| f as i64)
    });
    whole
        .and_then(|n| T::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("{number} is not a whole number in range")))
}

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

/// Body of every error answer of the REST API, which the Terraform provider
/// reads back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable code such as `validation_failed`.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
    /// Dotted path of the offending request field, when one is to blame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
