//! AddPermission and RemovePermission: statements in the queue's Policy.
//! sless keeps and reports the policy but does not enforce it (see the
//! README): a tenant's keys open its queues, and no other account exists.

use super::Engine;
use super::requests::{self, AddPermission, Label};
use super::responses::Empty;
use crate::error::SqsError;

impl Engine {
    /// Adds a statement (`Sid` = its label) to the queue's Policy.
    pub(super) async fn add_permission(&self, name: &str, request: AddPermission) -> Result<Empty, SqsError> {
        let label = permission_label(&request.label)?;
        // In AWS's order: no action, no account, too many actions.
        if request.actions.is_empty() {
            return Err(SqsError::missing_parameter(
                "The request must contain the parameter Actions.",
            ));
        }
        if request.aws_account_ids.is_empty() {
            return Err(SqsError::invalid_parameter_value(
                "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.",
            ));
        }
        if request.actions.len() > MAX_PERMISSION_ACTIONS {
            return Err(SqsError::over_limit(format!(
                "{} Actions were found, maximum allowed is {MAX_PERMISSION_ACTIONS}.",
                request.actions.len()
            )));
        }
        if let Some(bad) = request
            .aws_account_ids
            .iter()
            .find(|a| a.len() != 12 || !a.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(SqsError::invalid_parameter_value(format!(
                "Value {} for parameter AWSAccountIds is invalid. Reason: an account id is 12 digits.",
                requests::echo(bad)
            )));
        }
        if let Some(bad) = request
            .actions
            .iter()
            .find(|a| !PERMISSION_ACTIONS.contains(&a.as_str()))
        {
            return Err(SqsError::invalid_parameter_value(format!(
                "Value SQS:{} for parameter ActionName is invalid. Reason: Please refer to the appropriate \
                 WSDL for a list of valid actions.",
                requests::echo(bad)
            )));
        }
        let arn = self.queue_arn(name);
        self.update_meta(name, |_, meta, now| {
            let mut policy = meta
                .attributes
                .0
                .get("Policy")
                .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
                .filter(serde_json::Value::is_object)
                .unwrap_or_else(
                    || serde_json::json!({"Version": "2012-10-17", "Id": format!("{arn}/SQSDefaultPolicy")}),
                );
            if !policy["Statement"].is_array() {
                policy["Statement"] = serde_json::json!([]);
            }
            let statements = policy["Statement"].as_array_mut().expect("an array, made so above");
            if statements.iter().any(|s| s["Sid"] == label) {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Value {label} for parameter Label is invalid. Reason: Already exists."
                )));
            }
            let principals = request.aws_account_ids.iter().map(|a| format!("arn:aws:iam::{a}:root"));
            let actions = request.actions.iter().map(|a| format!("SQS:{a}"));
            statements.push(serde_json::json!({
                "Sid": label,
                "Effect": "Allow",
                "Principal": {"AWS": one_or_many(principals)},
                "Action": one_or_many(actions),
                "Resource": arn,
            }));
            meta.attributes.0.insert("Policy".into(), policy.to_string());
            meta.modified_s = now / 1000;
            Ok(())
        })
        .await
    }

    pub(super) async fn remove_permission(&self, name: &str, request: &Label) -> Result<Empty, SqsError> {
        let label = permission_label(&request.label)?;
        self.update_meta(name, |_, meta, now| {
            let missing = || {
                SqsError::invalid_parameter_value(format!(
                    "Value {label} for parameter Label is invalid. Reason: can't find label on existing policy."
                ))
            };
            let mut policy: serde_json::Value = meta
                .attributes
                .0
                .get("Policy")
                .and_then(|p| serde_json::from_str(p).ok())
                .ok_or_else(missing)?;
            let statements = policy["Statement"].as_array_mut().ok_or_else(missing)?;
            let before = statements.len();
            statements.retain(|s| s["Sid"] != label);
            if statements.len() == before {
                return Err(missing());
            }
            if statements.is_empty() {
                meta.attributes.0.remove("Policy");
            } else {
                meta.attributes.0.insert("Policy".into(), policy.to_string());
            }
            meta.modified_s = now / 1000;
            Ok(())
        })
        .await
    }
}

/// Most actions one AddPermission grants.
const MAX_PERMISSION_ACTIONS: usize = 7;

/// A policy value as AWS writes it: a single value as a string, several
/// as an array.
fn one_or_many(values: impl Iterator<Item = String>) -> serde_json::Value {
    let mut values: Vec<serde_json::Value> = values.map(serde_json::Value::String).collect();
    if values.len() == 1 {
        values.remove(0)
    } else {
        serde_json::Value::Array(values)
    }
}

/// Actions a permission may grant.
const PERMISSION_ACTIONS: &[&str] = &[
    "*",
    "SendMessage",
    "ReceiveMessage",
    "DeleteMessage",
    "ChangeMessageVisibility",
    "GetQueueAttributes",
    "GetQueueUrl",
    "ListDeadLetterSourceQueues",
    "PurgeQueue",
    "ListQueueTags",
];

/// A permission's label: 1–80 of `[A-Za-z0-9_-]`.
fn permission_label(label: &Option<String>) -> Result<&str, SqsError> {
    let label = requests::required(label, "Label")?;
    if !requests::is_identifier(label) {
        return Err(SqsError::invalid_parameter_value(format!(
            "Value {} for parameter Label is invalid. Reason: up to 80 alphanumeric characters, hyphens or \
             underscores.",
            requests::echo(label)
        )));
    }
    Ok(label)
}
