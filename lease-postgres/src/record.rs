//! The lease row: its table, the one definition of a well-formed row (in
//! SQL, for the statements' guards, and in Rust, for the answers), and the
//! statements of acquire, renew, release and read.

use std::time::Duration;

use lease_core::{
    Error, Fence, HolderId, Holding, LeaseKey, LeaseState, Payload, TtlRule, MAX_PAYLOAD_LEN,
};
use tokio_postgres::Row;

use crate::function::{qualifier, Statement};

/// The schema marker every row this crate writes carries in `format`.
pub(crate) const FORMAT: &str = "lease-postgres/1";
/// The TTLs accepted, in milliseconds.
pub(crate) const MIN_TTL_MS: i64 = 1_000;
pub(crate) const MAX_TTL_MS: i64 = 86_400_000;

/// TTLs in whole milliseconds, from 1 s to 1 day.
pub(crate) const TTL_RULE: TtlRule = TtlRule::new(
    Duration::from_millis(MIN_TTL_MS as u64)..=Duration::from_millis(MAX_TTL_MS as u64),
)
.rounded_to(Duration::from_millis(1));

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The statements of one table, built once (the table name is validated
/// before it is spliced in).
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) table: String,
    pub(crate) audit: String,
    pub(crate) channel: String,
    /// The whole migration: `tables`, then the statements' functions.
    pub(crate) migrate: String,
    /// The tables' part of the migration.
    pub(crate) tables: String,
    pub(crate) acquire: Statement,
    /// A renewal that stores a new payload.
    pub(crate) renew: Statement,
    /// A renewal that keeps the payload (the keeper's): no payload to
    /// compare, so no notification to decide.
    pub(crate) extend: Statement,
    pub(crate) release: Statement,
    pub(crate) read: Statement,
}

/// How far beyond the server's now a deadline may lie, in TTLs. A deadline
/// is written as `now() + ttl`, so one TTL is all a steady clock allows; the
/// second TTL tolerates a server clock stepped back by up to one TTL (the
/// deadlines written before the step then lie further ahead). Anything
/// beyond is a row no writer of this crate left: a bad restore, a manual
/// edit, another program.
pub(crate) const DEADLINE_TTLS: i64 = 2;

/// The checks of a well-formed row `t`, in order, each with what is wrong
/// when it fails (naming the column). A check may assume the ones before it
/// passed (they run in order inside `CASE`), and never fails with an error
/// on any value of its columns: a row must be judged, not refused.
fn checks(t: &str) -> [(String, String); 7] {
    [
        (
            format!("`format` is not the schema marker {FORMAT}"),
            format!("{t}.format = '{FORMAT}'"),
        ),
        (
            "`fence` is outside 1..=9223372036854775806".into(),
            format!("{t}.fence BETWEEN 1 AND 9223372036854775806"),
        ),
        (
            format!("`ttl_ms` is outside {MIN_TTL_MS}..={MAX_TTL_MS}"),
            format!("{t}.ttl_ms BETWEEN {MIN_TTL_MS} AND {MAX_TTL_MS}"),
        ),
        (
            format!("`payload` is longer than {MAX_PAYLOAD_LEN} bytes"),
            format!("octet_length({t}.payload) <= {MAX_PAYLOAD_LEN}"),
        ),
        (
            "`holder` is not a holder id (1 to 128 printable ASCII characters, no space)".into(),
            // Not `~ '^[!-~]{1,128}$'`: PostgreSQL's regex engine unrolls a
            // counted repetition into as many states, and matching it cost a
            // read more than the rest of the statement (~55 µs a row).
            format!(
                "{t}.holder IS NULL OR (char_length({t}.holder) BETWEEN 1 AND 128 \
                 AND {t}.holder ~ '^[!-~]+$')"
            ),
        ),
        (
            "`expires_at` is set on a row without a holder, or missing on a row with one".into(),
            format!("({t}.holder IS NULL) = ({t}.expires_at IS NULL)"),
        ),
        (
            format!(
                "`expires_at` is not a finite time, or lies more than {DEADLINE_TTLS} TTLs \
                 beyond the server's clock (a deadline is set to now() + ttl)"
            ),
            format!(
                "{t}.expires_at IS NULL OR (isfinite({t}.expires_at) AND {t}.expires_at \
                 <= now() + {span})",
                span = millis_sql(&format!("{t}.ttl_ms * {DEADLINE_TTLS}"))
            ),
        ),
    ]
}

