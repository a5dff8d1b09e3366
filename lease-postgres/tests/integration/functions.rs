//! The statements' server-side functions: created by the migration, called
//! by acquire, renew, release and read, and the statements' text serving a
//! table whose functions are missing or can no longer run.

use std::time::Duration;

use lease_core::{Error, HolderId, LeaseBackend, LeaseKey, Payload, Renewal};

use lease_postgres::PostgresConfig;

use crate::common::{admin, backend, fresh_config, unique, url};

/// The functions of `table` (`lease_<op>_<hash>` in its schema), by name.
async fn functions(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT proname::text FROM pg_proc WHERE proname LIKE 'lease\\_%' \
             AND pronamespace = 'public'::regnamespace ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The functions one table's migration creates: its `CREATE FUNCTION`s.
fn created_by(migration: &str) -> Vec<String> {
    let mut names: Vec<String> = migration
        .split("CREATE FUNCTION ")
        .skip(1)
        .filter_map(|s| s.split('(').next())
        .map(String::from)
        .collect();
    names.sort();
    names
}

/// Acquire, renew with a payload, read and release; the fences of two
/// terms rise.
async fn round_trip(b: &lease_postgres::PostgresBackend) {
    let key = LeaseKey::new(unique("f")).unwrap();
    let me = HolderId::random();
    let request = || {
        b.request(key.clone(), me.clone())
            .ttl(Duration::from_secs(60))
    };
    let g = b.try_acquire(request()).await.unwrap().granted().unwrap();
    let renewed = b
        .renew(&g, Some(Payload::new(b"p".to_vec()).unwrap()))
        .await
        .unwrap();
    assert!(matches!(renewed, Renewal::Renewed(_)), "{renewed:?}");
    let held = b.read(&key).await.unwrap();
    let holding = held.holding().expect("held after acquire");
    assert_eq!(holding.holder, me);
    assert_eq!(holding.payload.as_bytes(), b"p");
    b.release(&g).await.unwrap();
    assert!(b.read(&key).await.unwrap().is_free());
    let next = b.try_acquire(request()).await.unwrap().granted().unwrap();
    assert!(
        next.fence() > g.fence(),
        "{} then {}",
        g.fence(),
        next.fence()
    );
    b.release(&next).await.unwrap();
}

#[tokio::test]
async fn the_migration_creates_one_function_per_statement_and_operations_call_them() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mine = created_by(b.migration_sql());
    assert_eq!(mine.len(), 5, "{mine:?}");
    let client = admin(&url).await;
    let present = functions(&client).await;
    for f in &mine {
        assert!(present.contains(f), "{f} missing from {present:?}");
    }
    // A function that refuses to run shows that acquire calls it: the
    // statement's text would grant.
    let acquire = mine
        .iter()
        .find(|f| f.starts_with("lease_acquire_"))
        .expect("an acquire function");
    client
        .batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION {acquire}(text, text, bigint, bytea) RETURNS TABLE {ANSWER} LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'called'; END $$"
        ))
        .await
        .unwrap();
    let key = LeaseKey::new(unique("f")).unwrap();
    match b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
    {
        Err(Error::Backend(e)) => assert!(format!("{e:?}").contains("called"), "{e:?}"),
        other => panic!("acquire did not call its function: {other:?}"),
    }
    assert!(b.read(&key).await.unwrap().is_free());
    client
        .batch_execute(&format!(
            "DROP FUNCTION {acquire}(text, text, bigint, bytea)"
        ))
        .await
        .unwrap();
    round_trip(&b).await;
}

#[tokio::test]
async fn migrating_again_and_from_many_clients_at_once_is_harmless() {
    let url = url();
    let config = fresh_config();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (url, config) = (url.clone(), config.clone());
        tasks.spawn(async move { backend(&url, &config).await });
    }
    let clients = tasks.join_all().await;
    let b = &clients[0];
    b.migrate().await.expect("a second migration");
    let present = functions(&admin(&url).await).await;
    for f in created_by(b.migration_sql()) {
        assert_eq!(present.iter().filter(|p| **p == f).count(), 1, "{f}");
    }
    round_trip(b).await;
}

