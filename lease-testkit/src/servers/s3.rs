//! S3: `LEASE_TEST_S3_ENDPOINT`, else moto (from `cargo xtask provision`)
//! behind `servers/moto_serial.py`, which serves one request at a time so
//! conditional PUTs are atomic, else (feature `containers`) a `minio/minio`
//! container.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

use super::container::{self, Request, Started};
use super::process::{self, Managed, Spec, TempDir};
use super::sigv4::Signer;
use super::{
    announce, from_container, impl_control, not_found, process_env, servers_dir, EnvLookup, Source,
    Unavailable, NATIVE_ONLY,
};

const BACKEND: &str = "s3";
const ENV: &str = "LEASE_TEST_S3_ENDPOINT";
const DEFAULT_BUCKET: &str = "lease-test";
const DEFAULT_REGION: &str = "us-east-1";
/// moto accepts any credentials.
const DEFAULT_KEY: &str = "test";
const WHAT: &str = "moto (a Python with moto[s3] and flask-cors)";
/// MinIO checks signatures and conditional writes (`If-None-Match`,
/// `If-Match`) itself, one request or many at a time.
const IMAGE: &str = "minio/minio";
const TAG: &str = "RELEASE.2025-04-22T22-12-26Z";
/// MinIO's root credentials (the password needs 8 characters or more).
const MINIO_USER: &str = "lease-test";
const MINIO_PASSWORD: &str = "lease-test-secret";

/// The launcher script, embedded so the harness works from any directory.
const MOTO_SERIAL: &str = include_str!("../../servers/moto_serial.py");

/// An S3-compatible server with an existing bucket, for tests.
#[derive(Debug)]
pub struct S3 {
    /// Endpoint URL, e.g. `http://127.0.0.1:5000` (path-style requests).
    pub endpoint: String,
    /// A bucket that exists (created by the harness for moto).
    pub bucket: String,
    /// Region to sign requests for.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret access key.
    pub secret_key: String,
    /// Where the server came from.
    pub source: Source,
    managed: Option<Managed>,
}

impl_control!(S3, "s3");

/// The shared S3 server of this test process, started on first use.
pub fn s3() -> Result<&'static S3, Unavailable> {
    static SHARED: OnceLock<Result<S3, Unavailable>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let s3 = resolve(&process_env)?;
            if let Some(m) = &s3.managed {
                m.cleanup_at_exit();
            }
            announce(BACKEND, &s3.source, &s3.endpoint);
            Ok(s3)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A private moto server (state in memory: a restart empties it and
/// re-creates the bucket), killed on drop.
pub fn spawn_s3() -> Result<S3, Unavailable> {
    let python = python().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "s3", NATIVE_ONLY))?;
    start_native(&python)
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<S3, Unavailable> {
    if let Some(s3) = from_env(env) {
        return Ok(s3);
    }
    match python() {
        Some(python) => start_native(&python),
        None => start_container(),
    }
}

/// Step 3: a single-drive MinIO; ready once the bucket exists, created with
/// the native path's [`create_bucket`], signed (MinIO refuses unsigned
/// requests).
fn start_container() -> Result<S3, Unavailable> {
    let req = Request {
        backend: BACKEND,
        image: IMAGE,
        tag: TAG,
        ports: &[9000],
        cmd: vec!["server".to_string(), "/data".to_string()],
        env: vec![
            ("MINIO_ROOT_USER", MINIO_USER.to_string()),
            ("MINIO_ROOT_PASSWORD", MINIO_PASSWORD.to_string()),
        ],
    };
    let image = req.reference();
    let signer = Signer {
        access_key: MINIO_USER,
        secret_key: MINIO_PASSWORD,
        region: DEFAULT_REGION,
    };
    let ready = |s: &Started| {
        container::addr(&s.host, s.ports[0])
            .is_some_and(|addr| create_bucket(addr, DEFAULT_BUCKET, Some(&signer)))
    };
    let started = from_container(req, &ready, ENV, WHAT, "s3")?;
    Ok(S3 {
        endpoint: format!("http://{}:{}", started.host, started.ports[0]),
        bucket: DEFAULT_BUCKET.to_string(),
        region: DEFAULT_REGION.to_string(),
        access_key: MINIO_USER.to_string(),
        secret_key: MINIO_PASSWORD.to_string(),
        source: Source::Container(image),
        managed: None,
    })
}

/// Creates `bucket` with a path-style `PUT /<bucket>`: true once it exists
/// (200, or 409 when it already did). Unsigned for moto, signed with
/// `signer` for a server that checks signatures.
pub(crate) fn create_bucket(addr: SocketAddr, bucket: &str, signer: Option<&Signer<'_>>) -> bool {
    let path = format!("/{bucket}");
    let headers = signer
        .map(|s| s.headers("PUT", &addr.to_string(), &path))
        .unwrap_or_default();
    matches!(
        process::http_with(addr, "PUT", &path, &headers, b""),
        Ok((200 | 409, _))
    )
}

pub(crate) fn from_env(env: EnvLookup<'_>) -> Option<S3> {
    let endpoint = env(ENV)?.trim().trim_end_matches('/').to_string();
    Some(S3 {
        endpoint,
        bucket: env("LEASE_TEST_S3_BUCKET").unwrap_or_else(|| DEFAULT_BUCKET.to_string()),
        region: env("LEASE_TEST_S3_REGION").unwrap_or_else(|| DEFAULT_REGION.to_string()),
        access_key: env("AWS_ACCESS_KEY_ID").unwrap_or_else(|| DEFAULT_KEY.to_string()),
        secret_key: env("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|| DEFAULT_KEY.to_string()),
        source: Source::Env(ENV),
        managed: None,
    })
}

/// The provisioned virtualenv's Python, else a `python3` on PATH that has
/// moto and flask-cors.
fn python() -> Option<PathBuf> {
    let venv = servers_dir().join("moto").join("bin").join("python");
    if crate::is_executable(&venv) {
        return Some(venv);
    }
    let python = crate::which("python3")?;
    process::output_of(&python, &["-c", "import moto, flask_cors"]).map(|_| python)
}

fn start_native(python: &std::path::Path) -> Result<S3, Unavailable> {
    let mut last = None;
    for _ in 0..3 {
        match start_once(python) {
            Ok(s3) => return Ok(s3),
            Err(e) if e.reason.contains("Address already in use") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Unavailable::new(BACKEND, "could not start")))
}

fn start_once(python: &std::path::Path) -> Result<S3, Unavailable> {
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare moto: {e}"));
    let dir = TempDir::new("s3").map_err(io)?;
    let script = dir.path().join("moto_serial.py");
    std::fs::write(&script, MOTO_SERIAL).map_err(io)?;
    let port = process::free_ports(1).map_err(io)?[0];
    let spec = Spec::new(python)
        .arg(&script)
        .arg("--host")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let bucket = DEFAULT_BUCKET.to_string();
    // Ready once the bucket exists (moto keeps state in memory, so a
    // restarted server gets its bucket back here).
    let ready = Box::new(move || create_bucket(addr, DEFAULT_BUCKET, None));
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    Ok(S3 {
        endpoint: format!("http://127.0.0.1:{port}"),
        bucket,
        region: DEFAULT_REGION.to_string(),
        access_key: DEFAULT_KEY.to_string(),
        secret_key: DEFAULT_KEY.to_string(),
        source: Source::Native(python.to_path_buf()),
        managed: Some(managed),
    })
}