/// The server's clock in milliseconds × 1000: the least fence a new grant
/// gets. `extract` answers `numeric`, and `numeric * integer` is not an
/// operator of `pg_catalog` (an operator of that signature created on the
/// search path would be chosen), so the factor is `numeric` too.
pub(crate) const CLOCK_FENCE: &str =
    "(floor(extract(epoch FROM now()) * 1000::numeric)::bigint * 1000)";

/// The interval of `ms` milliseconds (a `bigint` expression). Cast to
/// `float8` first: `float8 * interval` is an operator of `pg_catalog`,
/// which a search path sees first unless it names `pg_catalog` later,
/// while `bigint * interval` is not, so an operator of that exact signature
/// created in a schema on the search path would be chosen over it.
fn millis_sql(ms: &str) -> String {
    format!("(({ms})::float8 * interval '1 millisecond')")
}

/// The number (from 1) of the first check of [`checks`] that row `t`
/// fails, or NULL for a well-formed row. One expression serves both the
/// guards and the answer, and the messages stay on this side: a
/// statement sent as text is parsed and planned on every call, so its
/// length is paid for each time.
fn failed_check(t: &str) -> String {
    let mut sql = String::from("(CASE");
    for (i, (_, check)) in checks(t).iter().enumerate() {
        sql.push_str(&format!(" WHEN ({check}) IS NOT TRUE THEN {}", i + 1));
    }
    sql.push_str(" END)");
    sql
}

/// `t` is a well-formed lease row: every check of [`checks`] passes.
pub(crate) fn well_formed(t: &str) -> String {
    format!("({} IS NULL)", failed_check(t))
}

/// What is wrong with a row that failed check number `n` of [`checks`].
fn what_is_wrong(n: i32) -> String {
    usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| checks("t").into_iter().nth(i))
        .map_or_else(|| format!("check {n} failed"), |(wrong, _)| wrong)
}

/// The stored columns a statement carries from its write to its answer.
fn row_columns(t: &str) -> String {
    format!("{t}.key, {t}.format, {t}.holder, {t}.fence, {t}.ttl_ms, {t}.expires_at, {t}.payload")
}

/// The columns every statement answers with, read by [`Answer::from_row`],
/// with `outcome` (an SQL expression) first.
fn answer(outcome: &str, t: &str) -> String {
    // The remaining time is computed only for a finite deadline (subtracting
    // from `infinity` is an error, and a row must be judged, not refused);
    // it is read only from a well-formed row.
    format!(
        "{outcome} AS outcome, {failed} AS failed_check, {t}.holder, {t}.fence, {t}.ttl_ms, \
         {t}.payload, \
         CASE WHEN isfinite({t}.expires_at) THEN {remaining} END AS remaining_ms, \
         coalesce({t}.holder IS NOT NULL AND {t}.expires_at > now(), false) AS live",
        failed = failed_check(t),
        remaining = remaining_ms(&format!("{t}.expires_at"), "now()"),
    )
}

/// The whole milliseconds from `now` until the finite deadline `expires`
/// (both `timestamptz` expressions), at least 0, rounded down: a holder
/// told it has one millisecond more than it has could write after the
/// server has let the grant go.
///
/// In exact `numeric` arithmetic, on purpose. The `float8` of `date_part`
/// answers a millisecond short for some exact spans (and only a nudge
/// before `floor` fixes that), for about half a microsecond less of the
/// server's time per read out of the eleven its function takes, measured.
fn remaining_ms(expires: &str, now: &str) -> String {
    format!(
        "greatest(0, floor((extract(epoch FROM {expires}) - extract(epoch FROM {now})) \
         * 1000::numeric))::bigint"
    )
}

