//! `lease::connect` on a real MongoDB (the test kit's shared server).
#![cfg(feature = "mongo")]

use lease::LeaseKey;

/// The test server's URI, `None` when it may be skipped.
fn mongo_uri() -> Option<String> {
    match lease_testkit::servers::mongo() {
        Ok(m) => Some(m.uri.clone()),
        Err(e) if lease_testkit::skip_allowed("mongo") => {
            eprintln!("SKIPPED (mongo in LEASE_TEST_SKIP): {e}");
            None
        }
        Err(e) => panic!("{e} (run `cargo xtask provision`, or set LEASE_TEST_SKIP=mongo)"),
    }
}

/// The database of the URL is the one the leases live in.
#[tokio::test]
async fn the_database_of_the_url_holds_the_leases() -> Result<(), Box<dyn std::error::Error>> {
    let Some(uri) = mongo_uri() else {
        return Ok(());
    };
    let base = uri.split('?').next().unwrap_or(&uri).trim_end_matches('/');
    let base = match base.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", rest.split('/').next().unwrap_or(rest)),
        None => panic!("not a URI: {uri}"),
    };
    let url = format!("{base}/lease_facade_db?collection=facade_locks");
    let connection = lease::connect(&url).await?;
    let key = LeaseKey::new("facade/mongo-db")?;
    let lease = connection
        .keeper()
        .acquire(&key)
        .ttl(std::time::Duration::from_secs(5))
        .await?;
    lease.release().await?;
    connection.shutdown().await;
    let options = lease::mongo::mongodb::options::ClientOptions::parse(&uri).await?;
    let client = lease::mongo::mongodb::Client::with_options(options)?;
    let names = client
        .database("lease_facade_db")
        .list_collection_names()
        .await?;
    assert!(names.iter().any(|n| n == "facade_locks"), "{names:?}");
    client.shutdown().immediate(true).await;
    Ok(())
}
