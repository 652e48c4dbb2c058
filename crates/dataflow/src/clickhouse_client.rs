//! What the ClickHouse source and sink share: a client of ClickHouse's HTTP
//! interface (queries in the request body, rows as `JSONEachRow`) that
//! connects only where the egress policy permits, and the classification of
//! ClickHouse's errors. Tested against Debian's clickhouse-server 18.16.1,
//! so it uses nothing newer: no query parameters, no `input()`.
//!
//! The connection string is an HTTP URL, `http[s]://user:password@host:8123/database`;
//! the user defaults to `default` and the database to `default`. Names are
//! quoted by the PostgreSQL rules (`crate::sql::quote`): ClickHouse reads
//! double-quoted identifiers the same way.

use std::time::Duration;

use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

use crate::ConnectorError;
use crate::budget::{Allowance, Held};
use crate::component::check_target;
use crate::egress::{Answer, CONNECT_WINDOW, EgressPolicy, connecting, http_endpoint, read_answer, read_answer_held};

/// Longest a query may take before the connector retries it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest answer read: a source's batch of rows as `JSONEachRow`.
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Most of an answer to the connect probe read: `1`, or an exception.
const PROBE_ANSWER_BYTES: usize = 64 << 10;

/// ClickHouse error codes that mean the rows, not the server or the spec,
/// are at fault: retrying the same rows fails the same way. Each with its
/// name and what it means, the only words of an error passed on.
const DATA_CODES: &[(u32, &str, &str)] = &[
    (6, "CANNOT_PARSE_TEXT", "a value does not parse as its column's type"),
    (26, "CANNOT_PARSE_QUOTED_STRING", "a string value does not parse"),
    (27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "a row does not parse"),
    (38, "CANNOT_PARSE_DATE", "a value is not a date"),
    (41, "CANNOT_PARSE_DATETIME", "a value is not a date and time"),
    (53, "TYPE_MISMATCH", "a value does not fit its column's type"),
    (69, "ARGUMENT_OUT_OF_BOUND", "a value is out of range"),
    (
        70,
        "CANNOT_CONVERT_TYPE",
        "a value cannot be converted to its column's type",
    ),
    (72, "CANNOT_PARSE_NUMBER", "a value is not a number"),
    (117, "INCORRECT_DATA", "the data is not valid"),
    (131, "TOO_LARGE_STRING_SIZE", "a string is too long"),
];

/// Codes that mean the spec names something wrong (an unknown table or
/// column, a refused login, a bad statement): no retry can help.
const CONFIG_CODES: &[(u32, &str, &str)] = &[
    (16, "NO_SUCH_COLUMN_IN_TABLE", "no such column in the table"),
    (47, "UNKNOWN_IDENTIFIER", "a column or identifier is not known"),
    (60, "UNKNOWN_TABLE", "no such table"),
    (62, "SYNTAX_ERROR", "the statement does not parse"),
    (81, "UNKNOWN_DATABASE", "no such database"),
    (192, "UNKNOWN_USER", "no such user"),
    (193, "WRONG_PASSWORD", "wrong password"),
    (194, "REQUIRED_PASSWORD", "the user needs a password"),
    (
        195,
        "IP_ADDRESS_NOT_ALLOWED",
        "the user may not log in from this address",
    ),
    (497, "ACCESS_DENIED", "the user may not do this"),
    (516, "AUTHENTICATION_FAILED", "wrong user or password"),
];

/// Codes worth retrying that users meet.
const RETRY_CODES: &[(u32, &str, &str)] = &[
    (159, "TIMEOUT_EXCEEDED", "the query took too long"),
    (202, "TOO_MANY_SIMULTANEOUS_QUERIES", "the server runs too many queries"),
    (241, "MEMORY_LIMIT_EXCEEDED", "the server ran out of memory"),
    (252, "TOO_MANY_PARTS", "inserts come faster than the server merges them"),
];

/// Checks a `connectionString` as the API and the webhook do.
pub fn check_connection_string(dsn: &str) -> Result<(), String> {
    if dsn.starts_with("clickhouse://") || dsn.starts_with("tcp://") {
        return Err("sless speaks ClickHouse's HTTP interface: use http://user:password@host:8123/database".into());
    }
    http_endpoint(dsn).map(drop).map_err(str::to_owned)
}

/// The rules of a ClickHouse source or sink: a valid `connectionString`
/// (or its secret), and a `table` (or its secret) where one is needed.
pub fn check(
    dsn: (&Option<String>, &Option<SecretRef>),
    table: Option<(&Option<String>, &Option<SecretRef>)>,
    path: &str,
    errors: &mut ValidationErrors,
) {
    check_target(dsn, table, path, errors);
    if let Some(dsn) = dsn.0.as_deref().filter(|d| !d.is_empty())
        && let Err(reason) = check_connection_string(dsn)
    {
        errors.push(FieldError::invalid(format!("{path}.connectionString"), reason));
    }
}

