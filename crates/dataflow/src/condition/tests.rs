//! The grammar, the evaluation and the bounds of conditions.

use serde_json::json;

use super::*;

fn eval(c: &str, data: &Value) -> bool {
    Condition::parse(c).unwrap_or_else(|e| panic!("{c}: {e}")).eval(data)
}

#[test]
fn truthiness_as_upstream() {
    let d = json!({"t": true, "f": false, "z": 0, "n": null, "e": "", "s": "false", "x": "yes", "o": {}, "one": 1});
    for (path, expected) in [
        ("t", true),
        ("f", false),
        ("z", false),
        ("n", false),
        ("e", false),
        ("s", false),
        ("x", true),
        ("o", true),
        ("one", true),
        ("missing", false),
        ("$.t", true),
    ] {
        assert_eq!(eval(path, &d), expected, "{path}");
    }
}

#[test]
fn comparisons_and_logic() {
    let d = json!({"kind": "order", "amount": 120.5, "code": "200", "user": {"age": 30}, "items": [{"sku": "a"}]});
    for (c, expected) in [
        ("kind == 'order'", true),
        ("$.kind == \"order\"", true),
        ("kind != 'order'", false),
        ("amount > 100", true),
        ("amount <= 100", false),
        ("code == 200", true),
        ("user.age >= 30 && kind == 'order'", true),
        ("user.age < 18 || items[0].sku == 'a'", true),
        ("!(amount > 100)", false),
        ("missing == 1", false),
        ("missing != 1", true),
        ("kind > 5", false),
        ("kind < 'p'", true),
    ] {
        assert_eq!(eval(c, &d), expected, "{c}");
    }
}

/// Where upstream compares the texts of a number and a quoted literal
/// ("1.5" against "1.50": no match), sless compares their numbers: 1.5 is
/// the same number however a producer wrote it (docs/transformations.md).
#[test]
fn a_quoted_literal_and_a_number_compare_as_numbers() {
    let d = json!({"v": 1.5, "price": "1.50", "n": 100, "big": 1e2});
    for (c, expected) in [
        ("$.v == '1.50'", true),
        ("v == \"1.5\"", true),
        ("v != '1.50'", false),
        ("price == 1.5", true),
        ("n == '1e2'", true),
        ("big == 100", true),
        ("v == '1.5x'", false),
        ("v == '1.51'", false),
    ] {
        assert_eq!(eval(c, &d), expected, "{c}");
    }
}

#[test]
fn long_chains_and_runs_of_not_are_flat() {
    let d = json!({"a": 1});
    let chain = vec!["a"; MAX_TERMS].join(" && ");
    assert!(eval(&chain, &d));
    let Condition::All(members) = Condition::parse(&chain).unwrap() else {
        panic!("a chain of && is one node");
    };
    assert_eq!(members.len(), MAX_TERMS);
    // Far more `!` than any stack would take if each were a call.
    let nots = format!("{}a", "!".repeat(MAX_LENGTH - 1));
    assert_eq!(
        Condition::parse(&nots).unwrap(),
        Condition::Not(Box::new(Condition::parse("a").unwrap()))
    );
    assert!(!eval(&format!("{}a", "!".repeat(1001)), &d));
    assert!(eval(&format!("{}a", "!".repeat(1000)), &d));
    assert!(eval("a != 2 && !(a == 2)", &d));
}

#[test]
fn what_a_tenant_can_store_is_bounded() {
    let nested = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
    assert!(eval(&nested(MAX_DEPTH), &json!({"a": 1})));
    assert_eq!(Condition::parse(&nested(MAX_DEPTH + 1)), Err(ConditionError::TooDeep));
    // What crashed the process: 520 parentheses, 1,600 `!` with them.
    assert_eq!(Condition::parse(&nested(520)), Err(ConditionError::TooDeep));
    assert_eq!(
        Condition::parse(&format!("{}(a)", "!(".repeat(800))),
        Err(ConditionError::TooDeep)
    );
    let chain = vec!["a"; MAX_TERMS + 1].join(" && ");
    assert_eq!(Condition::parse(&chain), Err(ConditionError::TooManyTerms));
    let huge = vec!["a"; 20_000].join(" && ");
    assert_eq!(Condition::parse(&huge), Err(ConditionError::TooLong(huge.len())));
    for e in [
        ConditionError::TooDeep,
        ConditionError::TooManyTerms,
        ConditionError::TooLong(5000),
    ] {
        assert!(e.to_string().contains("condition"), "{e}");
    }
}

#[test]
fn syntax_errors_are_named() {
    for bad in ["", "a ==", "a == 'x", "(a", "a == b c", "a..b", "== 1", "a == nope"] {
        assert!(Condition::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn gjson_array_queries_counts_and_indices() {
    let d = json!({"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 5}], "tags": [], "n": 3});
    for (c, expected) in [
        ("items.#(qty>2)", true),
        ("items.#(qty>9)", false),
        ("items.#(qty>2).sku == 'b'", true),
        ("items.#(sku=='a').qty == 1", true),
        ("items.#(sku == 'a' && qty > 0)", true),
        ("items.# == 2", true),
        ("items.# > 2", false),
        ("tags.# == 0", true),
        ("n.# == 0", false),
        ("items.1.sku == 'b'", true),
        ("!items.#(qty>2) || n == 3", true),
    ] {
        assert_eq!(eval(c, &d), expected, "{c}");
    }
    for bad in ["items.#(qty>2", "items.#(qty>2)x", "items.#()"] {
        assert!(Condition::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_quoted_literal_equals_a_number_or_boolean_as_upstream_compares_text() {
    let d = json!({"level": 5, "ok": true, "price": "12.5"});
    for (c, expected) in [
        ("level == '5'", true),
        ("level != '5'", false),
        ("level == '6'", false),
        ("ok == 'true'", true),
        ("price > 10", true),
        ("level >= '5'", true),
    ] {
        assert_eq!(eval(c, &d), expected, "{c}");
    }
}

#[test]
fn array_queries_nest_within_the_depth_and_term_bounds() {
    let nested = |levels: usize| (0..levels).fold("a".to_owned(), |inner, _| format!("x.#({inner})"));
    assert!(Condition::parse(&nested(MAX_DEPTH)).is_ok());
    assert_eq!(Condition::parse(&nested(MAX_DEPTH + 1)), Err(ConditionError::TooDeep));
    let many = format!("items.#({})", vec!["a"; MAX_TERMS].join(" && "));
    assert_eq!(Condition::parse(&many), Err(ConditionError::TooManyTerms));
}
