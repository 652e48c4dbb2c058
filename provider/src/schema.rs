//! Declarative schemas: one description per attribute drives the protocol
//! schema, defaults, "use state for unknown" and replacement in plans.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::cty::{Type, Value};
use crate::proto;

/// How an attribute behaves in a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Required,
    /// Optional; when absent from config it takes `default`.
    OptionalDefault,
    Optional,
    /// Optional; when absent from config the server chooses (unknown at
    /// create, then kept from state).
    OptionalComputed,
    /// Set by the server and stable across plans (kept from state).
    Computed,
    /// Set by the server and possibly changed by any update (unknown then).
    ComputedVolatile,
}

pub struct Attr {
    pub name: &'static str,
    pub ty: Type,
    pub kind: Kind,
    pub description: Cow<'static, str>,
    pub sensitive: bool,
    pub requires_replace: bool,
    pub default: Option<Value>,
}

impl Attr {
    pub fn new(name: &'static str, ty: Type, kind: Kind, description: impl Into<Cow<'static, str>>) -> Self {
        Self {
            name,
            ty,
            kind,
            description: description.into(),
            sensitive: false,
            requires_replace: false,
            default: None,
        }
    }

    pub fn sensitive(mut self) -> Self {
        self.sensitive = true;
        self
    }

    pub fn replace(mut self) -> Self {
        self.requires_replace = true;
        self
    }

    pub fn default(mut self, v: Value) -> Self {
        self.default = Some(v);
        self
    }

    fn proto(&self) -> proto::schema::Attribute {
        proto::schema::Attribute {
            name: self.name.into(),
            r#type: self.ty.json().to_string().into_bytes(),
            description: self.description.to_string(),
            required: self.kind == Kind::Required,
            optional: matches!(
                self.kind,
                Kind::Optional | Kind::OptionalDefault | Kind::OptionalComputed
            ),
            computed: matches!(
                self.kind,
                Kind::OptionalDefault | Kind::OptionalComputed | Kind::Computed | Kind::ComputedVolatile
            ),
            sensitive: self.sensitive,
            description_kind: proto::StringKind::Markdown as i32,
            deprecated: false,
        }
    }
}

pub struct BlockSchema {
    pub description: &'static str,
    pub attrs: Vec<Attr>,
    /// A `timeouts { create, delete }` block.
    pub timeouts: bool,
}

pub fn timeouts_type() -> Type {
    Type::object([("create", Type::String), ("delete", Type::String)])
}

impl BlockSchema {
    pub fn ty(&self) -> Type {
        let mut attrs: BTreeMap<String, Type> = self.attrs.iter().map(|a| (a.name.to_owned(), a.ty.clone())).collect();
        if self.timeouts {
            attrs.insert("timeouts".into(), timeouts_type());
        }
        Type::Object(attrs)
    }

    pub fn proto(&self) -> proto::Schema {
        let block_types = if self.timeouts {
            vec![proto::schema::NestedBlock {
                type_name: "timeouts".into(),
                block: Some(proto::schema::Block {
                    attributes: ["create", "delete"]
                        .into_iter()
                        .map(|n| {
                            Attr::new(n, Type::String, Kind::Optional, "A duration such as `10m` or `90s`.").proto()
                        })
                        .collect(),
                    ..Default::default()
                }),
                nesting: proto::schema::nested_block::NestingMode::Single as i32,
                min_items: 0,
                max_items: 0,
            }]
        } else {
            vec![]
        };
        proto::Schema {
            version: 0,
            block: Some(proto::schema::Block {
                version: 0,
                attributes: self.attrs.iter().map(Attr::proto).collect(),
                block_types,
                description: self.description.into(),
                description_kind: proto::StringKind::Markdown as i32,
                deprecated: false,
            }),
        }
    }

    /// The planned state: config values, defaults for absent optional ones,
    /// prior values for stable computed ones ("use state for unknown"), and
    /// unknown for what only apply can tell. Also returns the attributes whose
    /// change forces a replacement.
    pub fn plan(&self, prior: &Value, proposed: Value, config: &Value) -> (Value, Vec<&'static str>) {
        if proposed.is_null() {
            return (Value::Null, vec![]);
        }
        let creating = prior.is_null();
        let mut planned = match proposed {
            Value::Object(m) => m,
            _ => BTreeMap::new(),
        };
        let changed = !creating
            && self.attrs.iter().any(|a| match a.kind {
                Kind::Required | Kind::Optional | Kind::OptionalDefault => effective(a, config) != *prior.get(a.name),
                Kind::OptionalComputed => !config.get(a.name).is_null() && config.get(a.name) != prior.get(a.name),
                Kind::Computed | Kind::ComputedVolatile => false,
            });
        let mut replace = vec![];
        for a in &self.attrs {
            let value = match a.kind {
                Kind::Required | Kind::Optional => config.get(a.name).clone(),
                Kind::OptionalDefault => effective(a, config),
                Kind::OptionalComputed => match config.get(a.name) {
                    // Also a state written before the attribute existed.
                    Value::Null if creating || prior.get(a.name).is_null() => Value::Unknown,
                    Value::Null => prior.get(a.name).clone(),
                    set => set.clone(),
                },
                Kind::Computed if creating => Value::Unknown,
                Kind::Computed => prior.get(a.name).clone(),
                Kind::ComputedVolatile if creating || changed => Value::Unknown,
                Kind::ComputedVolatile => prior.get(a.name).clone(),
            };
            if a.requires_replace && !creating && value != *prior.get(a.name) && !value.has_unknown() {
                replace.push(a.name);
            }
            planned.insert(a.name.to_owned(), value);
        }
        if replace.is_empty() {
            (Value::Object(planned), vec![])
        } else {
            // A replacement creates anew: every computed value is unknown.
            for a in &self.attrs {
                let chosen_by_server = a.kind == Kind::OptionalComputed && config.get(a.name).is_null();
                if matches!(a.kind, Kind::Computed | Kind::ComputedVolatile) || chosen_by_server {
                    planned.insert(a.name.to_owned(), Value::Unknown);
                }
            }
            (Value::Object(planned), replace)
        }
    }
}

