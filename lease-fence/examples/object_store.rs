//! FencedStore: a stale writer never overwrites an object written at a
//! higher fence (here on object_store's InMemory; S3 works the same,
//! object_store's LocalFileSystem does not: it has no conditional update).
//!
//! Run it with `cargo run -p lease-fence --features object-store --example object_store`.

use lease_core::Fence;
use lease_fence::{FencedError, FencedStore};
use object_store::{memory::InMemory, path::Path};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = FencedStore::new(InMemory::new());
    let report = Path::from("reports/daily.json");

    store.put(&report, r#"{"by":"a"}"#.into(), Fence(1)).await?;
    println!("a (fence 1) wrote {report}");
    store.put(&report, r#"{"by":"b"}"#.into(), Fence(2)).await?;
    println!("b (fence 2) wrote {report}");
    match store
        .put(&report, r#"{"by":"a, late"}"#.into(), Fence(1))
        .await
    {
        Err(FencedError::Stale(stale)) => println!("a's late write refused: {stale}"),
        other => println!("unexpected: {other:?}"),
    }
    store.delete(&report, Fence(2)).await?;
    match store
        .put(&report, r#"{"by":"a, later"}"#.into(), Fence(1))
        .await
    {
        Err(FencedError::Stale(stale)) => {
            println!("after b's delete, a still cannot re-create it: {stale}")
        }
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
