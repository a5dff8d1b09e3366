//! Bad input against the real server: a clear error, and the store unchanged.

use crate::common;

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};
use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, HolderId, LeaseBackend, LeaseKey, Payload,
    Renewal, Version, MAX_PAYLOAD_LEN,
};
use lease_etcd::provider::EtcdProvider;
use lease_etcd::{EtcdBackend, EtcdConfig, TlsConfig, MAX_TTL};

struct Setup {
    backend: EtcdBackend,
    endpoints: Vec<String>,
    prefix: String,
}

async fn setup(tag: &str) -> Setup {
    let endpoints = common::shared_endpoints().expect("etcd server");
    common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    let prefix = common::unique_prefix(tag);
    let backend = EtcdBackend::connect(EtcdConfig::new(endpoints.clone()).key_prefix(&prefix))
        .await
        .expect("connect");
    Setup {
        backend,
        endpoints,
        prefix,
    }
}

impl Setup {
    /// Every key-value under this test's prefix, with its revisions.
    async fn snapshot(&self) -> Vec<(Vec<u8>, Vec<u8>, i64, i64)> {
        let mut kv = self.backend.client().kv_client();
        let resp = kv
            .get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .expect("snapshot");
        resp.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key().to_vec(),
                    kv.value().to_vec(),
                    kv.create_revision(),
                    kv.mod_revision(),
                )
            })
            .collect()
    }

    async fn raw_put(&self, key: &LeaseKey, value: &[u8], lease: Option<i64>) {
        let mut kv = self.backend.client().kv_client();
        let opts = lease.map(|l| PutOptions::new().with_lease(l));
        kv.put(format!("{}{}", self.prefix, key), value.to_vec(), opts)
            .await
            .expect("raw put");
    }
}

