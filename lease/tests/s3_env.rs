//! `s3://` takes what the URL leaves out from the AWS environment the way
//! object_store reads it (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, …), on the test
//! kit's S3 server.
//!
//! A test binary of its own: it sets the process environment, which the
//! other tests must not see.
#![cfg(feature = "s3")]

use std::time::Duration;

use lease::LeaseKey;

#[tokio::test]
async fn s3_urls_take_the_aws_environment_as_object_store_reads_it(
) -> Result<(), Box<dyn std::error::Error>> {
    let s3 = match lease_testkit::servers::s3() {
        Ok(s3) => s3,
        Err(e) if lease_testkit::skip_allowed("s3") => {
            eprintln!("SKIPPED (s3 in LEASE_TEST_SKIP): {e}");
            return Ok(());
        }
        Err(e) => panic!("{e} (run `cargo xtask provision`, or set LEASE_TEST_SKIP=s3)"),
    };
    // The only test of this binary sets the environment before any client
    // reads it.
    for (k, v) in [
        ("AWS_ENDPOINT", s3.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_REGION", s3.region.as_str()),
        ("AWS_ACCESS_KEY_ID", s3.access_key.as_str()),
        ("AWS_SECRET_ACCESS_KEY", s3.secret_key.as_str()),
    ] {
        std::env::set_var(k, v);
    }
    let url = format!("s3://{}/lease-facade-env", s3.bucket);
    let connection = lease::connect(&url).await?;
    let key = LeaseKey::new(format!("env/{}", std::process::id()))?;
    let lease = tokio::time::timeout(
        Duration::from_secs(30),
        connection
            .keeper()
            .acquire(&key)
            .ttl(Duration::from_secs(5)),
    )
    .await??;
    lease.release().await?;
    Ok(())
}
