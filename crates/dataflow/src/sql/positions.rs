//! Where an exactly-once PostgreSQL sink keeps its source's position: a
//! table of the tenant's own in the target's schema,
//! `sless_positions_<digest of the tenant>`, one row per dataflow and target
//! table, each position sealed with the tenant's key
//! ([`crate::context::PositionsKey`]).
//!
//! On a database several tenants share, another tenant's dataflow could
//! otherwise read the table, overwrite a row (the flow then resumes past
//! rows it never delivered) or make the table first with another shape.
//! So no dataflow may name a positions table (refused when the spec is
//! checked, and again when a table named through a secret is opened), a
//! row whose seal is not the tenant's is refused with its reason, and the
//! table is used only with the shape this module gives it.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::quote;
use crate::ConnectorError;
use crate::context::{PipelineContext, PositionsKey};

/// The names of positions tables begin with this.
const PREFIX: &str = "sless_positions_";
/// The table of earlier releases, one for every tenant; never read (its
/// rows carry no seal), and reserved like the others.
const SHARED: &str = "sless_dataflow_positions";

/// Whether `text` (a table name, schema-qualified or not, or a query)
/// names a positions table, whatever its case or quoting.
pub fn names_positions(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains(PREFIX.trim_end_matches('_')) || lower.contains(SHARED)
}

/// The positions table of `tenant` (what [`PipelineContext::tenant`] is).
pub fn table_name(tenant: &str) -> String {
    format!(
        "{PREFIX}{}",
        sless_runtime::hex::encode(&Sha256::digest(tenant.as_bytes())[..8])
    )
}

/// The refusal of a table that names a positions table.
pub fn reserved(name: &str) -> String {
    format!(
        "{name:?} names a table the platform keeps exactly-once positions in ({PREFIX}*); such tables \
         are not a dataflow's to read or write"
    )
}

/// The columns of a positions table, as `format_type` names their types;
/// each `NOT NULL`, `dataflow` the primary key alone.
const SHAPE: [(&str, &str); 4] = [
    ("dataflow", "text"),
    ("position", "text"),
    ("seal", "text"),
    ("written_at", "timestamp with time zone"),
];

/// One dataflow's row in its tenant's positions table.
pub(crate) struct PositionRow {
    /// The table, quoted.
    table: String,
    /// The row's key: the dataflow and its target table.
    key: String,
    /// The upsert of the position, prepared when the position is first read.
    upsert: OnceLock<tokio_postgres::Statement>,
}

impl PositionRow {
    pub(crate) fn of(config_table: &str, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let name = table_name(ctx.tenant());
        let table = match config_table.split_once('.') {
            Some((schema, _)) => quote(&format!("{schema}.{name}"))?,
            None => quote(&name)?,
        };
        Ok(Self {
            table,
            key: format!("{} {config_table}", ctx.id),
            upsert: OnceLock::new(),
        })
    }