/// The answer's columns for row `t`, under the outcome `outcome`.
pub(crate) fn answer_columns(outcome: &str, t: &str) -> String {
    answer(&format!("'{outcome}'::text"), t)
}

impl Sql {
    pub(crate) fn new(table: &str) -> Sql {
        let audit = format!("{table}_audit");
        let channel = format!("{}_changed", table.replace('.', "_"));
        let wf = well_formed("t");
        let clock_fence = CLOCK_FENCE;
        let tables = format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n\
             key text PRIMARY KEY,\n\
             format text NOT NULL,\n\
             holder text,\n\
             fence bigint NOT NULL,\n\
             ttl_ms bigint NOT NULL,\n\
             expires_at timestamptz,\n\
             payload bytea NOT NULL,\n\
             last_break jsonb\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {audit} (\n\
             seq bigserial PRIMARY KEY,\n\
             key text NOT NULL,\n\
             at timestamptz NOT NULL DEFAULT now(),\n\
             record jsonb NOT NULL\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {idx} ON {audit} (key, seq);",
            idx = format!("{}_key_seq", audit.replace('.', "_"))
                .rsplit('.')
                .next()
                .unwrap_or("audit_key_seq"),
        );
        let written = row_columns("t");
        // The answer: the row `up` wrote (a CTE returning `row_columns`),
        // as `done`; or, when it wrote nothing, the key's row as the
        // statement's snapshot shows it, as `other` (no row: no answer).
        // The answer's columns are computed once, over both.
        let answer_of = |done: &str, other: &str| {
            format!(
                "SELECT {cols} FROM (\
                   SELECT '{done}'::text AS outcome, {up} FROM up \
                   UNION ALL \
                   SELECT '{other}'::text, {written} FROM {table} t \
                   WHERE t.key = $1 AND NOT EXISTS (SELECT 1 FROM up)) r",
                cols = answer("r.outcome", "r"),
                up = row_columns("up"),
            )
        };
        // A `pg_notify` in RETURNING runs once for each row written, and
        // its notification is delivered at commit.
        let notify = format!("pg_notify('{channel}', t.key)");
        // Our own live grant, whose answer was lost: the same fence, never
        // a shorter TTL (a grant of that term whose answer did arrive
        // counts its deadline, and its renewals, from its own) and never an
        // earlier expiry.
        let ours = "t.holder = EXCLUDED.holder AND t.expires_at > now()";
        // $1 key, $2 holder, $3 ttl_ms, $4 payload.
        let acquire = format!(
            "WITH up AS (\
               INSERT INTO {table} AS t (key, format, holder, fence, ttl_ms, expires_at, payload) \
               VALUES ($1, '{FORMAT}', $2, {clock_fence}, $3, now() + {ttl}, $4) \
               ON CONFLICT (key) DO UPDATE SET \
                 holder = EXCLUDED.holder, \
                 fence = CASE WHEN {ours} THEN t.fence \
                              ELSE greatest(t.fence + 1, EXCLUDED.fence) END, \
                 ttl_ms = CASE WHEN {ours} THEN greatest(t.ttl_ms, EXCLUDED.ttl_ms) \
                               ELSE EXCLUDED.ttl_ms END, \
                 expires_at = CASE WHEN {ours} \
                                   THEN greatest(t.expires_at, now() + {longer}) \
                                   ELSE EXCLUDED.expires_at END, \
                 payload = EXCLUDED.payload \
               WHERE {wf} AND (t.holder IS NULL OR t.expires_at <= now() OR t.holder = EXCLUDED.holder) \
               RETURNING {written}, {notify}) \
             {answer}",
            answer = answer_of("granted", "held"),
            ttl = millis_sql("$3"),
            longer = millis_sql("greatest(t.ttl_ms, EXCLUDED.ttl_ms)"),
        );
        // A renewal's guard: our term, still live, well-formed.
        let ours_live = format!(
            "t.key = $1 AND t.holder = $2 AND t.fence = $3 AND t.expires_at > now() AND {wf}"
        );
        // Never earlier than stored: `now()` is the statement's start, and
        // one that waited for the row (a lock, a stall) may land after a
        // later renewal of the same grant.
        let deadline = format!(
            "expires_at = greatest(t.expires_at, now() + {})",
            millis_sql("t.ttl_ms")
        );
        // $1 key, $2 holder, $3 fence, $4 payload.
        // A renewal that stores a new payload notifies the watchers; one that
        // stores the same one does not. `was` reads the row as the statement's
        // snapshot shows it, before the update: only renewals of one grant
        // racing each other can make it stale, and then a waiter still
        // re-reads within its idle bound.
        let renew = format!(
            "WITH up AS (\
               UPDATE {table} AS t SET {deadline}, payload = $4 \
               WHERE {ours_live} \
               RETURNING {written}), \
             n AS (SELECT pg_notify('{channel}', up.key) FROM up, {table} was \
                   WHERE was.key = up.key AND was.payload IS DISTINCT FROM up.payload) \
             {answer}, (SELECT count(*) FROM n) AS notified",
            answer = answer_of("renewed", "other"),
        );
        // $1 key, $2 holder, $3 fence.
        let extend = format!(
            "WITH up AS (\
               UPDATE {table} AS t SET {deadline} \
               WHERE {ours_live} \
               RETURNING {written}) \
             {answer}",
            answer = answer_of("renewed", "other"),
        );
        // $1 key, $2 holder, $3 fence.
        let release = format!(
            "WITH up AS (\
               UPDATE {table} AS t SET holder = NULL, expires_at = NULL, payload = '\\x'::bytea \
               WHERE t.key = $1 AND t.holder = $2 AND t.fence = $3 AND {wf} \
               RETURNING {written}, {notify}) \
             {answer}",
            answer = answer_of("released", "other"),
        );
        let read = format!(
            "SELECT {cols} FROM {table} t WHERE t.key = $1",
            cols = answer_columns("read", "t")
        );
        let acquire = Statement::new("acquire", &["text", "text", "bigint", "bytea"], acquire);
        let renew = Statement::new("renew", &["text", "text", "bigint", "bytea"], renew);
        let extend = Statement::new("extend", &["text", "text", "bigint"], extend);
        let release = Statement::new("release", &["text", "text", "bigint"], release);
        let read = Statement::reading("read", &["text"], read);
        // For a migration tool of the user's: in the table's schema when
        // the name gives one, else in the first schema of the search path,
        // where the tables are created too.
        let schema = table
            .split_once('.')
            .map_or(String::new(), |(s, _)| qualifier(s));
        let mut migrate = tables.clone();
        for s in [&acquire, &renew, &extend, &release, &read] {
            migrate.push('\n');
            migrate.push_str(&s.create_in(&schema));
        }
        Sql {
            tables,
            table: table.to_string(),
            audit,
            channel,
            migrate,
            acquire,
            renew,
            extend,
            release,
            read,
        }
    }
}