#[tokio::test]
async fn a_table_without_its_functions_is_served_by_the_statements() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let client = admin(&url).await;
    let drop_them = || async {
        for f in created_by(b.migration_sql()) {
            client
                .batch_execute(&format!("DROP FUNCTION {f}"))
                .await
                .unwrap();
        }
    };
    drop_them().await;
    round_trip(&b).await;
    // A migration brings them back, and the calls with them.
    b.migrate().await.unwrap();
    round_trip(&b).await;
    // A backend that never migrated, on a table created by hand without
    // the functions.
    let lazy = fresh_config();
    let tables_only = b
        .migration_sql()
        .split("DO $lease_do$")
        .next()
        .unwrap()
        .replace(&config.table, &lazy.table);
    client.batch_execute(&tables_only).await.unwrap();
    let lazy = lease_postgres::PostgresBackend::connect_lazy(&url, lazy).unwrap();
    round_trip(&lazy).await;
}

#[tokio::test]
async fn a_function_that_no_longer_matches_its_table_is_not_called() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    round_trip(&b).await;
    // The answer's `holder` column changes type: the functions' results,
    // declared `text`, no longer match what their statements return.
    admin(&url)
        .await
        .batch_execute(&format!(
            "ALTER TABLE {} ALTER COLUMN holder TYPE varchar",
            config.table
        ))
        .await
        .unwrap();
    round_trip(&b).await;
}

/// `url` with the database `db`.
fn in_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
    match query {
        Some(q) => format!("{server}/{db}?{q}"),
        None => format!("{server}/{db}"),
    }
}

/// A database of its own, for a test that changes what every session of
/// it sees (its operators, its languages).
async fn fresh_database(url: &str) -> String {
    let db = unique("db").replace(['/', '-', '.'], "_").to_lowercase();
    admin(url)
        .await
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    in_database(url, &db)
}

/// A role of its own that may create objects in the schema `public` of the
/// database at `url`: the attacker of a shared database.
async fn creating_role(url: &str) -> String {
    let role = unique("mallory")
        .replace(['/', '-', '.'], "_")
        .to_lowercase();
    admin(url)
        .await
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT CREATE ON SCHEMA public TO {role}"
        ))
        .await
        .unwrap();
    role
}

/// Two holders acquire one key: the second must be refused.
async fn one_grant_for_two(b: &lease_postgres::PostgresBackend) {
    let key = LeaseKey::new(unique("f")).unwrap();
    let first = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap();
    assert!(first.granted().is_some(), "the first acquire was refused");
    let second = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap();
    assert!(
        second.granted().is_none(),
        "two holders were granted one key"
    );
}

#[tokio::test]
async fn a_function_planted_under_its_name_by_another_role_is_never_called() {
    let url = fresh_database(&url()).await;
    let role = creating_role(&url).await;
    let config = fresh_config();
    let lazy = lease_postgres::PostgresBackend::connect_lazy(&url, config.clone()).unwrap();
    let acquire = created_by(lazy.migration_sql())
        .into_iter()
        .find(|f| f.starts_with("lease_acquire_"))
        .expect("an acquire function");
    // Grants every caller, with one fence.
    admin(&url)
        .await
        .batch_execute(&format!(
            "SET ROLE {role}; \
             CREATE FUNCTION {acquire}(text, text, bigint, bytea) RETURNS TABLE {ANSWER} LANGUAGE sql AS \
             $$ SELECT 'granted'::text, NULL::integer, $2, 42::bigint, $3, $4, $3, true $$; \
             RESET ROLE"
        ))
        .await
        .unwrap();
    match lease_postgres::PostgresBackend::connect(&url, config.clone()).await {
        Err(Error::Backend(e)) => assert!(e.to_string().contains(&acquire), "{e}"),
        other => panic!("the migration accepted a planted function: {other:?}"),
    }
    // A backend that never migrates checks before its first call.
    one_grant_for_two(&lazy).await;
}