    /// Makes the table where there is none, checks its shape, and prepares
    /// the upsert.
    pub(crate) async fn prepare(&self, client: &tokio_postgres::Client) -> Result<(), ConnectorError> {
        let table = &self.table;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (dataflow text PRIMARY KEY, position text NOT NULL, \
                 seal text NOT NULL, written_at timestamptz NOT NULL DEFAULT now())"
            ))
            .await
            .map_err(|e| match ConnectorError::query(e) {
                ConnectorError::Config(reason) => ConnectorError::Config(format!(
                    "exactlyOnce keeps the source's position in {table}, which cannot be made: {reason} \
                     (grant CREATE, make the table, or set exactlyOnce to false)"
                )),
                other => other,
            })?;
        self.check_shape(client).await?;
        self.fence(client).await?;
        let upsert = client
            .prepare(&format!(
                "INSERT INTO {table} (dataflow, position, seal) VALUES ($1, $2, $3) ON CONFLICT (dataflow) \
                 DO UPDATE SET position = EXCLUDED.position, seal = EXCLUDED.seal, written_at = now()"
            ))
            .await
            .map_err(ConnectorError::query)?;
        let _ = self.upsert.set(upsert);
        Ok(())
    }

    /// One writer per position: the first processor of a dataflow holds a
    /// session lock on its row, and a second one (a replacement pod that
    /// Kubernetes starts while the deleted one is still stopping) waits
    /// until the first's connection ends. Without it both read the same
    /// position and wrote the same rows.
    async fn fence(&self, client: &tokio_postgres::Client) -> Result<(), ConnectorError> {
        let held: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
                &[&format!("{} {}", self.table, self.key)],
            )
            .await
            .map_err(ConnectorError::query)?
            .get(0);
        if held {
            return Ok(());
        }
        Err(ConnectorError::Closed(format!(
            "another processor of this dataflow still writes {}; waiting for it to stop",
            self.table
        )))
    }

    /// Refuses a table made by someone else: another shape, a view, rules,
    /// row-level security, triggers, or another owner than the sink's role
    /// (who could add any of those later), each of which could drop or
    /// change what is written.
    async fn check_shape(&self, client: &tokio_postgres::Client) -> Result<(), ConnectorError> {
        let table = &self.table;
        let columns: Vec<(String, String, bool)> = client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull FROM pg_attribute a \
                 WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                &[table],
            )
            .await
            .map_err(ConnectorError::query)?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let plain: bool = client
            .query_one(
                "SELECT c.relkind = 'r' AND NOT c.relhasrules AND NOT c.relrowsecurity \
                   AND pg_has_role(current_user, c.relowner, 'MEMBER') \
                   AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) \
                   AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary \
                     AND i.indnatts = 1 AND i.indkey[0] = 1) \
                 FROM pg_class c WHERE c.oid = $1::text::regclass",
                &[table],
            )
            .await
            .map_err(ConnectorError::query)?
            .get(0);
        let shaped = columns.len() == SHAPE.len()
            && columns
                .iter()
                .zip(SHAPE)
                .all(|((name, ty, not_null), (want, want_ty))| name == want && ty == want_ty && *not_null);
        if shaped && plain {
            return Ok(());
        }
        let found: Vec<String> = columns.iter().map(|(n, t, _)| format!("{n} {t}")).collect();
        Err(ConnectorError::Config(format!(
            "{table} is not a positions table as the platform makes it (found ({}){}); it was made or \
             changed by someone else: drop it, or set exactlyOnce to false",
            found.join(", "),
            if plain {
                ""
            } else {
                " with rules, row security, triggers or another key"
            }
        )))
    }

    /// The position stored for this dataflow, once its seal is checked.
    pub(crate) async fn read(
        &self,
        client: &tokio_postgres::Client,
        key: &PositionsKey,
    ) -> Result<Option<String>, ConnectorError> {
        let row = client
            .query_opt(
                &format!("SELECT position, seal FROM {} WHERE dataflow = $1", self.table),
                &[&self.key],
            )
            .await
            .map_err(ConnectorError::query)?;
        let Some(row) = row else { return Ok(None) };
        let (position, seal): (String, String) = (row.get(0), row.get(1));
        if !key.verify(&self.key, &position, &seal) {
            return Err(ConnectorError::Config(format!(
                "the position stored for this dataflow in {} does not carry its tenant's seal: it was written \
                 or changed by someone else, and resuming from it could skip rows; delete the row {:?} to \
                 read the source from its start, or set exactlyOnce to false",
                self.table, self.key
            )));
        }
        Ok(Some(position))
    }

    /// Stores `position`, sealed, in the transaction `client` has open;
    /// `false` until [`Self::prepare`] ran.
    pub(crate) async fn write(
        &self,
        client: &tokio_postgres::Client,
        key: &PositionsKey,
        position: &str,
    ) -> Result<bool, ConnectorError> {
        let Some(upsert) = self.upsert.get() else {
            return Ok(false);
        };
        let seal = key.seal(&self.key, position);
        client
            .execute(upsert, &[&self.key, &position, &seal])
            .await
            .map_err(ConnectorError::query)?;
        Ok(true)
    }

    pub(crate) fn is_prepared(&self) -> bool {
        self.upsert.get().is_some()
    }

    /// Deletes the row (the dataflow is deleted).
    pub(crate) async fn delete(&self, client: &tokio_postgres::Client) -> Result<(), ConnectorError> {
        match client
            .execute(&format!("DELETE FROM {} WHERE dataflow = $1", self.table), &[&self.key])
            .await
        {
            Ok(_) => Ok(()),
            // Never exactly once: there is no table.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(()),
            Err(e) => Err(ConnectorError::query(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names_positions;

    #[test]
    fn positions_tables_are_named_whatever_the_case_quoting_or_schema() {
        for named in [
            "sless_positions_0123456789abcdef",
            "sq.sless_positions_0123456789abcdef",
            "SLESS_POSITIONS_x",
            "sless_dataflow_positions",
            "sq.sless_dataflow_positions",
            "SELECT * FROM \"Sless_Positions_ab\" WHERE true",
        ] {
            assert!(names_positions(named), "{named}");
        }
        for other in ["orders", "sless_orders", "positions", "sless_position"] {
            assert!(!names_positions(other), "{other}");
        }
    }
}
