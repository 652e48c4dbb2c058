//! `snakeCase`: `firstName` → `first_name`, `HTTPServer` → `http_server`;
//! nested objects too with `deep`.

use super::key_case::{Case, RenameKeys};

/// The `snakeCase` transformation.
pub type SnakeCase = RenameKeys<Snake>;

pub struct Snake;

impl Case for Snake {
    const KIND: &'static str = "snakeCase";

    fn rename(key: &str) -> Option<String> {
        key.chars().any(char::is_uppercase).then(|| to_snake_case(key))
    }
}

pub fn to_snake_case(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    let mut out = String::with_capacity(key.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|p| chars[p]);
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            let boundary =
                prev.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit() || (p.is_uppercase() && next_lower));
            if boundary {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
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
            ("firstName", "first_name"),
            ("HTTPServer", "http_server"),
            ("userID", "user_id"),
            ("already_snake", "already_snake"),
            ("A", "a"),
        ] {
            assert_eq!(to_snake_case(from), to, "{from}");
        }
    }

    #[test]
    fn shallow_and_deep() {
        let data = json!({"userName": "a", "homeAddress": {"zipCode": "1"}, "list": [{"itemId": 1}]});
        let shallow = SnakeCase::new(&CaseConfig { deep: false }).apply(Message::new(data.clone()));
        assert_eq!(
            shallow[0].data,
            json!({"user_name": "a", "home_address": {"zipCode": "1"}, "list": [{"itemId": 1}]})
        );
        let deep = SnakeCase::new(&CaseConfig { deep: true }).apply(Message::new(data));
        assert_eq!(
            deep[0].data,
            json!({"user_name": "a", "home_address": {"zip_code": "1"}, "list": [{"item_id": 1}]})
        );
    }

    /// A change event's `nulls` keeps its name, and with `deep` its keys
    /// follow `after`'s: the sink still finds the JSON nulls.
    #[test]
    fn a_change_events_json_nulls_follow_its_columns() {
        let event = json!({"op": "c", "after": {"userDoc": null}, "nulls": {"userDoc": "json"}});
        let shallow = SnakeCase::new(&CaseConfig { deep: false }).apply(Message::new(event.clone()));
        assert_eq!(shallow[0].data, event);
        let deep = SnakeCase::new(&CaseConfig { deep: true }).apply(Message::new(event));
        assert_eq!(
            deep[0].data,
            json!({"op": "c", "after": {"user_doc": null}, "nulls": {"user_doc": "json"}})
        );
    }

    #[test]
    fn keys_that_meet_under_one_name_keep_the_value_of_the_last_in_key_order() {
        let snake = SnakeCase::new(&CaseConfig { deep: false });
        // Uppercase sorts before '_' and lowercase: "userName" before
        // "user_name", "aB" before "a_b", "AB" before "ab".
        for (data, kept) in [
            (json!({"userName": 1, "user_name": 2}), json!({"user_name": 2})),
            (json!({"aB": 1, "a_b": 2, "c": 3}), json!({"a_b": 2, "c": 3})),
            (json!({"ab": 1, "AB": 2}), json!({"ab": 1})),
            (json!({"xY": 1, "x_y": 2, "X_Y": 3}), json!({"x_y": 2})),
        ] {
            assert_eq!(snake.apply(Message::new(data.clone()))[0].data, kept, "{data}");
        }
    }
}