#[tokio::test]
async fn an_operator_planted_on_the_search_path_does_not_change_deadlines() {
    let url = fresh_database(&url()).await;
    let role = creating_role(&url).await;
    // `bigint * interval` has no operator of its own in pg_catalog; this
    // one would make every TTL a hundred years.
    admin(&url)
        .await
        .batch_execute(&format!(
            "SET ROLE {role}; \
             CREATE FUNCTION public.long_ms(bigint, interval) RETURNS interval \
             LANGUAGE sql IMMUTABLE AS $$ SELECT interval '100 years' $$; \
             CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, \
             FUNCTION = public.long_ms); \
             RESET ROLE"
        ))
        .await
        .unwrap();
    for cache in [false, true] {
        let config = fresh_config().statement_cache(cache);
        let b = backend(&url, &config).await;
        let key = LeaseKey::new(unique("f")).unwrap();
        let g = b
            .try_acquire(
                b.request(key.clone(), HolderId::random())
                    .ttl(Duration::from_secs(5)),
            )
            .await
            .unwrap()
            .granted()
            .unwrap();
        let renewed = b.renew(&g, None).await.unwrap();
        assert!(matches!(renewed, Renewal::Renewed(_)), "{renewed:?}");
        let remaining = b
            .read(&key)
            .await
            .unwrap()
            .holding()
            .and_then(|h| h.remaining)
            .expect("a remaining time");
        assert!(remaining <= Duration::from_secs(5), "{remaining:?}");
        let left: i64 = admin(&url)
            .await
            .query_one(
                &format!(
                    "SELECT extract(epoch FROM expires_at - now())::bigint FROM {} WHERE key = $1",
                    config.table
                ),
                &[&key.as_str()],
            )
            .await
            .unwrap()
            .get(0);
        assert!(left <= 5, "the deadline lies {left} s ahead");
    }
}

#[tokio::test]
async fn a_server_without_plpgsql_is_served_by_the_statements() {
    let url = fresh_database(&url()).await;
    admin(&url)
        .await
        .batch_execute("DROP EXTENSION plpgsql")
        .await
        .unwrap();
    let b = backend(&url, &fresh_config()).await;
    round_trip(&b).await;
    one_grant_for_two(&b).await;
}

#[tokio::test]
async fn every_operation_calls_its_own_function() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let client = admin(&url).await;
    let names = created_by(b.migration_sql());
    let key = LeaseKey::new(unique("f")).unwrap();
    let me = HolderId::random();
    let g = b
        .try_acquire(
            b.request(key.clone(), me.clone())
                .ttl(Duration::from_secs(60)),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    for (op, args) in [
        ("renew", "text, text, bigint, bytea"),
        ("extend", "text, text, bigint"),
        ("release", "text, text, bigint"),
        ("read", "text"),
        ("acquire", "text, text, bigint, bytea"),
    ] {
        let name = names
            .iter()
            .find(|f| f.starts_with(&format!("lease_{op}_")))
            .unwrap_or_else(|| panic!("no {op} function in {names:?}"));
        client
            .batch_execute(&format!(
                "CREATE OR REPLACE FUNCTION {name}({args}) RETURNS TABLE {ANSWER} LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'called {op}'; END $$"
            ))
            .await
            .unwrap();
        let result = match op {
            "renew" => b
                .renew(&g, Some(Payload::new(b"p".to_vec()).unwrap()))
                .await
                .map(drop),
            "extend" => b.renew(&g, None).await.map(drop),
            "release" => b.release(&g).await,
            "read" => b.read(&key).await.map(drop),
            _ => b
                .try_acquire(b.request(key.clone(), me.clone()))
                .await
                .map(drop),
        };
        match result {
            Err(Error::Backend(e)) => {
                assert!(
                    format!("{e:?}").contains(&format!("called {op}")),
                    "{op}: {e:?}"
                )
            }
            other => panic!("{op} did not call its function: {other:?}"),
        }
        client
            .batch_execute(&format!("DROP FUNCTION {name}({args})"))
            .await
            .unwrap();
    }
    b.migrate().await.unwrap();
    round_trip(&b).await;
}

