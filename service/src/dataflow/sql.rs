//! PostgreSQL plumbing shared by the source and the sink: connecting and
//! quoting identifiers that come from a spec.

use tokio_postgres::NoTls;

use super::ConnectorError;

/// Connects and drives the connection in the background.
pub async fn connect(connection_string: &str) -> Result<tokio_postgres::Client, ConnectorError> {
    let (client, connection) = tokio_postgres::connect(connection_string, NoTls)
        .await
        .map_err(ConnectorError::connect)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// `name` or `schema.name`, each part `[A-Za-z_][A-Za-z0-9_]*`, quoted.
pub fn quote(name: &str) -> Result<String, ConnectorError> {
    let parts: Vec<&str> = name.split('.').collect();
    let valid = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| valid(p)) {
        return Err(ConnectorError::Config(format!(
            "{name:?} is not a table or column name ([A-Za-z_][A-Za-z0-9_]*, optionally schema.name)"
        )));
    }
    Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoting_refuses_injection() {
        assert_eq!(super::quote("orders").unwrap(), "\"orders\"");
        assert_eq!(super::quote("dwh.orders_2").unwrap(), "\"dwh\".\"orders_2\"");
        for bad in ["", "a.b.c", "x; drop table y", "1abc", "a\"b"] {
            assert!(super::quote(bad).is_err(), "{bad}");
        }
    }
}
