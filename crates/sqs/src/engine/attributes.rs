//! Queue attributes: defaults, bounds (SQS strict limits) and names.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::SqsError;

/// 1 MiB: AWS's message (and batch) size limit since 2025.
pub const MAX_MESSAGE_SIZE: u32 = 1_048_576;

/// Settable attributes with (min, max, default) for the numeric ones.
const NUMERIC: &[(&str, u32, u32, u32)] = &[
    ("DelaySeconds", 0, 900, 0),
    ("MaximumMessageSize", 1024, MAX_MESSAGE_SIZE, MAX_MESSAGE_SIZE),
    ("MessageRetentionPeriod", 60, 1_209_600, 345_600),
    ("ReceiveMessageWaitTimeSeconds", 0, 20, 0),
    ("VisibilityTimeout", 0, 43_200, 30),
];

/// Attributes accepted by CreateQueue/SetQueueAttributes but not acted on;
/// an empty value removes them, as in SQS.
const ACCEPTED: &[&str] = &[
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    "RedriveAllowPolicy",
];

/// FIFO-only attributes: their values, the first one the default.
const FIFO_CHOICES: &[(&str, &[&str])] = &[
    ("DeduplicationScope", &["queue", "messageGroup"]),
    ("FifoThroughputLimit", &["perQueue", "perMessageGroupId"]),
];

/// Read-only attributes that GetQueueAttributes reports.
pub const COMPUTED: &[&str] = &[
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
];

/// sless's own read-only attributes, reported only when asked for by name,
/// so that `All` stays what SQS returns. `ApproximateAgeOfOldestMessage`
/// (seconds, as the CloudWatch metric of that name) is what SQS shows only
/// in CloudWatch.
pub const EXTENSIONS: &[&str] = &["ApproximateAgeOfOldestMessage"];

/// Validated settable attributes of a queue.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct QueueAttributes(pub BTreeMap<String, String>);

/// A queue's redrive policy: where messages go after `max_receive_count` receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedrivePolicy {
    pub dead_letter_target_arn: String,
    pub max_receive_count: u32,
}

impl RedrivePolicy {
    fn parse(text: &str) -> Option<Self> {
        let v: Value = serde_json::from_str(text).ok()?;
        let count = match &v["maxReceiveCount"] {
            Value::Number(n) => n.as_u64()?,
            Value::String(s) => s.parse().ok()?,
            _ => return None,
        };
        Some(Self {
            dead_letter_target_arn: v["deadLetterTargetArn"].as_str()?.to_owned(),
            max_receive_count: u32::try_from(count).ok()?,
        })
    }

    fn to_json(&self) -> String {
        serde_json::json!({
            "deadLetterTargetArn": self.dead_letter_target_arn,
            "maxReceiveCount": self.max_receive_count,
        })
        .to_string()
    }
}

/// Names of the numeric settable attributes.
pub fn numeric_names() -> impl Iterator<Item = &'static str> {
    NUMERIC.iter().map(|(name, ..)| *name)
}

/// Whether `name` is an attribute a queue can have (settable or computed).
pub fn is_known(name: &str) -> bool {
    numeric_names().any(|n| n == name)
        || ACCEPTED.contains(&name)
        || COMPUTED.contains(&name)
        || EXTENSIONS.contains(&name)
        || FIFO_CHOICES.iter().any(|(n, _)| *n == name)
        || matches!(name, "RedrivePolicy" | "FifoQueue" | "ContentBasedDeduplication")
}

/// The FIFO-only attributes with their defaults, as a FIFO queue reports them.
pub fn fifo_defaults() -> impl Iterator<Item = (&'static str, &'static str)> {
    FIFO_CHOICES.iter().map(|(name, values)| (*name, values[0]))
}

impl QueueAttributes {
    pub fn number(&self, name: &str) -> u32 {
        self.0
            .get(name)
            .and_then(|v| v.parse().ok())
            .or_else(|| NUMERIC.iter().find(|(n, ..)| *n == name).map(|(.., d)| *d))
            .unwrap_or_default()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.0.get(name).is_some_and(|v| v == "true")
    }

    pub fn redrive_policy(&self) -> Option<RedrivePolicy> {
        RedrivePolicy::parse(self.0.get("RedrivePolicy")?)
    }

