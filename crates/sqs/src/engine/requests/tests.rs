//! Parsing of typed requests: types, presence, batches.

use serde_json::json;

use super::*;

fn queue_request(action: &str, input: Value) -> Result<(String, QueueRequest), SqsError> {
    match Request::parse(action, &input)? {
        Request::OnQueue(name, request) => Ok((name, request)),
        _ => panic!("{action} is an action on a queue"),
    }
}

#[test]
fn numbers_come_as_json_numbers_or_as_text() {
    for input in [
        json!({"QueueUrl": "http://h/acme/q", "MaxNumberOfMessages": 7}),
        json!({"QueueUrl": "http://h/acme/q", "MaxNumberOfMessages": "7"}),
    ] {
        let Ok((name, QueueRequest::ReceiveMessage(r))) = queue_request("ReceiveMessage", input) else {
            panic!("a receive");
        };
        assert_eq!(name, "q");
        assert_eq!(r.max().unwrap(), 7);
    }
}

#[test]
fn a_wrongly_typed_parameter_is_named_in_the_error() {
    for (input, path) in [
        (
            json!({"QueueUrl": "u", "MaxNumberOfMessages": -1}),
            "MaxNumberOfMessages",
        ),
        (json!({"QueueUrl": "u", "WaitTimeSeconds": "soon"}), "WaitTimeSeconds"),
        (
            json!({"QueueUrl": "u", "MaxNumberOfMessages": 1.5}),
            "MaxNumberOfMessages",
        ),
        (json!({"QueueUrl": "u", "AttributeNames": "All"}), "AttributeNames"),
    ] {
        let Err(e) = queue_request("ReceiveMessage", input) else {
            panic!("{path} refused");
        };
        assert_eq!(e.code, "InvalidParameterValue");
        assert!(e.message.contains(path), "{}", e.message);
    }
    let Err(e) = queue_request("SendMessage", json!({"QueueUrl": 5})) else {
        panic!("a number is no URL");
    };
    assert!(e.message.contains("QueueUrl"), "{}", e.message);
}

#[test]
fn a_rejected_value_is_echoed_only_in_part() {
    let huge = "x".repeat(100_000);
    let Err(e) = queue_request("ReceiveMessage", json!({"QueueUrl": "u", "WaitTimeSeconds": huge})) else {
        panic!("refused");
    };
    assert!(e.message.len() < 2 * MAX_ECHO + 100, "{}", e.message.len());
}

#[test]
fn a_missing_queue_is_reported_before_anything_else() {
    let Err(e) = Request::parse("SendMessageBatch", &json!({"Entries": "not a list"})) else {
        panic!("refused");
    };
    assert_eq!(e.code, "MissingParameter");
    assert!(e.message.contains("QueueUrl"));
}

#[test]
fn query_protocol_nulls_are_empty() {
    let Ok((_, QueueRequest::GetQueueAttributes(r))) =
        queue_request("GetQueueAttributes", json!({"QueueUrl": "u", "AttributeNames": null}))
    else {
        panic!("parsed");
    };
    assert!(r.attribute_names.is_empty());
}

#[test]
fn batch_rules() {
    let entries = |n: usize| {
        (0..n)
            .map(|i| json!({"Id": format!("e{i}"), "ReceiptHandle": "r"}))
            .collect::<Vec<_>>()
    };
    let parse = |entries: Vec<Value>| queue_request("DeleteMessageBatch", json!({"QueueUrl": "u", "Entries": entries}));
    assert_eq!(parse(vec![]).err().unwrap().shape, "EmptyBatchRequest");
    assert_eq!(parse(entries(11)).err().unwrap().shape, "TooManyEntriesInBatchRequest");
    assert!(parse(entries(10)).is_ok());
    let same = vec![json!({"Id": "a"}), json!({"Id": "a"})];
    assert_eq!(parse(same).err().unwrap().shape, "BatchEntryIdsNotDistinct");
    for bad in ["", "a b", &"x".repeat(81)] {
        assert_eq!(
            parse(vec![json!({"Id": bad})]).err().unwrap().shape,
            "InvalidBatchEntryId"
        );
    }
}

#[test]
fn attribute_values_may_be_numbers_or_booleans() {
    let Request::CreateQueue(r) = Request::parse(
        "CreateQueue",
        &json!({"QueueName": "q", "Attributes": {"DelaySeconds": 5, "FifoQueue": true}}),
    )
    .unwrap() else {
        panic!("a create");
    };
    assert_eq!(r.attributes["DelaySeconds"], "5");
    assert_eq!(r.attributes["FifoQueue"], "true");
}

#[test]
fn an_unknown_action_is_refused() {
    let Err(e) = Request::parse("LaunchRocket", &json!({"QueueUrl": "u"})) else {
        panic!("refused");
    };
    assert_eq!(e.shape, "InvalidAction");
}

/// The protocol's list of actions (which the gateway's metrics name) is
/// exactly what the engine serves: each is parsed (whatever else is wrong
/// with an empty input), and a name outside it is an invalid action.
#[test]
fn the_protocols_actions_are_the_ones_served() {
    let invalid = |action: &str| matches!(Request::parse(action, &json!({})), Err(e) if e.shape == SqsError::invalid_action(String::new()).shape);
    for action in crate::protocol::ACTIONS {
        assert!(!invalid(action), "{action} is listed but not served");
    }
    assert!(crate::protocol::ACTIONS.contains(&PEEK_ACTION));
    assert!(invalid("SendMessages"));
}
