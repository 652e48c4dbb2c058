//! The provider's resource and data source types.

pub mod dataflow;
pub mod queue_service;

use std::time::Duration;

use crate::cty::Value;
use crate::diag::Diagnostics;

/// The `timeouts` block's `create`/`delete` duration, or `default`.
pub fn timeout(state: &Value, which: &str, default: Duration) -> Result<Duration, Diagnostics> {
    match state.get("timeouts").get(which).as_str() {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            Diagnostics::error(
                format!("Invalid timeouts.{which}"),
                format!("{text:?} is not a duration such as 10m: {e}"),
            )
        }),
    }
}

/// A DNS label check for names known at validation time.
pub fn check_name(config: &Value, diags: &mut Diagnostics) {
    if let Some(name) = config.get("name").as_str() {
        let ok = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !ok {
            diags.push_error(
                "Invalid name",
                format!("{name:?} must be a DNS label: 1-63 of a-z, 0-9 and '-', starting and ending alphanumeric"),
                Some("name"),
            );
        }
    }
}