    /// Validates and merges `given` (name → value) into `self`. `creating`
    /// allows `FifoQueue`, which cannot change afterwards.
    pub fn apply(&mut self, given: &BTreeMap<String, String>, creating: bool, fifo: bool) -> Result<(), SqsError> {
        for (name, value) in given {
            if let Some((_, min, max, _)) = NUMERIC.iter().find(|(n, ..)| n == name) {
                match value.parse::<u32>() {
                    Ok(v) if (*min..=*max).contains(&v) => {}
                    _ => {
                        return Err(SqsError::invalid_attribute_value(format!(
                            "Invalid value for the parameter {name}: must be an integer from {min} to {max}."
                        )));
                    }
                }
            } else {
                match name.as_str() {
                    "FifoQueue" => {
                        if !creating {
                            return Err(SqsError::invalid_attribute_name(
                                "FifoQueue cannot be changed after creation.",
                            ));
                        }
                        if value != "true" && value != "false" {
                            return Err(SqsError::invalid_attribute_value("FifoQueue must be true or false."));
                        }
                        if (value == "true") != fifo {
                            return Err(SqsError::invalid_parameter_value(
                                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or \
                                 underscores, must end with .fifo suffix and be 1 to 80 in length.",
                            ));
                        }
                    }
                    "ContentBasedDeduplication" => {
                        if !fifo {
                            return Err(SqsError::invalid_attribute_name(
                                "ContentBasedDeduplication is only for FIFO queues.",
                            ));
                        }
                        if value != "true" && value != "false" {
                            return Err(SqsError::invalid_attribute_value(
                                "ContentBasedDeduplication must be true or false.",
                            ));
                        }
                    }
                    "RedrivePolicy" => {
                        if !value.is_empty() {
                            match RedrivePolicy::parse(value) {
                                Some(p) if (1..=1000).contains(&p.max_receive_count) => {}
                                _ => {
                                    return Err(SqsError::invalid_attribute_value(
                                        "Value for parameter RedrivePolicy is invalid: it must be JSON with \
                                         deadLetterTargetArn and maxReceiveCount (1 to 1000).",
                                    ));
                                }
                            }
                        }
                    }
                    n if FIFO_CHOICES.iter().any(|(f, _)| *f == n) => {
                        let values = FIFO_CHOICES.iter().find(|(f, _)| *f == n).map_or(&[][..], |(_, v)| *v);
                        if !fifo {
                            return Err(SqsError::invalid_attribute_name(format!("Unknown Attribute {n}.")));
                        }
                        if !values.contains(&value.as_str()) {
                            return Err(SqsError::invalid_attribute_value(format!(
                                "Invalid value for the parameter {n}: must be one of {}.",
                                values.join(", ")
                            )));
                        }
                    }
                    n if ACCEPTED.contains(&n) => {}
                    n if COMPUTED.contains(&n) => {
                        return Err(SqsError::invalid_attribute_name(format!("Attribute {n} is read-only.")));
                    }
                    n => return Err(SqsError::invalid_attribute_name(format!("Unknown Attribute {n}."))),
                }
            }
        }
        let mut merged = self.clone();
        for (name, value) in given {
            if value.is_empty() && (name == "RedrivePolicy" || ACCEPTED.contains(&name.as_str())) {
                merged.0.remove(name);
            } else if name == "RedrivePolicy" {
                // Kept in SQS's own form: maxReceiveCount a number.
                if let Some(p) = RedrivePolicy::parse(value) {
                    merged.0.insert(name.clone(), p.to_json());
                }
            } else {
                merged.0.insert(name.clone(), value.clone());
            }
        }
        if merged
            .0
            .get("FifoThroughputLimit")
            .is_some_and(|v| v == "perMessageGroupId")
            && merged.0.get("DeduplicationScope").is_none_or(|v| v != "messageGroup")
        {
            return Err(SqsError::invalid_attribute_value(
                "FifoThroughputLimit perMessageGroupId needs DeduplicationScope messageGroup.",
            ));
        }
        *self = merged;
        Ok(())
    }
}

/// Queue names: 1–80 of `[A-Za-z0-9_-]`, FIFO queues ending in `.fifo`.
pub fn validate_queue_name(name: &str, fifo: bool) -> Result<(), SqsError> {
    let stem = if fifo { name.strip_suffix(".fifo") } else { Some(name) };
    let ok = stem.is_some_and(super::requests::is_identifier) && name.len() <= 80;
    if !ok {
        return Err(SqsError::invalid_parameter_value(if fifo {
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end \
             with .fifo suffix and be 1 to 80 in length."
        } else {
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        }));
    }
    Ok(())
}