/// SQL run as `role`, which creates what it runs as its own.
async fn as_role(url: &str, role: &str, sql: &str) {
    admin(url)
        .await
        .batch_execute(&format!("SET ROLE {role}; {sql}; RESET ROLE"))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

/// The columns every function of the crate answers with.
const ANSWER: &str = "(outcome text, failed_check integer, holder text, fence bigint, \
                      ttl_ms bigint, payload bytea, remaining_ms bigint, live boolean)";

/// A PL/pgSQL body that fails the statement it is called from.
const HIJACKED: &str = "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'hijacked'; END $$";

#[tokio::test]
async fn operators_and_functions_planted_on_the_search_path_are_never_run() {
    let url = fresh_database(&url()).await;
    let role = creating_role(&url).await;
    // Each one matches, exactly, a call that would otherwise go to
    // pg_catalog through an implicit cast; every one fails if it runs.
    as_role(
        &url,
        &role,
        &format!(
            "CREATE FUNCTION public.hj_eq_class(oid, regclass) RETURNS boolean {HIJACKED}; \
             CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, \
                                       FUNCTION = public.hj_eq_class); \
             CREATE FUNCTION public.hj_eq_proc(oid, regprocedure) RETURNS boolean {HIJACKED}; \
             CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regprocedure, \
                                       FUNCTION = public.hj_eq_proc); \
             CREATE FUNCTION public.hj_mul(numeric, integer) RETURNS numeric {HIJACKED}; \
             CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, \
                                       FUNCTION = public.hj_mul); \
             CREATE FUNCTION public.convert_to(text, text) RETURNS bytea {HIJACKED}; \
             CREATE FUNCTION public.quote_ident(name) RETURNS text {HIJACKED}"
        ),
    )
    .await;
    let b = backend(&url, &fresh_config()).await;
    round_trip(&b).await;
    one_grant_for_two(&b).await;
    let key = LeaseKey::new(unique("f")).unwrap();
    let g = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    // The fence is the server's clock in milliseconds × 1000 at least.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        g.fence().get() >= (now_ms - 60_000) * 1000,
        "fence {}",
        g.fence()
    );
    let note = lease_core::BreakNote::new("ops", "planted objects");
    b.break_lease(&key, &note).await.expect("break");
    assert!(b.last_break(&key).await.expect("last break").is_some());
}

#[tokio::test]
async fn functions_of_our_names_elsewhere_on_the_search_path_are_never_called() {
    let url = fresh_database(&url()).await;
    // Named with its schema, so that neither the table nor its migration
    // goes to a schema planted ahead of it on the search path.
    let config = PostgresConfig::new(format!("public.{}", fresh_config().table));
    let unqualified = fresh_config();
    let b = backend(&url, &config).await;
    round_trip(&b).await;
    let b_unqualified = backend(&url, &unqualified).await;
    let role = creating_role(&url).await;
    let client = admin(&url).await;
    let user: String = client
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    // A schema named for the connecting role comes first on the default
    // search path ("$user", public).
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{user}\" AUTHORIZATION {role}"
        ))
        .await
        .unwrap();
    let sql = format!("{}\n{}", b.migration_sql(), b_unqualified.migration_sql());
    let mut planted = String::new();
    for s in created_by(&sql) {
        let args = sql
            .split(&format!("CREATE FUNCTION {s}("))
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap()
            .to_string();
        let s = s.trim_start_matches("\"public\".");
        planted.push_str(&format!(
            "CREATE FUNCTION \"{user}\".{s}({args}) RETURNS TABLE {ANSWER} {HIJACKED}; \
             CREATE FUNCTION public.{s}({args}, x integer DEFAULT 0) RETURNS TABLE {ANSWER} {HIJACKED}; "
        ));
    }
    as_role(&url, &role, planted.trim_end_matches("; ")).await;
    let again = backend(&url, &config).await;
    for b in [&b, &again, &b_unqualified] {
        round_trip(b).await;
        one_grant_for_two(b).await;
    }
    // A new client of the unqualified table now finds the planted schema
    // first, and in it functions of its names that are not ours.
    match lease_postgres::PostgresBackend::connect(&url, unqualified).await {
        Err(Error::Backend(e)) => {
            assert!(e.to_string().contains("not created by this crate"), "{e}")
        }
        other => panic!("a planted schema's functions were accepted: {other:?}"),
    }
}
