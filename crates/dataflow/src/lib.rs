//! The DataFlow runtime (seed 001): messages, the field path and condition
//! grammar, the components (sources, transformations, sinks: one file each,
//! listed in `registry`), and the pipeline that runs them with at-least-once
//! delivery, in `sless dev` or as `sless processor`.

pub mod avro;
pub mod budget;
pub mod checkpoint;
pub mod clickhouse_client;
pub mod component;
pub mod condition;
pub mod context;
pub mod egress;
#[cfg(feature = "nessie")]
pub mod iceberg_rows;
#[cfg(feature = "kafka")]
pub mod kafka_client;
pub mod message;
pub mod metrics;
#[cfg(feature = "nessie")]
pub mod nessie_client;
pub mod path;
pub mod pipeline;
pub mod processor;
pub mod registry;
#[cfg(feature = "nessie")]
pub mod s3;
pub mod sinks;
pub mod sources;
mod sql;
pub mod sqs_client;
pub mod supervisor;
pub mod tls;
pub mod transforms;
#[cfg(feature = "trino")]
pub mod trino_client;

/// The table a tenant's exactly-once PostgreSQL sinks keep positions in.
pub use sql::positions::table_name as positions_table;

/// A connector's failure, split by whether retrying can help.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectorError {
    /// The spec cannot work as written.
    #[error("{0}")]
    Config(String),
    /// The backend is unreachable or broke the connection: retry.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection a connector holds is gone (the server restarted or
    /// dropped it): retrying on it cannot help, the pipeline must connect
    /// again.
    #[error("connection lost: {0}")]
    Closed(String),
    /// The data was refused (a constraint, a type): retrying the same data
    /// fails again, so it goes to the error sink.
    #[error("data refused: {0}")]
    Data(String),
    /// Any other failure, which retrying may mend (a statement the server
    /// could not run now, an answer cut short): retry.
    #[error("{0}")]
    Transient(String),
    /// The pipeline was stopped while it waited to retry: nothing of the
    /// step was committed.
    #[error("stopped")]
    Stopped,
}

/// A checkpoint store failure: retrying may help.
fn store_error(e: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::Transient(format!("checkpoint store: {e}"))
}

impl ConnectorError {
    /// Whether the pipeline stops on it (to be connected again by its
    /// supervisor) instead of retrying: the spec cannot work, or a
    /// connection it holds is gone.
    pub(crate) fn ends_run(&self) -> bool {
        matches!(self, Self::Config(_) | Self::Closed(_))
    }

    /// The server's own answer (a refused login, say) reaches the tenant;
    /// network-level detail (refused, timed out, reset) stays in the log.
    /// One text for every way a database server is not reached (refused,
    /// silent, another protocol), so that errors tell no port from another.
    fn unreachable_database() -> Self {
        Self::Connect("the database server cannot be reached or did not complete the connection".into())
    }

    fn connect(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => Self::Connect(db.message().to_owned()),
            None => {
                tracing::info!(error = %e, "PostgreSQL connection failed");
                Self::unreachable_database()
            }
        }
    }

    /// SQLSTATE classes 22 (data exception) and 23 (integrity constraint)
    /// are the data's fault; others are transient or configuration.
    fn query(e: tokio_postgres::Error) -> Self {
        match e.code().map(|c| c.code().to_owned()) {
            Some(code) if code.starts_with("22") || code.starts_with("23") => Self::Data(
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            ),
            Some(code) if code.starts_with("42") => Self::Config(
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            ),
            _ if e.is_closed() => Self::Closed(e.to_string()),
            _ => Self::Transient(
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
            ),
        }
    }
}
