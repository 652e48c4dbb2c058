//! `mask`: replaces field values by a mask: the mask text repeated as many
//! times as the value's text has characters with `keepLength` (characters,
//! not bytes as upstream counts), else three times. Missing fields are
//! skipped.

use serde_json::Value;

use serde::Deserialize;
use sless_model::{FieldError, ValidationErrors};

use super::{Build, BuildError, Message, Outputs, Transform};
use crate::component::Component;
use crate::path::Path;

/// `config` of `mask`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaskConfig {
    #[serde(default)]
    pub fields: Vec<String>,
    /// Default `*`; several characters are repeated together, as upstream does.
    pub mask_char: Option<String>,
    #[serde(default)]
    pub keep_length: bool,
}

pub struct Mask {
    fields: Vec<Path>,
    mask: String,
    keep_length: bool,
}

/// Longest mask text: a masked value is at most this many times its length.
const MAX_MASK_CHARS: usize = 8;

impl Mask {
    pub fn new(config: &MaskConfig) -> Result<Self, BuildError> {
        Ok(Self {
            fields: super::paths(&config.fields)?,
            mask: config.mask_char.clone().unwrap_or_else(|| "*".into()),
            keep_length: config.keep_length,
        })
    }
}

impl Component for Mask {
    const KIND: &'static str = "mask";
    type Config = MaskConfig;

    fn check(config: &MaskConfig, path: &str, errors: &mut ValidationErrors) {
        super::check_fields(&config.fields, path, errors);
        if config
            .mask_char
            .as_deref()
            .is_some_and(|m| m.is_empty() || m.chars().count() > MAX_MASK_CHARS)
        {
            errors.push(FieldError::invalid(
                format!("{path}.maskChar"),
                format!("must be 1 to {MAX_MASK_CHARS} characters"),
            ));
        }
    }
}

impl Build for Mask {
    fn build(config: MaskConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Self::new(&config)
    }
}

impl Transform for Mask {
    fn apply(&self, mut message: Message) -> Vec<Message> {
        for field in &self.fields {
            let Some(value) = field.get(&message.data) else {
                continue;
            };
            let length = match value {
                Value::String(s) => s.chars().count(),
                other => other.to_string().chars().count(),
            };
            let masked = self.mask.repeat(if self.keep_length { length } else { 3 });
            field.set(&mut message.data, Value::String(masked));
        }
        vec![message]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn masks_with_and_without_length() {
        let keep = Mask::new(&MaskConfig {
            fields: vec!["card".into(), "user.pin".into(), "nope".into()],
            mask_char: Some("#".into()),
            keep_length: true,
        })
        .unwrap();
        let out = keep.apply(Message::new(json!({"card": "4111222233334444", "user": {"pin": 1234}})));
        assert_eq!(
            out[0].data,
            json!({"card": "################", "user": {"pin": "####"}})
        );
        let short = Mask::new(&MaskConfig {
            fields: vec!["card".into()],
            mask_char: None,
            keep_length: false,
        })
        .unwrap();
        assert_eq!(
            short.apply(Message::new(json!({"card": "4111"})))[0].data,
            json!({"card": "***"})
        );
    }

    #[test]
    fn a_longer_mask_repeats_and_array_elements_are_fields() {
        let mask = Mask::new(&MaskConfig {
            fields: vec!["items.0.card".into(), "items[1].card".into()],
            mask_char: Some("X-".into()),
            keep_length: true,
        })
        .unwrap();
        let out = mask.apply(Message::new(json!({"items": [{"card": "ab✓"}, {"card": "c"}]})));
        assert_eq!(out[0].data, json!({"items": [{"card": "X-X-X-"}, {"card": "X-"}]}));
        let mut errors = ValidationErrors::default();
        let too_long = MaskConfig {
            fields: vec!["a".into()],
            mask_char: Some("123456789".into()),
            keep_length: false,
        };
        Mask::check(&too_long, "t", &mut errors);
        assert!(errors.to_string().contains("maskChar"), "{errors}");
    }
}
