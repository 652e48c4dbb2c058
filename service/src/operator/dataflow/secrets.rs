//! Resolves the `…SecretRef` fields of a DataFlow's connector configs into
//! values, as the operator does before it writes the processor's spec
//! (seed 001, step 2). A reference may only name a Secret in the DataFlow's
//! own namespace: the operator reads Secrets cluster-wide, and a tenant
//! must not reach another tenant's.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::connector_config::SecretRef;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("{path}: a secret reference must stay in the namespace {namespace} (it names {other})")]
    OtherNamespace {
        path: String,
        namespace: String,
        other: String,
    },
    #[error("{path}: {reason}")]
    BadReference { path: String, reason: String },
    #[error("{path}: secret {name} has no key {key}")]
    Missing { path: String, name: String, key: String },
}

/// The references of `config` (at `path`), as (json path, field, reference).
pub fn references(config: &Value, path: &str) -> Result<Vec<(String, String, SecretRef)>, ResolveError> {
    let mut found = Vec::new();
    collect(config, path, &mut found)?;
    Ok(found)
}

fn collect(value: &Value, path: &str, found: &mut Vec<(String, String, SecretRef)>) -> Result<(), ResolveError> {
    let Value::Object(map) = value else { return Ok(()) };
    for (key, v) in map {
        let here = format!("{path}.{key}");
        match key.strip_suffix("SecretRef") {
            Some(field) if !field.is_empty() => {
                let reference: SecretRef =
                    serde_json::from_value(v.clone()).map_err(|e| ResolveError::BadReference {
                        path: here.clone(),
                        reason: e.to_string(),
                    })?;
                found.push((path.to_owned(), field.to_owned(), reference));
            }
            _ => collect(v, &here, found)?,
        }
    }
    Ok(())
}

/// Replaces every reference in `config` with its value from `secrets`
/// (name → key → value, all in `namespace`). `brokers` takes a
/// comma-separated list.
pub fn resolve(
    config: &mut Value,
    path: &str,
    namespace: &str,
    secrets: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<(), ResolveError> {
    let Value::Object(map) = config else { return Ok(()) };
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let here = format!("{path}.{key}");
        match key.strip_suffix("SecretRef").filter(|f| !f.is_empty()) {
            Some(field) => {
                let reference: SecretRef =
                    serde_json::from_value(map[&key].clone()).map_err(|e| ResolveError::BadReference {
                        path: here.clone(),
                        reason: e.to_string(),
                    })?;
                if let Some(other) = reference.namespace.as_deref().filter(|n| *n != namespace) {
                    return Err(ResolveError::OtherNamespace {
                        path: here,
                        namespace: namespace.to_owned(),
                        other: other.to_owned(),
                    });
                }
                let value = secrets
                    .get(&reference.name)
                    .and_then(|data| data.get(&reference.key))
                    .ok_or_else(|| ResolveError::Missing {
                        path: here.clone(),
                        name: reference.name.clone(),
                        key: reference.key.clone(),
                    })?;
                let resolved = if field == "brokers" {
                    Value::Array(value.split(',').map(|b| Value::String(b.trim().to_owned())).collect())
                } else {
                    Value::String(value.clone())
                };
                map.remove(&key);
                map.insert(field.to_owned(), resolved);
            }
            None => {
                if let Some(nested) = map.get_mut(&key) {
                    resolve(nested, &here, namespace, secrets)?;
                }
            }
        }
    }
    Ok(())
}

/// Checks that no reference leaves `namespace`; the Secret names to read.
pub fn secret_names(configs: &[(&Value, String)], namespace: &str) -> Result<Vec<String>, ResolveError> {
    let mut names = Vec::new();
    for (config, path) in configs {
        for (at, field, reference) in references(config, path)? {
            if let Some(other) = reference.namespace.as_deref().filter(|n| *n != namespace) {
                return Err(ResolveError::OtherNamespace {
                    path: format!("{at}.{field}SecretRef"),
                    namespace: namespace.to_owned(),
                    other: other.to_owned(),
                });
            }
            if !names.contains(&reference.name) {
                names.push(reference.name);
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secrets() -> BTreeMap<String, BTreeMap<String, String>> {
        BTreeMap::from([(
            "kafka".to_owned(),
            BTreeMap::from([
                ("brokers".to_owned(), "k1:9093, k2:9093".to_owned()),
                ("password".to_owned(), "s3cret".to_owned()),
            ]),
        )])
    }

    #[test]
    fn references_become_values_nested_ones_too() {
        let mut config = json!({
            "brokersSecretRef": {"name": "kafka", "key": "brokers"},
            "topic": "t",
            "sasl": {"mechanism": "plain", "username": "u", "passwordSecretRef": {"name": "kafka", "key": "password"}}
        });
        resolve(&mut config, "source.config", "team-a", &secrets()).unwrap();
        assert_eq!(
            config,
            json!({"brokers": ["k1:9093", "k2:9093"], "topic": "t",
                   "sasl": {"mechanism": "plain", "username": "u", "password": "s3cret"}})
        );
    }

    #[test]
    fn another_namespace_or_a_missing_key_is_refused() {
        let mut config = json!({"topicSecretRef": {"name": "kafka", "key": "brokers", "namespace": "team-b"}});
        let e = resolve(&mut config, "sink.config", "team-a", &secrets()).unwrap_err();
        assert!(matches!(e, ResolveError::OtherNamespace { .. }), "{e}");
        let names = secret_names(&[(&config, "sink.config".into())], "team-a").unwrap_err();
        assert!(names.to_string().contains("team-b"));
        let mut config = json!({"topicSecretRef": {"name": "kafka", "key": "nope"}});
        let e = resolve(&mut config, "sink.config", "team-a", &secrets()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sink.config.topicSecretRef: secret kafka has no key nope"
        );
    }
}
