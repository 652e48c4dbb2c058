//! Change events (`postgresql-cdc`'s, in Debezium's shape: `op`, `before`,
//! `after`) as the steps that apply them to a table keyed like their
//! source, in the order they happened: what the `postgresql` sink's
//! `applyChanges` runs, so that after any workload the sink table equals
//! the source table.
//!
//! - `c`, `r` (a snapshot row), `u`: an upsert by key of the columns
//!   `after` has. An update leaves out a TOASTed value it did not change;
//!   so does the upsert, which keeps the sink's value.
//! - `u` whose key changed (`before` holds the old key: always with
//!   `REPLICA IDENTITY FULL`, and with the default identity when the key
//!   changed): the row is updated in place where the old key is, so what
//!   the event leaves out stays.
//! - `d`: a delete by the key `before` holds (the default identity gives
//!   the key, `FULL` the whole row; `NOTHING` gives none and is refused).
//! - `t`: the table truncated.
//!
//! A json or jsonb value that is JSON's `null` is `null` in `after`, as
//! SQL NULL is; the event names its column in `nulls` (`{"doc": "json"}`),
//! and the steps carry those names so that the sink writes JSON's `null`,
//! not NULL.
//!
//! Consecutive upserts are merged by key (a later event's columns over an
//! earlier one's) and written by one statement per set of columns;
//! consecutive deletes by one statement. Anything else ends the run, so
//! the steps keep the events' order.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::message::Message;

type Row = Map<String, Value>;

/// One statement's worth of changes, in order.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Rows with the same columns, upserted by key; each row's columns
    /// that hold JSON's `null` (`json_nulls[i]` for `rows[i]`).
    Upsert {
        columns: Vec<String>,
        rows: Vec<Map<String, Value>>,
        json_nulls: Vec<Vec<String>>,
    },
    /// Rows deleted by their keys (each a map of the key columns).
    Delete {
        keys: Vec<Map<String, Value>>,
    },
    /// The row at `old` (its key) updated to `row`, key included.
    Rekey {
        old: Map<String, Value>,
        row: Map<String, Value>,
        json_nulls: Vec<String>,
    },
    Truncate,
}

/// Upserts being merged: by key, in first-seen order, each row with its
/// columns that hold JSON's `null`.
#[derive(Default)]
struct Upserts {
    order: Vec<String>,
    rows: HashMap<String, (Row, Vec<String>)>,
}

impl Upserts {
    fn add(&mut self, identity: String, row: Row, json_nulls: Vec<String>) {
        match self.rows.get_mut(&identity) {
            Some((merged, nulls)) => {
                nulls.retain(|c| !row.contains_key(c));
                nulls.extend(json_nulls);
                merged.extend(row);
            }
            None => {
                self.order.push(identity.clone());
                self.rows.insert(identity, (row, json_nulls));
            }
        }
    }

    /// The merged rows as steps, one per set of columns.
    fn flush(&mut self, steps: &mut Vec<Step>) {
        let mut groups: Vec<Step> = Vec::new();
        for identity in self.order.drain(..) {
            let Some((row, nulls)) = self.rows.remove(&identity) else {
                continue;
            };
            let mut names: Vec<String> = row.keys().cloned().collect();
            names.sort();
            match groups
                .iter_mut()
                .find(|step| matches!(step, Step::Upsert { columns, .. } if *columns == names))
            {
                Some(Step::Upsert { rows, json_nulls, .. }) => {
                    rows.push(row);
                    json_nulls.push(nulls);
                }
                _ => groups.push(Step::Upsert {
                    columns: names,
                    rows: vec![row],
                    json_nulls: vec![nulls],
                }),
            }
        }
        steps.append(&mut groups);
    }
}

/// The key columns' values of `row`, or why it has none.
fn key_of(row: &Map<String, Value>, key: &[String], what: &str) -> Result<Map<String, Value>, String> {
    key.iter()
        .map(|k| match row.get(k) {
            Some(Value::Null) | None => Err(format!("{what} has no value for key column {k:?}")),
            Some(v) => Ok((k.clone(), v.clone())),
        })
        .collect()
}

