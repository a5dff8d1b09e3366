//! The fence check inside the user's own PostgreSQL transaction, so the data
//! write and the check commit or abort together.

use std::fmt;

use lease_core::Fence;

use crate::Stale;

/// The fences table every process writing the same database shares: one
/// row per resource, holding the highest fence admitted for it.
pub const DEFAULT_TABLE: &str = "lease_fences";

/// Fences kept in a PostgreSQL table, checked inside the caller's transaction.
///
/// [`admit`](PgFences::admit) raises the resource's fence in the caller's
/// transaction, or refuses a fence below it with [`Stale`]. It must be the
/// transaction's **first statement**, before any read the write depends on,
/// not merely before the write: a newer holder that reads first and admits
/// after computes its write from a state that lacks the older holder's last
/// accepted update (still uncommitted when it read), and overwrites it —
/// a read-modify-write that loses an accepted update. Admitted first, it
/// waits for the older transaction to end and then reads its update. The
/// fence row stays locked until the transaction ends, so
/// a concurrent writer at another fence waits, then sees this one's outcome
/// — if this transaction commits, a lower fence is refused after it; if it
/// aborts, nothing of it remains, fence included. A holder paused past its
/// lease finds, when it wakes, the new holder's fence committed, and its
/// transaction is refused before it writes anything.
///
/// The table is created by [`migrate`](PgFences::migrate) (or by running
/// [`migration`](PgFences::migration) in your own migrations):
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS lease_fences (
///     resource text PRIMARY KEY,
///     fence bigint NOT NULL CHECK (fence >= 0),
///     updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
/// )
/// ```
///
/// Under `READ COMMITTED` (PostgreSQL's default) a writer that waited for
/// the row re-reads it and is admitted or refused on the committed fence.
/// Under `REPEATABLE READ` or `SERIALIZABLE` it gets a serialization
/// failure instead (SQLSTATE 40001) and retries its transaction, as any
/// transaction there must.
#[derive(Clone, PartialEq, Eq)]
pub struct PgFences {
    table: String,
}

/// A table name that is not a plain (optionally schema-qualified) SQL
/// identifier.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a table name: use letters, digits and _ (not first), optionally schema.table, 63 bytes a part at most")]
pub struct InvalidTable(pub String);

/// Why [`PgFences::admit`] did not admit the fence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgFenceError {
    /// The resource already admitted a higher fence; roll the transaction
    /// back (nothing of this writer's may commit).
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The fence does not fit PostgreSQL's `bigint`.
    #[error("fence {0} is above the largest bigint")]
    FenceTooLarge(Fence),
    /// The stored fence is negative: the row was written outside this
    /// library. It is left as it is.
    #[error("the fences table holds {stored} for {resource:?}, which is not a fence")]
    Corrupt {
        /// The resource.
        resource: String,
        /// The value stored.
        stored: i64,
    },
    /// PostgreSQL refused or failed the statement (a serialization failure
    /// among them); the transaction should be rolled back.
    #[error("postgres")]
    Postgres(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Default for PgFences {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
        }
    }
}

impl fmt::Debug for PgFences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgFences")
            .field("table", &self.table)
            .finish()
    }
}