/// A ClickHouse server and database, reached over HTTP.
pub struct ClickHouse {
    http: reqwest::Client,
    /// `scheme://host:port/`, without the user, the password or a path.
    endpoint: reqwest::Url,
    database: String,
    user: String,
    password: String,
}

impl ClickHouse {
    /// Connects and checks that the login works and the database exists.
    pub async fn connect(dsn: &str, egress: &EgressPolicy) -> Result<Self, ConnectorError> {
        check_connection_string(dsn).map_err(|e| ConnectorError::Config(format!("connectionString {e}")))?;
        let parsed =
            reqwest::Url::parse(dsn).map_err(|_| ConnectorError::Config("connectionString is not a URL".into()))?;
        let decode = |s: &str| {
            form_urlencoded::parse(format!("v={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let user = match parsed.username() {
            "" => "default".to_owned(),
            user => decode(user),
        };
        let password = parsed.password().map(decode).unwrap_or_default();
        let database = match parsed.path().trim_matches('/') {
            "" => "default".to_owned(),
            db => decode(db),
        };
        let mut endpoint = parsed.clone();
        endpoint.set_path("/");
        endpoint.set_query(None);
        endpoint.set_fragment(None);
        // Only the URL's own credentials field carries them; they are sent
        // as basic auth and never appear in an error.
        let _ = endpoint.set_username("");
        let _ = endpoint.set_password(None);
        let http = egress
            .http_client(endpoint.as_str(), REQUEST_TIMEOUT)
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(format!("connectionString {m}")),
                other => other,
            })?;
        let client = Self {
            http,
            endpoint,
            database,
            user,
            password,
        };
        // Within the connect window, whatever the endpoint does.
        connecting(CONNECT_WINDOW, client.probe(), unreachable).await?;
        Ok(client)
    }

    /// `SELECT 1`, which only ClickHouse answers as ClickHouse does: `1`,
    /// or an error with its exception code. Any other answer is as if none
    /// came, so what else listens there is not told apart from nothing.
    async fn probe(&self) -> Result<(), ConnectorError> {
        let response = self.post(&[], "SELECT 1".to_owned()).await?;
        // A redirect or a long answer is not ClickHouse's either.
        let answer = read_answer(response, PROBE_ANSWER_BYTES, "ClickHouse")
            .await
            .map_err(|_| unreachable())?;
        match (answer.status.is_success(), exception_code(&answer.body)) {
            (true, _) if answer.body.trim_ascii() == b"1" => Ok(()),
            (false, Some(code)) => Err(classify_code(code)),
            _ => Err(unreachable()),
        }
    }

    /// Runs `sql` (sent as the body) and returns what the server answered.
    pub async fn query(&self, sql: &str) -> Result<String, ConnectorError> {
        // 64-bit integers as JSON numbers, as every other source gives them.
        self.send(&[("output_format_json_quote_64bit_integers", "0")], sql.to_owned())
            .await
    }

    /// Runs `INSERT … FORMAT JSONEachRow` with `rows` (one JSON object per
    /// line) as its data; keys that are no column are skipped.
    pub async fn insert(&self, statement: &str, rows: String) -> Result<(), ConnectorError> {
        self.send(&[("query", statement), ("input_format_skip_unknown_fields", "1")], rows)
            .await
            .map(drop)
    }

    /// As [`Self::query`], the answer's bytes held of `memory` until the
    /// [`Held`] drops: while the answer is read and parsed.
    pub async fn query_held(&self, sql: &str, memory: &Allowance) -> Result<(String, Held), ConnectorError> {
        let params = [("output_format_json_quote_64bit_integers", "0")];
        let response = self.post(&params, sql.to_owned()).await?;
        let (answer, held) = read_answer_held(response, MAX_ANSWER_BYTES, "ClickHouse", memory).await?;
        Ok((text_of(answer)?, held))
    }

    async fn send(&self, params: &[(&str, &str)], body: String) -> Result<String, ConnectorError> {
        let response = self.post(params, body).await?;
        text_of(read_answer(response, MAX_ANSWER_BYTES, "ClickHouse").await?)
    }

    async fn post(&self, params: &[(&str, &str)], body: String) -> Result<reqwest::Response, ConnectorError> {
        let mut url = self.endpoint.clone();
        url.query_pairs_mut()
            .append_pair("database", &self.database)
            .extend_pairs(params);
        self.http
            .post(url)
            .basic_auth(&self.user, Some(&self.password))
            .body(body)
            .send()
            .await
            .map_err(|e| {
                tracing::info!(error = %e.without_url(), "ClickHouse request failed");
                unreachable()
            })
    }
}