/// The columns of the event's `after` that hold JSON's `null`.
fn json_nulls(event: Option<&Map<String, Value>>) -> Vec<String> {
    event
        .and_then(|e| e.get("nulls"))
        .and_then(Value::as_object)
        .map(|named| {
            named
                .iter()
                .filter(|(_, kind)| kind.as_str() == Some("json"))
                .map(|(column, _)| column.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// A key as text, to tell keys apart.
fn identity(key: &Map<String, Value>) -> String {
    Value::Object(key.clone()).to_string()
}

/// A column some event's `after` has and `columns` lacks: the source
/// table gained it (ADD COLUMN). Applying the events without it would
/// lose its values, so the sink refuses them until its table has it.
pub(crate) fn unknown_column<'a>(messages: &'a [Message], columns: &[String]) -> Option<&'a str> {
    messages
        .iter()
        .filter_map(|m| m.data.get("after").and_then(Value::as_object))
        .flat_map(|after| after.keys())
        .find(|name| !columns.contains(name))
        .map(String::as_str)
}

/// The steps that apply `messages` (change events) to a table keyed by
/// `key` that has every column of their `after` ([`unknown_column`]). An
/// error names the message at fault.
pub(crate) fn plan(messages: &[Message], key: &[String]) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut upserts = Upserts::default();
    let mut deletes: Vec<Map<String, Value>> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let event = message.data.as_object();
        let op = event.and_then(|e| e.get("op")).and_then(Value::as_str);
        let row = |field: &str| event.and_then(|e| e.get(field)).and_then(Value::as_object);
        let fault = |reason: String| format!("message {i}: {reason}");
        match op {
            Some("c" | "r" | "u") => {
                let after = row("after")
                    .ok_or_else(|| fault(format!("op {op:?} without after", op = op.unwrap_or_default())))?;
                let new_key = key_of(after, key, "after").map_err(fault)?;
                let old_key = match row("before") {
                    Some(before) if op == Some("u") => Some(key_of(before, key, "before").map_err(fault)?),
                    _ => None,
                };
                if !deletes.is_empty() {
                    steps.push(Step::Delete {
                        keys: std::mem::take(&mut deletes),
                    });
                }
                let json_nulls = json_nulls(event);
                match old_key.filter(|old| *old != new_key) {
                    Some(old) => {
                        upserts.flush(&mut steps);
                        steps.push(Step::Rekey {
                            old,
                            row: after.clone(),
                            json_nulls,
                        });
                    }
                    None => upserts.add(identity(&new_key), after.clone(), json_nulls),
                }
            }
            Some("d") => {
                let before = row("before").ok_or_else(|| {
                    fault("a delete without the deleted row's key: give the source table REPLICA IDENTITY DEFAULT (with a primary key) or FULL".into())
                })?;
                upserts.flush(&mut steps);
                deletes.push(key_of(before, key, "before").map_err(fault)?);
            }
            Some("t") => {
                upserts.flush(&mut steps);
                if !deletes.is_empty() {
                    steps.push(Step::Delete {
                        keys: std::mem::take(&mut deletes),
                    });
                }
                steps.push(Step::Truncate);
            }
            _ => return Err(fault("not a change event (no op c, r, u, d or t)".into())),
        }
    }
    upserts.flush(&mut steps);
    if !deletes.is_empty() {
        steps.push(Step::Delete { keys: deletes });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn events(values: Vec<Value>) -> Vec<Message> {
        values.into_iter().map(Message::new).collect()
    }

    fn map(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn columns() -> Vec<String> {
        ["a", "b", "id"].map(String::from).to_vec()
    }

    #[test]
    fn upserts_merge_by_key_in_order_and_split_by_columns() {
        let steps = plan(
            &events(vec![
                json!({"op": "c", "after": {"id": 1, "a": 1, "b": "x"}}),
                json!({"op": "u", "before": null, "after": {"id": 1, "a": 2}}),
                json!({"op": "r", "after": {"id": 2, "a": 3, "b": "y"}}),
                json!({"op": "u", "before": {"id": 3}, "after": {"id": 3, "a": 4}}),
            ]),
            &["id".into()],
        )
        .unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Upsert {
                    columns: columns(),
                    rows: vec![
                        map(json!({"id": 1, "a": 2, "b": "x"})),
                        map(json!({"id": 2, "a": 3, "b": "y"}))
                    ],
                    json_nulls: vec![vec![], vec![]]
                },
                Step::Upsert {
                    columns: vec!["a".into(), "id".into()],
                    rows: vec![map(json!({"id": 3, "a": 4}))],
                    json_nulls: vec![vec![]]
                },
            ]
        );
    }

    #[test]
    fn deletes_key_changes_and_truncates_keep_the_order() {
        let steps = plan(
            &events(vec![
                json!({"op": "c", "after": {"id": 1, "a": 1}}),
                json!({"op": "d", "before": {"id": 1, "a": null}}),
                json!({"op": "d", "before": {"id": 2}}),
                json!({"op": "c", "after": {"id": 1, "a": 5}}),
                json!({"op": "u", "before": {"id": 1}, "after": {"id": 7, "a": 6}}),
                json!({"op": "t"}),
                json!({"op": "c", "after": {"id": 8}}),
            ]),
            &["id".into()],
        )
        .unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Upsert {
                    columns: vec!["a".into(), "id".into()],
                    rows: vec![map(json!({"id": 1, "a": 1}))],
                    json_nulls: vec![vec![]]
                },
                Step::Delete {
                    keys: vec![map(json!({"id": 1})), map(json!({"id": 2}))]
                },
                Step::Upsert {
                    columns: vec!["a".into(), "id".into()],
                    rows: vec![map(json!({"id": 1, "a": 5}))],
                    json_nulls: vec![vec![]]
                },
                Step::Rekey {
                    old: map(json!({"id": 1})),
                    row: map(json!({"id": 7, "a": 6})),
                    json_nulls: vec![]
                },
                Step::Truncate,
                Step::Upsert {
                    columns: vec!["id".into()],
                    rows: vec![map(json!({"id": 8}))],
                    json_nulls: vec![vec![]]
                },
            ]
        );
    }

    /// A column's JSON `null` stays named through merging, until a later
    /// event of the key gives the column a value; a key change keeps its
    /// own.
    #[test]
    fn json_nulls_follow_their_rows_through_merging() {
        let steps = plan(
            &events(vec![
                json!({"op": "c", "after": {"id": 1, "a": null, "b": null}, "nulls": {"a": "json", "b": "json"}}),
                json!({"op": "u", "before": null, "after": {"id": 1, "a": {"x": 1}}}),
                json!({"op": "c", "after": {"id": 2, "a": null, "b": null}, "nulls": {"b": "json", "a": "other"}}),
                json!({"op": "u", "before": {"id": 2}, "after": {"id": 3, "a": null}, "nulls": {"a": "json"}}),
            ]),
            &["id".into()],
        )
        .unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Upsert {
                    columns: columns(),
                    rows: vec![
                        map(json!({"id": 1, "a": {"x": 1}, "b": null})),
                        map(json!({"id": 2, "a": null, "b": null}))
                    ],
                    json_nulls: vec![vec!["b".into()], vec!["b".into()]]
                },
                Step::Rekey {
                    old: map(json!({"id": 2})),
                    row: map(json!({"id": 3, "a": null})),
                    json_nulls: vec!["a".into()]
                },
            ]
        );
    }

    #[test]
    fn what_cannot_be_applied_names_the_message() {
        let key = ["id".to_owned()];
        for (event, words) in [
            (json!({"op": "d", "before": null}), "REPLICA IDENTITY"),
            (json!({"op": "c", "after": {"a": 1}}), "key column \"id\""),
            (json!({"after": {"id": 1}}), "not a change event"),
            (json!("text"), "not a change event"),
        ] {
            let error = plan(&events(vec![json!({"op": "c", "after": {"id": 0}}), event]), &key).unwrap_err();
            assert!(error.starts_with("message 1: ") && error.contains(words), "{error}");
        }
    }

    #[test]
    fn a_column_the_table_lacks_is_named() {
        let batch = events(vec![
            json!({"op": "d", "before": {"id": 1, "gone": 1}}),
            json!({"op": "u", "before": null, "after": {"id": 1, "a": 2}}),
            json!({"op": "c", "after": {"id": 2, "a": 3, "added": "x"}}),
        ]);
        assert_eq!(unknown_column(&batch, &columns()), Some("added"));
        assert_eq!(unknown_column(&batch[..2], &columns()), None);
    }
}
