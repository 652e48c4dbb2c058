//! The dataflow connectors from outside the crate: the PostgreSQL source
//! and sink against the local PostgreSQL, and the HTTP connectors (SQS,
//! ClickHouse, the schema registry) against hostile servers on loopback,
//! and the Trino connectors against a real Trino.
//! One binary, linking the dataflow crate alone.

mod hostile_http;
mod nessie;
mod postgres;
mod trino;