impl Sql {
    /// The operations' statements.
    pub(crate) fn statements(&self) -> [&Statement; 5] {
        [
            &self.acquire,
            &self.renew,
            &self.extend,
            &self.release,
            &self.read,
        ]
    }
}

/// One answer row.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) outcome: String,
    /// The number of the first check of [`checks`] the row fails; None for
    /// a well-formed row.
    pub(crate) failed_check: Option<i32>,
    pub(crate) holder: Option<String>,
    pub(crate) fence: i64,
    pub(crate) ttl_ms: i64,
    pub(crate) payload: Vec<u8>,
    pub(crate) remaining_ms: Option<i64>,
    pub(crate) live: bool,
}

impl Answer {
    pub(crate) fn from_row(key: &LeaseKey, row: &Row) -> Result<Answer, Error> {
        let bad = |e: tokio_postgres::Error| {
            Error::corrupt(
                key,
                format!("a column of the lease row has an unexpected type: {e}"),
            )
        };
        Ok(Answer {
            outcome: row.try_get("outcome").map_err(bad)?,
            failed_check: row.try_get("failed_check").map_err(bad)?,
            holder: row.try_get("holder").map_err(bad)?,
            fence: row.try_get("fence").map_err(bad)?,
            ttl_ms: row.try_get("ttl_ms").map_err(bad)?,
            payload: row.try_get("payload").map_err(bad)?,
            remaining_ms: row.try_get("remaining_ms").map_err(bad)?,
            live: row.try_get("live").map_err(bad)?,
        })
    }

