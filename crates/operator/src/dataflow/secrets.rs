//! Resolves the `…SecretRef` fields of a DataFlow's connector configs into
//! values, as the operator does before it writes the processor's spec
//! (seed 001, step 2). A reference may only name a Secret in the DataFlow's
//! own namespace: the operator reads Secrets cluster-wide, and a tenant
//! must not reach another tenant's.

use std::collections::BTreeMap;

use serde_json::Value;

use sless_model::FieldError;
use sless_model::dataflow::SecretRef;

/// A key of a Secret the processor reads as a file (Kafka TLS material),
/// mounted at `{TLS directory}/{secret}/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TlsMount {
    pub secret: String,
    pub key: String,
}

impl TlsMount {
    /// The file's path relative to the TLS directory.
    pub fn relative_path(&self) -> String {
        format!("{}/{}", self.secret, self.key)
    }
}

/// Fields of a `tls` object that name files, not values.
const TLS_FILES: &[&str] = &["ca", "cert", "key"];

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

/// The REST API's form of the refusal: its text at the field it names.
impl From<ResolveError> for FieldError {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::OtherNamespace { path, namespace, other } => FieldError::invalid(
                path,
                format!("a secret reference must stay in the namespace {namespace} (it names {other})"),
            ),
            ResolveError::BadReference { path, reason } => FieldError::invalid(path, reason),
            ResolveError::Missing { path, name, key } => {
                FieldError::invalid(path, format!("secret {name} has no key {key}"))
            }
        }
    }
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
/// comma-separated list. A TLS reference (`tls.caSecretRef`, …) becomes the
/// path of a file (`tls.caFile`) the processor's pod mounts, added to `mounts`.
pub fn resolve(
    config: &mut Value,
    path: &str,
    namespace: &str,
    secrets: &BTreeMap<String, BTreeMap<String, String>>,
    mounts: &mut Vec<TlsMount>,
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
                if path.ends_with(".tls") && TLS_FILES.contains(&field) {
                    let mount = TlsMount {
                        secret: reference.name,
                        key: reference.key,
                    };
                    map.remove(&key);
                    map.insert(format!("{field}File"), Value::String(mount.relative_path()));
                    if !mounts.contains(&mount) {
                        mounts.push(mount);
                    }
                    continue;
                }
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
                    resolve(nested, &here, namespace, secrets, mounts)?;
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
        resolve(&mut config, "source.config", "team-a", &secrets(), &mut Vec::new()).unwrap();
        assert_eq!(
            config,
            json!({"brokers": ["k1:9093", "k2:9093"], "topic": "t",
                   "sasl": {"mechanism": "plain", "username": "u", "password": "s3cret"}})
        );
    }

    #[test]
    fn tls_references_become_mounted_files() {
        let mut secrets = secrets();
        secrets.insert(
            "kafka-tls".into(),
            BTreeMap::from([
                ("ca.crt".to_owned(), "PEM".to_owned()),
                ("tls.key".to_owned(), "PEM".to_owned()),
            ]),
        );
        let mut config = json!({"brokers": ["k:9093"], "topic": "t", "tls": {
            "caSecretRef": {"name": "kafka-tls", "key": "ca.crt"},
            "keySecretRef": {"name": "kafka-tls", "key": "tls.key"},
            "certFile": "given.pem"
        }});
        let mut mounts = Vec::new();
        resolve(&mut config, "source.config", "team-a", &secrets, &mut mounts).unwrap();
        assert_eq!(
            config["tls"],
            json!({"caFile": "kafka-tls/ca.crt", "keyFile": "kafka-tls/tls.key", "certFile": "given.pem"})
        );
        assert_eq!(
            mounts,
            [
                TlsMount {
                    secret: "kafka-tls".into(),
                    key: "ca.crt".into()
                },
                TlsMount {
                    secret: "kafka-tls".into(),
                    key: "tls.key".into()
                }
            ]
        );
    }

    #[test]
    fn another_namespace_or_a_missing_key_is_refused() {
        let mut config = json!({"topicSecretRef": {"name": "kafka", "key": "brokers", "namespace": "team-b"}});
        let e = resolve(&mut config, "sink.config", "team-a", &secrets(), &mut Vec::new()).unwrap_err();
        assert!(matches!(e, ResolveError::OtherNamespace { .. }), "{e}");
        let names = secret_names(&[(&config, "sink.config".into())], "team-a").unwrap_err();
        assert!(names.to_string().contains("team-b"));
        let mut config = json!({"topicSecretRef": {"name": "kafka", "key": "nope"}});
        let e = resolve(&mut config, "sink.config", "team-a", &secrets(), &mut Vec::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sink.config.topicSecretRef: secret kafka has no key nope"
        );
    }
}