impl PgFences {
    /// Fences in the table [`DEFAULT_TABLE`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Fences in `table` (`name` or `schema.name`).
    ///
    /// # Errors
    /// [`InvalidTable`] unless each part is an unquoted SQL identifier.
    pub fn with_table(table: &str) -> Result<Self, InvalidTable> {
        let valid = |part: &str| {
            let mut bytes = part.bytes();
            part.len() <= 63
                && bytes
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        let parts: Vec<&str> = table.split('.').collect();
        if parts.len() <= 2 && parts.iter().all(|p| valid(p)) {
            Ok(Self {
                table: table.to_owned(),
            })
        } else {
            Err(InvalidTable(table.to_owned()))
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The statement that creates the table if it does not exist, for your
    /// own migrations.
    pub fn migration(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    resource text PRIMARY KEY,\n    fence bigint NOT NULL CHECK (fence >= 0),\n    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()\n)",
            self.table
        )
    }

    /// The upsert: raises the fence unless the stored one is higher, and
    /// returns the fence admitted (no row when refused).
    fn admit_sql(&self) -> String {
        format!(
            "INSERT INTO {t} AS f (resource, fence) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = clock_timestamp() \
             WHERE f.fence <= EXCLUDED.fence RETURNING fence",
            t = self.table
        )
    }

    /// After a refusal: the fence that refused it (the row is locked by
    /// this transaction, so this is the committed value).
    fn seen_sql(&self) -> String {
        format!("SELECT fence FROM {} WHERE resource = $1", self.table)
    }
}

fn bigint(fence: Fence) -> Result<i64, PgFenceError> {
    i64::try_from(fence.get()).map_err(|_| PgFenceError::FenceTooLarge(fence))
}

fn refused(resource: &str, offered: Fence, seen: Option<i64>) -> PgFenceError {
    match seen {
        Some(stored) => match u64::try_from(stored) {
            Ok(seen) => PgFenceError::Stale(Stale {
                resource: resource.to_owned(),
                offered,
                seen: Fence(seen),
            }),
            Err(_) => PgFenceError::Corrupt {
                resource: resource.to_owned(),
                stored,
            },
        },
        // Refused, yet no row: only a row written outside the library
        // (NULL fence is impossible under the CHECK; a deleted row is) can
        // get here. Report what the stored state allows us to say.
        None => PgFenceError::Corrupt {
            resource: resource.to_owned(),
            stored: -1,
        },
    }
}

#[cfg(feature = "postgres")]
mod tokio_pg {
    use super::*;
    use tokio_postgres::{GenericClient, Transaction};

    fn pg(e: tokio_postgres::Error) -> PgFenceError {
        PgFenceError::Postgres(Box::new(e))
    }

    impl PgFences {
        /// Creates the table if it does not exist.
        ///
        /// # Errors
        /// PostgreSQL's.
        pub async fn migrate(
            &self,
            client: &impl GenericClient,
        ) -> Result<(), tokio_postgres::Error> {
            client.batch_execute(&self.migration()).await
        }

        /// Admits `fence` for `resource` inside `tx`, or refuses it. Call it
        /// as the transaction's first statement, before anything the write
        /// reads: see [`PgFences`] for the update a later admission loses.
        ///
        /// One statement when admitted; a second, to name the fence that
        /// refused it, when refused.
        ///
        /// ```no_run
        /// # async fn f(client: &mut tokio_postgres::Client, lease: &lease_keeper::Lease) -> Result<(), Box<dyn std::error::Error>> {
        /// use lease_fence::postgres::PgFences;
        ///
        /// let fences = PgFences::new();
        /// let tx = client.transaction().await?;
        /// // First: before the read below, so it sees every update accepted before.
        /// fences.admit(&tx, "orders", lease.fence()).await?; // refused: nothing below runs
        /// let row = tx.query_one("SELECT total FROM totals WHERE id = 1", &[]).await?;
        /// let total: i64 = row.get(0);
        /// tx.execute("UPDATE totals SET total = $1 WHERE id = 1", &[&(total + 42)]).await?;
        /// tx.commit().await?; // the write and the fence commit together
        /// # Ok(())
        /// # }
        /// ```
        ///
        /// # Errors
        /// [`PgFenceError::Stale`] when a higher fence was admitted
        /// (roll back); [`PgFenceError::FenceTooLarge`],
        /// [`PgFenceError::Corrupt`], [`PgFenceError::Postgres`].
        ///
        /// # Cancel safety
        ///
        /// As the transaction's own statements: dropped mid-way, roll the
        /// transaction back (dropping it does).
        pub async fn admit(
            &self,
            tx: &Transaction<'_>,
            resource: &str,
            fence: Fence,
        ) -> Result<(), PgFenceError> {
            let value = bigint(fence)?;
            let admitted = tx
                .query_opt(&self.admit_sql(), &[&resource, &value])
                .await
                .map_err(pg)?;
            if admitted.is_some() {
                return Ok(());
            }
            let seen = tx
                .query_opt(&self.seen_sql(), &[&resource])
                .await
                .map_err(pg)?
                .map(|row| row.try_get::<_, i64>(0))
                .transpose()
                .map_err(pg)?;
            Err(refused(resource, fence, seen))
        }
    }
}

#[cfg(feature = "sqlx")]
mod sqlx_pg {
    use super::*;

