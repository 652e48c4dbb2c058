//! `camelCase`: `first_name` → `FirstName` (upstream capitalises the first
//! part too); nested objects too with `deep`.

use super::{BuildError, CaseConfig, Component, Message, Outputs, Transform, rename_keys};

pub struct CamelCase {
    deep: bool,
}

impl CamelCase {
    pub fn new(config: &CaseConfig) -> Self {
        Self { deep: config.deep }
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

impl Component for CamelCase {
    const KIND: &'static str = "camelCase";
    type Config = CaseConfig;

    fn build(config: CaseConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Ok(Self::new(&config))
    }
}

impl Transform for CamelCase {
    fn apply(&self, mut message: Message) -> Vec<Message> {
        message.data = rename_keys(std::mem::take(&mut message.data), self.deep, &to_camel_case);
        vec![message]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