fn unreachable() -> ConnectorError {
    ConnectorError::Connect("the ClickHouse server cannot be reached or did not answer as ClickHouse".into())
}

/// A successful answer's text, or the error an error answer stands for.
fn text_of(answer: Answer) -> Result<String, ConnectorError> {
    if answer.status.is_success() {
        String::from_utf8(answer.body.into())
            .map_err(|_| ConnectorError::Transient("ClickHouse answered with text that is not UTF-8".into()))
    } else {
        Err(classify(answer.status.as_u16(), &answer.body))
    }
}

/// The error a ClickHouse error answer stands for. Its text is the remote
/// server's and is not passed on: the error names the exception's code,
/// and what it means where the code is known.
fn classify(status: u16, body: &[u8]) -> ConnectorError {
    match exception_code(body) {
        Some(code) => classify_code(code),
        None => ConnectorError::Transient(format!("ClickHouse answered HTTP {status} without an exception code")),
    }
}

/// The exception code of an error answer: "Code: N, e.displayText() = …".
fn exception_code(body: &[u8]) -> Option<u32> {
    body.strip_prefix(b"Code: ")
        .and_then(|rest| {
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            std::str::from_utf8(&rest[..digits]).ok()
        })
        .and_then(|digits| digits.parse::<u32>().ok())
}

/// The error a ClickHouse exception code stands for.
fn classify_code(code: u32) -> ConnectorError {
    let named = |table: &[(u32, &'static str, &'static str)]| table.iter().find(|(c, ..)| *c == code).copied();
    let described = |known: Option<(u32, &str, &str)>| match known {
        Some((_, name, meaning)) => format!("ClickHouse error {code} ({name}): {meaning}"),
        None => format!("ClickHouse error {code}"),
    };
    if let Some(known) = named(DATA_CODES) {
        ConnectorError::Data(described(Some(known)))
    } else if let Some(known) = named(CONFIG_CODES) {
        ConnectorError::Config(described(Some(known)))
    } else {
        ConnectorError::Transient(described(named(RETRY_CODES)))
    }
}

/// A ClickHouse string literal of `text`.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_code_and_name_only_the_code() {
        let e = classify(
            500,
            b"Code: 27, e.displayText() = DB::Exception: Cannot parse input: expected \" before: x (at row 1)\n, e.what() = DB::Exception\n",
        );
        assert!(
            matches!(&e, ConnectorError::Data(m) if m == "ClickHouse error 27 (CANNOT_PARSE_INPUT_ASSERTION_FAILED): a row does not parse"),
            "{e:?}"
        );
        assert!(matches!(
            classify(
                404,
                b"Code: 60, e.displayText() = DB::Exception: Table default.x doesn't exist., e.what() = DB::Exception"
            ),
            ConnectorError::Config(m) if m == "ClickHouse error 60 (UNKNOWN_TABLE): no such table"
        ));
        assert!(matches!(
            classify(500, b"Code: 241, e.displayText() = DB::Exception: Memory limit"),
            ConnectorError::Transient(m) if m == "ClickHouse error 241 (MEMORY_LIMIT_EXCEEDED): the server ran out of memory"
        ));
        assert!(matches!(
            classify(500, b"Code: 999999, secret text"),
            ConnectorError::Transient(m) if m == "ClickHouse error 999999"
        ));
        // Whatever a server that is not ClickHouse says stays out.
        let e = classify(502, b"<html>internal admin page: root password hunter2</html>");
        assert!(
            matches!(&e, ConnectorError::Transient(m) if m == "ClickHouse answered HTTP 502 without an exception code"),
            "{e:?}"
        );
        let long = format!("Code: 6, e.displayText() = DB::Exception: {}", "x".repeat(10_000));
        assert!(classify(500, long.as_bytes()).to_string().len() < 120);
    }

    #[test]
    fn literals_cannot_break_out() {
        assert_eq!(literal("it's"), "'it\\'s'");
        assert_eq!(literal("a\\' OR 1=1 --"), "'a\\\\\\' OR 1=1 --'");
        assert_eq!(literal("2026-01-01 00:00:00"), "'2026-01-01 00:00:00'");
    }

    #[test]
    fn only_http_connection_strings() {
        assert!(check_connection_string("http://u:p@ch.example:8123/db").is_ok());
        assert!(check_connection_string("https://ch.example").is_ok());
        assert!(
            check_connection_string("clickhouse://ch.example:9000")
                .unwrap_err()
                .contains("HTTP interface")
        );
        assert!(check_connection_string("ch.example:8123").is_err());
    }
}