fn effective(a: &Attr, config: &Value) -> Value {
    match (config.get(a.name), &a.default) {
        (Value::Null, Some(d)) => d.clone(),
        (v, _) => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> BlockSchema {
        BlockSchema {
            description: "",
            attrs: vec![
                Attr::new("name", Type::String, Kind::Required, "").replace(),
                Attr::new("size", Type::Number, Kind::OptionalDefault, "").default(Value::Number(64.0)),
                Attr::new("id", Type::String, Kind::Computed, ""),
                Attr::new("phase", Type::String, Kind::ComputedVolatile, ""),
            ],
            timeouts: false,
        }
    }

    fn obj(pairs: &[(&str, Value)]) -> Value {
        Value::Object(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
    }

    #[test]
    fn create_defaults_and_unknowns() {
        let config = obj(&[
            ("name", Value::str("a")),
            ("size", Value::Null),
            ("id", Value::Null),
            ("phase", Value::Null),
        ]);
        let (planned, replace) = schema().plan(&Value::Null, config.clone(), &config);
        assert_eq!(planned.get("size"), &Value::Number(64.0));
        assert_eq!(planned.get("id"), &Value::Unknown);
        assert!(replace.is_empty());
    }

    #[test]
    fn no_change_keeps_state_and_changes_mark_volatile_unknown() {
        let prior = obj(&[
            ("name", Value::str("a")),
            ("size", Value::Number(64.0)),
            ("id", Value::str("a")),
            ("phase", Value::str("Ready")),
        ]);
        let config = obj(&[
            ("name", Value::str("a")),
            ("size", Value::Null),
            ("id", Value::Null),
            ("phase", Value::Null),
        ]);
        let (planned, _) = schema().plan(&prior, config.clone(), &config);
        assert_eq!(planned, prior, "a second plan shows no change");

        let bigger = obj(&[
            ("name", Value::str("a")),
            ("size", Value::Number(128.0)),
            ("id", Value::Null),
            ("phase", Value::Null),
        ]);
        let (planned, replace) = schema().plan(&prior, bigger.clone(), &bigger);
        assert_eq!(
            (planned.get("id"), planned.get("phase")),
            (&Value::str("a"), &Value::Unknown)
        );
        assert!(replace.is_empty(), "an in-place update");

        let renamed = obj(&[
            ("name", Value::str("b")),
            ("size", Value::Null),
            ("id", Value::Null),
            ("phase", Value::Null),
        ]);
        let (planned, replace) = schema().plan(&prior, renamed.clone(), &renamed);
        assert_eq!(replace, ["name"]);
        assert_eq!(planned.get("id"), &Value::Unknown);
    }

    #[test]
    fn a_value_the_server_chooses_is_unknown_at_create_then_kept_unless_set() {
        let schema = BlockSchema {
            description: "",
            attrs: vec![
                Attr::new("name", Type::String, Kind::Required, "").replace(),
                Attr::new("replicas", Type::Number, Kind::OptionalComputed, ""),
            ],
            timeouts: false,
        };
        let unset = obj(&[("name", Value::str("a")), ("replicas", Value::Null)]);
        let (planned, _) = schema.plan(&Value::Null, unset.clone(), &unset);
        assert_eq!(planned.get("replicas"), &Value::Unknown);
        let prior = obj(&[("name", Value::str("a")), ("replicas", Value::Number(3.0))]);
        let (planned, _) = schema.plan(&prior, unset.clone(), &unset);
        assert_eq!(planned, prior, "unset keeps what the server chose: no change");
        let one = obj(&[("name", Value::str("a")), ("replicas", Value::Number(1.0))]);
        let (planned, replace) = schema.plan(&prior, one.clone(), &one);
        assert_eq!((planned.get("replicas"), replace.len()), (&Value::Number(1.0), 0));
        let older = obj(&[("name", Value::str("a")), ("replicas", Value::Null)]);
        let (planned, _) = schema.plan(&older, unset.clone(), &unset);
        assert_eq!(
            planned.get("replicas"),
            &Value::Unknown,
            "a state from before the attribute"
        );
        let renamed = obj(&[("name", Value::str("b")), ("replicas", Value::Null)]);
        let (planned, replace) = schema.plan(&prior, renamed.clone(), &renamed);
        assert_eq!(replace, ["name"]);
        assert_eq!(
            planned.get("replicas"),
            &Value::Unknown,
            "a new object gets the server's choice anew"
        );
    }
}