    /// The state this row stands for; a malformed row is
    /// [`Error::CorruptRecord`], never free.
    pub(crate) fn state(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        if let Some(n) = self.failed_check {
            return Err(Error::corrupt(
                key,
                format!(
                    "the row in the lease table is not a well-formed {FORMAT} record: {}; it \
                     is left as it is: break the lease to replace it",
                    what_is_wrong(n)
                ),
            ));
        }
        let Some(holder) = self.holder.as_deref().filter(|_| self.live) else {
            return Ok(LeaseState::Free);
        };
        let holder = HolderId::new(holder)
            .map_err(|e| Error::corrupt(key, format!("the row's holder: {e}")))?;
        let payload = Payload::new(self.payload.clone())
            .map_err(|e| Error::corrupt(key, format!("the row's payload: {e}")))?;
        let fence = u64::try_from(self.fence)
            .map_err(|_| Error::corrupt(key, format!("the row's fence {}", self.fence)))?;
        let ttl = self
            .ttl()
            .ok_or_else(|| Error::corrupt(key, format!("the row's ttl_ms {}", self.ttl_ms)))?;
        let remaining = self
            .remaining_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis)
            .map(|r| r.min(ttl));
        Ok(LeaseState::Held(
            Holding::new(holder, Fence(fence), ttl, payload).with_remaining(remaining),
        ))
    }

    pub(crate) fn ttl(&self) -> Option<Duration> {
        u64::try_from(self.ttl_ms).ok().map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::remaining_ms;

    /// Microsecond spans from a deadline's "now": every edge of a whole
    /// millisecond near zero, a day and two days (where the server carries
    /// whole days into the interval's day field), already passed ones, and
    /// a spread up to ten years.
    fn spans() -> Vec<i64> {
        const DAY: i64 = 86_400_000_000;
        let mut spans: Vec<i64> = (-3_000..=3_000).collect();
        for ms in (1..=5_000).chain((1..=2_880).map(|m| m * 60_000)) {
            spans.extend([-1, 0, 1, 499, 500, 501, 999].map(|d| ms * 1_000 + d));
        }
        for day in [DAY, 2 * DAY] {
            spans.extend(day - 3_000..=day + 3_000);
        }
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..100_000_u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let range: u64 = if i % 10 == 0 {
                3_650 * 86_400_000_000
            } else {
                3 * 86_400_000_000
            };
            spans.push(i64::try_from(x % range).expect("in range") - 3_600_000_000);
        }
        spans
    }

    /// The remaining time is exactly the whole milliseconds left: never one
    /// more (time the holder does not have), never one less.
    #[tokio::test]
    async fn the_remaining_time_is_the_exact_whole_milliseconds_left() {
        let url = lease_testkit::harness::postgres::url();
        let client = lease_testkit::harness::postgres::admin(&url).await;
        let now = UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_457);
        let spans = spans();
        let deadlines: Vec<SystemTime> = spans
            .iter()
            .map(|&us| {
                let d = Duration::from_micros(us.unsigned_abs());
                if us < 0 {
                    now - d
                } else {
                    now + d
                }
            })
            .collect();
        let sql = format!(
            "SELECT {} FROM unnest($1::timestamptz[]) WITH ORDINALITY AS u(e, i) ORDER BY i",
            remaining_ms("u.e", "$2::timestamptz")
        );
        let rows = client
            .query(&sql, &[&deadlines, &now])
            .await
            .expect("the remaining times");
        assert_eq!(rows.len(), spans.len());
        let mut wrong = Vec::new();
        for (us, row) in spans.iter().zip(&rows) {
            let got: i64 = row.get(0);
            let exact = us.div_euclid(1_000).max(0);
            if got != exact {
                wrong.push((us, got, exact));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} of {} spans answered wrong, (µs, answered, exact): {:?}",
            wrong.len(),
            spans.len(),
            &wrong[..wrong.len().min(10)]
        );
    }
}