#[tokio::test]
async fn invalid_keys_are_refused_before_anything_is_sent() {
    let s = setup("badkeys").await;
    for bad in [
        "",
        "/a",
        "a/",
        "a//b",
        "a b",
        "ключ",
        "a*",
        ".hidden",
        "a/../b",
        &"k".repeat(256),
    ] {
        match LeaseKey::new(bad) {
            Err(Error::InvalidKey { key, reason }) => {
                assert_eq!(key, bad);
                assert!(!reason.is_empty());
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
        let config = EtcdConfig::new(s.endpoints.clone()).key_prefix(&s.prefix);
        match EtcdProvider::connect(config, bad).await {
            Err(Error::InvalidKey { .. }) => {}
            other => panic!("provider for key {bad:?} gave {:?}", other.err()),
        }
    }
    assert!(s.snapshot().await.is_empty(), "store changed");
}

#[tokio::test]
async fn ttl_out_of_range_is_refused_and_changes_nothing() {
    let s = setup("badttl").await;
    let k = LeaseKey::new("ttl").unwrap();
    let a = HolderId::random();
    for ttl in [
        MAX_TTL + Duration::from_millis(1),
        MAX_TTL * 2,
        Duration::MAX,
    ] {
        match s
            .backend
            .try_acquire(AcquireRequest::new(k.clone(), a.clone()).ttl(ttl))
            .await
        {
            Err(Error::InvalidTtl { requested, reason }) => {
                assert_eq!(requested, ttl);
                assert!(reason.contains("maximum"), "{reason}");
            }
            other => panic!("TTL {ttl:?} gave {other:?}"),
        }
    }
    // The maximum itself and zero (= the minimum) are fine.
    let g = s
        .backend
        .try_acquire(AcquireRequest::new(k.clone(), a.clone()).ttl(MAX_TTL))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(g.ttl(), MAX_TTL);
    s.backend.release(&g).await.unwrap();
    let g = s
        .backend
        .try_acquire(AcquireRequest::new(k.clone(), a.clone()).ttl(Duration::ZERO))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(g.ttl(), Duration::from_secs(1));
    s.backend.release(&g).await.unwrap();
    assert!(s.snapshot().await.is_empty(), "store changed");

    // A provider whose default TTL is out of range is refused at construction.
    let config = EtcdConfig::new(s.endpoints.clone())
        .key_prefix(&s.prefix)
        .default_ttl(MAX_TTL * 3);
    assert!(matches!(
        EtcdProvider::connect(config, "p").await,
        Err(Error::InvalidTtl { .. })
    ));
}

#[tokio::test]
async fn oversize_payload_is_refused_and_the_record_kept() {
    let s = setup("bigpayload").await;
    match Payload::new(vec![1; MAX_PAYLOAD_LEN + 1]) {
        Err(Error::PayloadTooLarge { len, max }) => {
            assert_eq!((len, max), (MAX_PAYLOAD_LEN + 1, MAX_PAYLOAD_LEN))
        }
        other => panic!("oversize payload gave {other:?}"),
    }
    assert_eq!(
        s.backend.capabilities().max_payload,
        MAX_PAYLOAD_LEN,
        "etcd stores the full contract size (its request limit is 1.5 MiB)"
    );
    // The largest payload is stored whole and read back.
    let k = LeaseKey::new("payload").unwrap();
    let a = HolderId::random();
    let p = Payload::new(vec![0xAB; MAX_PAYLOAD_LEN]).unwrap();
    let g = s
        .backend
        .try_acquire(AcquireRequest::new(k.clone(), a).payload(p.clone()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(
        s.backend.read(&k).await.unwrap().holding().unwrap().payload,
        p
    );
    s.backend.release(&g).await.unwrap();
}

#[tokio::test]
async fn foreign_values_at_a_lease_key_are_corrupt_and_left_alone() {
    let s = setup("foreign").await;
    let a = HolderId::random();
    // A value that was written without a lease by another program; JSON of
    // another shape; our own format but not bound to a lease (it would never
    // expire); and a value of another program bound to its own lease.
    let mut lc = s.backend.client().lease_client();
    let foreign_lease = lc.grant(60, None).await.unwrap().id();
    let holder = HolderId::random();
    let ours_without_lease =
        format!(r#"{{"format":"lease-etcd/1","holder":"{holder}","ttl_ms":10000,"payload":""}}"#);
    let cases: Vec<(&str, Vec<u8>, Option<i64>)> = vec![
        ("plain", b"not a lease record".to_vec(), None),
        ("json", br#"{"leader":"someone"}"#.to_vec(), None),
        ("nolease", ours_without_lease.into_bytes(), None),
        (
            "otherlease",
            b"\x00\x01binary".to_vec(),
            Some(foreign_lease),
        ),
        ("empty", Vec::new(), None),
    ];
    for (name, value, lease) in &cases {
        let k = LeaseKey::new(format!("foreign/{name}")).unwrap();
        s.raw_put(&k, value, *lease).await;
    }
    let before = s.snapshot().await;
    for (name, _, lease) in &cases {
        let k = LeaseKey::new(format!("foreign/{name}")).unwrap();
        match s.backend.read(&k).await {
            Err(Error::CorruptRecord { key, detail }) => {
                assert_eq!(key, k.as_str());
                assert!(!detail.is_empty());
            }
            other => panic!("read of {name} gave {other:?}"),
        }
        match s
            .backend
            .try_acquire(AcquireRequest::new(k.clone(), a.clone()))
            .await
        {
            Err(Error::CorruptRecord { .. }) => {}
            Ok(Acquire::Granted(g)) => {
                panic!("{name}: foreign value taken as free, fence {}", g.fence())
            }
            other => panic!("acquire over {name} gave {other:?}"),
        }
        // A grant naming the key's create revision, as if we had held it.
        let mut kv = s.backend.client().kv_client();
        let rev = kv
            .get(format!("{}{}", s.prefix, k), None)
            .await
            .unwrap()
            .kvs()[0]
            .create_revision();
        let fake = Grant::new(
            k.clone(),
            holder.clone(),
            Fence(rev as u64),
            Duration::from_secs(10),
            Instant::now(),
            Version::new(foreign_lease.to_string()),
        );
        match s.backend.renew(&fake, None).await {
            Err(Error::CorruptRecord { .. }) => {}
            other => panic!("renew over {name} gave {other:?}"),
        }
        match s
            .backend
            .renew(&fake, Some(Payload::new(b"x".to_vec()).unwrap()))
            .await
        {
            Err(Error::CorruptRecord { .. }) | Ok(Renewal::Lost) => {}
            other => panic!("renew with payload over {name} gave {other:?}"),
        }
        // Release never deletes a value that is not a lease record, even
        // for a grant naming the key's revision and lease.
        let _ = lease;
        s.backend.release(&fake).await.unwrap();
    }
    assert_eq!(s.snapshot().await, before, "store changed");
    let _ = lc.revoke(foreign_lease).await;
}

#[tokio::test]
async fn invalid_configurations_are_refused_clearly() {
    let cases: Vec<(EtcdConfig, &str)> = vec![
        (EtcdConfig::new(Vec::<String>::new()), "no endpoints"),
        (EtcdConfig::new([" "]), "empty endpoint"),
        (
            EtcdConfig::new(["http://127.0.0.1:1"]).dial_timeout(Duration::ZERO),
            "dial timeout",
        ),
        (
            EtcdConfig::new(["http://127.0.0.1:1"]).tls(TlsConfig::with_ca(b"x".to_vec())),
            "plaintext",
        ),
        (
            EtcdConfig::new(["https://127.0.0.1:1"]).tls(TlsConfig::with_ca(b"not pem".to_vec())),
            "not PEM",
        ),
        (
            EtcdConfig::new(["https://127.0.0.1:1"]).tls({
                let mut half = TlsConfig::default();
                half.client_cert_pem = Some(b"-----BEGIN CERTIFICATE-----".to_vec());
                half
            }),
            "needs its key",
        ),
    ];
    for (config, want) in cases {
        match EtcdBackend::connect(config).await {
            Err(e @ Error::Backend(_)) => {
                assert!(e.to_string().contains(want), "{e} lacks {want:?}")
            }
            Err(e) => panic!("expected a configuration error containing {want:?}, got {e}"),
            Ok(_) => panic!("accepted a bad configuration ({want})"),
        }
    }
}