    fn pg(e: sqlx::Error) -> PgFenceError {
        PgFenceError::Postgres(Box::new(e))
    }

    impl PgFences {
        /// Creates the table if it does not exist, through sqlx.
        ///
        /// # Errors
        /// sqlx's.
        pub async fn migrate_sqlx(&self, conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
            sqlx::raw_sql(&self.migration())
                .execute(conn)
                .await
                .map(|_| ())
        }

        /// [`admit`](PgFences::admit) for an sqlx transaction: admits
        /// `fence` for `resource` in `tx`, or refuses it — as the
        /// transaction's first statement, before anything the write reads.
        ///
        /// ```no_run
        /// # async fn f(pool: &sqlx::PgPool, fence: lease_core::Fence) -> Result<(), Box<dyn std::error::Error>> {
        /// let fences = lease_fence::postgres::PgFences::new();
        /// let mut tx = pool.begin().await?;
        /// fences.admit_sqlx(&mut tx, "orders", fence).await?; // first
        /// // … then the reads the write depends on, then the write
        /// sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(42_i64).execute(&mut *tx).await?;
        /// tx.commit().await?;
        /// # Ok(())
        /// # }
        /// ```
        ///
        /// # Errors
        /// As [`admit`](PgFences::admit).
        ///
        /// # Cancel safety
        ///
        /// As the transaction's own statements: dropped mid-way, roll the
        /// transaction back (dropping it does).
        pub async fn admit_sqlx(
            &self,
            tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
            resource: &str,
            fence: Fence,
        ) -> Result<(), PgFenceError> {
            let value = bigint(fence)?;
            let admitted: Option<i64> = sqlx::query_scalar(&self.admit_sql())
                .bind(resource)
                .bind(value)
                .fetch_optional(&mut **tx)
                .await
                .map_err(pg)?;
            if admitted.is_some() {
                return Ok(());
            }
            let seen: Option<i64> = sqlx::query_scalar(&self.seen_sql())
                .bind(resource)
                .fetch_optional(&mut **tx)
                .await
                .map_err(pg)?;
            Err(refused(resource, fence, seen))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(PgFences::new().table(), "lease_fences");
        assert!(PgFences::with_table("ops.fences_2").is_ok());
        for bad in [
            "",
            "1x",
            "a-b",
            "a.b.c",
            "x; DROP TABLE y",
            "\"q\"",
            &"a".repeat(64),
        ] {
            assert!(PgFences::with_table(bad).is_err(), "{bad:?}");
        }
        assert!(PgFences::new()
            .migration()
            .starts_with("CREATE TABLE IF NOT EXISTS lease_fences ("));
    }

    #[test]
    fn a_fence_above_bigint_is_an_error_not_a_wrap() {
        assert!(matches!(
            bigint(Fence(u64::MAX)),
            Err(PgFenceError::FenceTooLarge(_))
        ));
        assert_eq!(bigint(Fence(7)).ok(), Some(7));
        assert!(matches!(
            refused("r", Fence(1), Some(-3)),
            PgFenceError::Corrupt { stored: -3, .. }
        ));
        match refused("r", Fence(1), Some(5)) {
            PgFenceError::Stale(s) => assert_eq!((s.offered, s.seen), (Fence(1), Fence(5))),
            other => panic!("{other:?}"),
        }
    }
}
