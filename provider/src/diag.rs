//! Diagnostics: the errors and warnings Terraform shows the user.

use crate::proto;

#[derive(Debug, Default)]
pub struct Diagnostics(pub Vec<proto::Diagnostic>);

impl Diagnostics {
    pub fn error(summary: impl Into<String>, detail: impl Into<String>) -> Self {
        let mut d = Self::default();
        d.push_error(summary, detail, None);
        d
    }

    pub fn push_warning(&mut self, summary: impl Into<String>, detail: impl Into<String>) {
        self.0.push(proto::Diagnostic {
            severity: proto::diagnostic::Severity::Warning as i32,
            summary: summary.into(),
            detail: detail.into(),
            attribute: None,
        });
    }

    pub fn push_error(&mut self, summary: impl Into<String>, detail: impl Into<String>, attribute: Option<&str>) {
        self.0.push(proto::Diagnostic {
            severity: proto::diagnostic::Severity::Error as i32,
            summary: summary.into(),
            detail: detail.into(),
            attribute: attribute.map(|name| proto::AttributePath {
                steps: vec![proto::attribute_path::Step {
                    selector: Some(proto::attribute_path::step::Selector::AttributeName(name.into())),
                }],
            }),
        });
    }
}

impl From<crate::client::ApiError> for Diagnostics {
    fn from(e: crate::client::ApiError) -> Self {
        Self::error("sless API request failed", e.to_string())
    }
}
