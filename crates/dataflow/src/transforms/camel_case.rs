//! `camelCase`: `first_name` → `FirstName` (upstream capitalises the first
//! part too); nested objects too with `deep`.

use super::key_case::{Case, RenameKeys};

/// The `camelCase` transformation.
pub type CamelCase = RenameKeys<Camel>;

pub struct Camel;

impl Case for Camel {
    const KIND: &'static str = "camelCase";

    fn rename(key: &str) -> Option<String> {
        Some(to_camel_case(key)).filter(|camel| camel != key)
    }
}

pub fn to_camel_case(key: &str) -> String {
    let out: String = key
        .split('_')
        .filter(|p| !p.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect::<String>())
                .unwrap_or_default()
        })
        .collect();
    if out.is_empty() { key.to_owned() } else { out }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::message::Message;
    use crate::transforms::Transform;
    use crate::transforms::key_case::CaseConfig;

    #[test]
    fn keys() {
        for (from, to) in [
            ("first_name", "FirstName"),
            ("id", "Id"),
            ("a__b", "AB"),
            ("_", "_"),
            ("Already", "Already"),
        ] {
            assert_eq!(to_camel_case(from), to, "{from}");
        }
    }

    #[test]
    fn deep_renames_nested_keys() {
        let out = CamelCase::new(&CaseConfig { deep: true }).apply(Message::new(json!({"user_id": {"zip_code": 1}})));
        assert_eq!(out[0].data, json!({"UserId": {"ZipCode": 1}}));
    }
}
