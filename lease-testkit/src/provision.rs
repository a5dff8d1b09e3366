//! Provisioning the native test servers (what `cargo xtask provision`
//! runs), cached under [`servers_dir`]: `<workspace>/target/lease-servers/`
//! or `$LEASE_SERVERS_DIR`.
//!
//! Layout of the cache (the launchers in [`servers`](crate::servers) look
//! for exactly these paths):
//!
//! - `bin/etcd`, `bin/nats-server`: copied out of Debian packages
//!   (`etcd-server`, `nats-server` from the `sid` suite, fetched with
//!   `apt-get download` through a temporary sources list built from this
//!   machine's own apt configuration, unpacked with `dpkg -x`);
//! - `moto/`: a Python virtualenv with `moto[s3]`, `flask`, `flask-cors`
//!   (run through `lease-testkit/servers/moto_serial.py`);
//! - `secantus/`: a Python virtualenv with `secantusdb` (`bin/secantusd-py`);
//! - `postgres/`: Debian's `postgresql-15` (and the libraries it links that
//!   a minimal system lacks) unpacked with `dpkg -x`, binaries in
//!   `postgres/usr/lib/postgresql/15/bin`; only when the system has no
//!   PostgreSQL 15 in `/usr/lib/postgresql/15/bin`, which is used as it is;
//! - `redis/`: Debian's `redis-server` with `redis-tools` (the binary it
//!   links to), `libjemalloc2` and `liblzf1` unpacked with `dpkg -x`,
//!   binary in `redis/usr/bin/redis-server`, run with `LD_LIBRARY_PATH`
//!   from [`library_path`]; only when the system's `/usr/bin/redis-server`
//!   is missing or older than Redis 7, else that one is used as it is;
//! - `protoc/`: only when a working `protoc` (with the well-known types)
//!   could not be installed with apt (`bin/protoc` is then a wrapper,
//!   exported as `PROTOC` by [`env_for_tests`]).
//!
//! Every step is idempotent: what is present and works is left alone.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::{servers_dir, which, SERVERS_DIR_ENV, SERVER_BACKENDS};

/// This crate's Python helpers (`servers/*.py`): the launchers' checks.
fn launcher_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("servers")
}

/// moto pins, tried in order: an exact version known to work, then any 5.x
/// should that one not install.
const MOTO_SPECS: [&str; 2] = ["moto[s3]==5.2.5", "moto[s3]==5.*"];
const SECANTUS_SPEC: &str = "secantusdb==0.7.0b3";
/// Minimum nats-server version: per-message TTL (`Nats-TTL`) arrived in 2.11.
const NATS_MIN: (u32, u32) = (2, 11);

/// Environment variables a test run needs: `LEASE_SERVERS_DIR` always, and
/// `PROTOC` when provisioning had to unpack its own protoc (the one on
/// `PATH` was missing or unusable).
pub fn env_for_tests() -> Vec<(String, String)> {
    let dir = servers_dir();
    let mut env = vec![(
        SERVERS_DIR_ENV.to_string(),
        dir.to_string_lossy().into_owned(),
    )];
    let cached = dir.join("protoc").join("bin").join("protoc");
    if cached.is_file() {
        env.push(("PROTOC".to_string(), cached.to_string_lossy().into_owned()));
    }
    env
}

/// Makes sure protoc and the servers of `backends` are present (names:
/// `etcd`, `nats`, `s3`, `mongo`, `postgres`, `redis`, `protoc`, `all`). protoc is always
/// ensured: the etcd client's build script needs it for any workspace build.
pub fn ensure(backends: &[&str]) -> Result<(), String> {
    let mut wanted: Vec<&str> = Vec::new();
    for &b in backends {
        match b {
            "all" => wanted.extend(SERVER_BACKENDS),
            "protoc" => {}
            b if SERVER_BACKENDS.contains(&b) => wanted.push(b),
            other => {
                return Err(format!(
                    "provision: unknown backend {other:?} (known: {}, protoc, all)",
                    SERVER_BACKENDS.join(", ")
                ))
            }
        }
    }
    let dir = servers_dir();
    fs::create_dir_all(&dir).map_err(|e| format!("provision: create {}: {e}", dir.display()))?;
    // One provisioner at a time per cache (two `cargo xtask` runs, CI steps).
    let lock_path = dir.join(".provision.lock");
    let lock = fs::File::create(&lock_path)
        .map_err(|e| format!("provision: open {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("provision: lock {}: {e}", lock_path.display()))?;

    timed("protoc", || ensure_protoc(&dir))?;
    for b in SERVER_BACKENDS {
        if wanted.contains(&b) {
            match b {
                "etcd" => timed("etcd", || ensure_etcd(&dir))?,
                "nats" => timed("nats-server", || ensure_nats(&dir))?,
                "s3" => timed("moto", || ensure_moto(&dir))?,
                "mongo" => {
                    timed("secantusdb", || ensure_secantus(&dir))?;
                    timed("libfaketime", || ensure_libfaketime(&dir))?;
                }
                "postgres" => timed("postgresql-15", || ensure_postgres(&dir))?,
                "redis" => timed("redis-server", || ensure_redis(&dir))?,
                _ => {}
            }
        }
    }
    // The sid package lists are only needed while downloading.
    if SID_UPDATED.swap(false, Ordering::SeqCst) {
        let _ = fs::remove_dir_all(dir.join("apt-sid"));
    }
    Ok(())
}

/// Runs one step and prints its line with the time it took.
fn timed(what: &str, step: impl FnOnce() -> Result<String, String>) -> Result<(), String> {
    let start = Instant::now();
    let line = step().map_err(|e| format!("provision: {what}: {e}"))?;
    println!("provision: {line} ({:.1}s)", start.elapsed().as_secs_f64());
    let _ = std::io::stdout().flush();
    Ok(())
}

// ---------------------------------------------------------------- protoc

fn ensure_protoc(dir: &Path) -> Result<String, String> {
    let cached = dir.join("protoc").join("bin").join("protoc");
    if cached.is_file() {
        if let Ok(v) = protoc_check(dir, &cached) {
            return Ok(format!(
                "protoc {v} at {} (already present, exported as PROTOC)",
                cached.display()
            ));
        }
    }
    let system = which("protoc").map(|p| (protoc_check(dir, &p), p));
    if let Some((Ok(v), path)) = &system {
        return Ok(format!(
            "protoc {v} at {} (already present)",
            path.display()
        ));
    }
    if is_root() {
        system_apt_update()?;
        // libprotobuf-dev holds the well-known types (google/protobuf/*.proto)
        // that etcd-client's protos import; it is only a Recommends.
        let out = run_cmd(
            Command::new("apt-get")
                .args(["install", "-y", "protobuf-compiler", "libprotobuf-dev"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        );
        if let Some(path) = which("protoc") {
            if let Ok(v) = protoc_check(dir, &path) {
                return Ok(format!(
                    "protoc {v} at {} (apt-get install protobuf-compiler libprotobuf-dev)",
                    path.display()
                ));
            }
        }
        eprintln!(
            "provision: apt-get install protobuf-compiler did not give a working protoc ({}); unpacking the packages instead",
            out.err().unwrap_or_else(|| "protoc missing or without well-known types".to_string())
        );
    } else if let Some((Err(e), path)) = &system {
        eprintln!(
            "provision: {} does not work ({e}); unpacking the packages instead",
            path.display()
        );
    }
    // Fallback: unpack protobuf-compiler, its libraries and the well-known
    // types into the cache, with a wrapper in bin/protoc that finds the
    // libraries (protoc finds <bin>/../include itself).
    let root = dir.join("protoc");
    let _ = fs::remove_dir_all(&root);
    let work = dir.join("tmp-protoc");
    reset_dir(&work)?;
    let _ = system_apt_update();
    let debs = apt_download(
        &[],
        &[
            "protobuf-compiler",
            "libprotoc32",
            "libprotobuf32",
            "libprotobuf-dev",
        ],
        &work,
    )?;
    let unpacked = root.join("root");
    for deb in &debs {
        dpkg_extract(deb, &unpacked)?;
    }
    let real = unpacked.join("usr/bin/protoc");
    if !real.is_file() {
        return Err(format!("no usr/bin/protoc in {}", unpacked.display()));
    }
    let multiarch = unpacked.join("usr/lib");
    let script = format!(
        "#!/bin/sh\n# protoc unpacked by `cargo xtask provision`\nlibs=$(find '{libs}' -name 'libprotoc.so*' -printf '%h\\n' | head -n1)\nLD_LIBRARY_PATH=\"$libs${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\" exec '{real}' \"$@\"\n",
        libs = multiarch.display(),
        real = real.display()
    );
    fs::create_dir_all(root.join("bin")).map_err(|e| format!("mkdir: {e}"))?;
    let wrapper = root.join("bin").join("protoc");
    fs::write(&wrapper, script).map_err(|e| format!("write {}: {e}", wrapper.display()))?;
    set_executable(&wrapper)?;
    let _ = fs::remove_dir_all(&work);
    let v = protoc_check(dir, &wrapper)?;
    Ok(format!(
        "protoc {v} at {} (unpacked; exported as PROTOC)",
        wrapper.display()
    ))
}

/// The version of the protoc at `path`, once it has compiled a file that
/// imports well-known types (as etcd-client's protos do).
fn protoc_check(dir: &Path, path: &Path) -> Result<String, String> {
    let out = run_cmd(Command::new(path).arg("--version"))?;
    let version = out.trim().trim_start_matches("libprotoc ").to_string();
    let work = dir.join("tmp-protoc-check");
    reset_dir(&work)?;
    let proto = work.join("check.proto");
    fs::write(
        &proto,
        "syntax = \"proto3\";\nimport \"google/protobuf/descriptor.proto\";\nimport \"google/protobuf/struct.proto\";\nmessage Check { google.protobuf.Struct s = 1; }\n",
    )
    .map_err(|e| format!("write {}: {e}", proto.display()))?;
    let compiled = run_cmd(
        Command::new(path)
            .arg(format!("-I{}", work.display()))
            .arg(format!(
                "--descriptor_set_out={}",
                work.join("out.pb").display()
            ))
            .arg(&proto),
    );
    let _ = fs::remove_dir_all(&work);
    compiled.map_err(|e| {
        format!("protoc cannot compile a file importing google/protobuf/*.proto: {e}")
    })?;
    Ok(version)
}

// ---------------------------------------------------------- etcd, nats

fn ensure_etcd(dir: &Path) -> Result<String, String> {
    let bin = dir.join("bin").join("etcd");
    if let Ok(v) = etcd_version(&bin) {
        return Ok(format!("etcd {v} at {} (already present)", bin.display()));
    }
    let sid = debian_package_from_sid(dir, "etcd-server", "usr/bin/etcd", &bin)
        .and_then(|()| etcd_version(&bin));
    match sid {
        Ok(v) => Ok(format!(
            "etcd {v} at {} (Debian sid etcd-server)",
            bin.display()
        )),
        Err(e) => {
            eprintln!("provision: etcd from sid failed ({e}); trying this release's etcd-server");
            debian_package_from_system(dir, "etcd-server", "usr/bin/etcd", &bin)?;
            let v = etcd_version(&bin)?;
            Ok(format!(
                "etcd {v} at {} (this release's etcd-server)",
                bin.display()
            ))
        }
    }
}

// -------------------------------------------------------------- postgres

/// Where Debian's `postgresql-15` puts the server binaries.
const PG_SYSTEM_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The same, relative to the unpacked cache (`<servers>/postgres/`).
const PG_CACHED_BIN: &str = "postgres/usr/lib/postgresql/15/bin";
/// Libraries `postgres` links that a minimal Debian (bookworm) lacks,
/// unpacked beside it when the system has no PostgreSQL 15. A package that
/// cannot be downloaded is skipped; the final `ldd` check says what is
/// still missing.
const PG_LIBRARY_PACKAGES: [&str; 12] = [
    "libicu72",
    "libxml2",
    "libldap-2.5-0",
    "libsasl2-2",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libkeyutils1",
    "liblz4-1",
    "libcap-ng0",
    "libaudit1",
];

/// The system's PostgreSQL 15 when there is one (nothing is copied);
/// otherwise `postgresql-15` and the libraries it needs from this release's
/// archive, unpacked under `<dir>/postgres`. No service is started or
/// installed.
fn ensure_postgres(dir: &Path) -> Result<String, String> {
    let system = Path::new(PG_SYSTEM_BIN);
    if let Ok(v) = postgres_version(system, None) {
        return Ok(format!(
            "PostgreSQL {v} at {} (the system's)",
            system.display()
        ));
    }
    let root = dir.join("postgres");
    let cached = dir.join(PG_CACHED_BIN);
    if let Ok(v) = postgres_version(&cached, library_path(&root).as_deref()) {
        return Ok(format!(
            "PostgreSQL {v} at {} (already present)",
            cached.display()
        ));
    }
    unpack_packages(dir, "postgres", &["postgresql-15"], &PG_LIBRARY_PACKAGES)?;
    let libs = library_path(&root);
    let v = postgres_version(&cached, libs.as_deref())?;
    check_libraries(
        &cached.join("postgres"),
        libs.as_deref(),
        &format!("PostgreSQL {v}"),
    )?;
    Ok(format!(
        "PostgreSQL {v} at {} (this release's postgresql-15)",
        cached.display()
    ))
}

/// Downloads `packages` (all needed) and `optional` (each skipped, with a
/// line on stderr, when it cannot be downloaded) from this release's
/// archive and unpacks them into `<dir>/<name>`, replacing what was there
/// only once every package is unpacked.
fn unpack_packages(
    dir: &Path,
    name: &str,
    packages: &[&str],
    optional: &[&str],
) -> Result<(), String> {
    let work = dir.join(format!("tmp-{name}"));
    reset_dir(&work)?;
    system_apt_update()?;
    let mut debs = apt_download(&[], packages, &work)?;
    for package in optional {
        let one = work.join(package);
        reset_dir(&one)?;
        match apt_download(&[], &[package], &one) {
            Ok(mut more) => debs.append(&mut more),
            Err(e) => eprintln!("provision: {name}: skipping {package}: {e}"),
        }
    }
    let staging = dir.join(format!("{name}.partial"));
    reset_dir(&staging)?;
    for deb in &debs {
        dpkg_extract(deb, &staging)?;
    }
    let root = dir.join(name);
    let _ = fs::remove_dir_all(&root);
    fs::rename(&staging, &root).map_err(|e| format!("rename to {}: {e}", root.display()))?;
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// An error naming the libraries `binary` (`what`, for the message) links
/// that `ldd` cannot find, with `libs` as `LD_LIBRARY_PATH`.
fn check_libraries(binary: &Path, libs: Option<&str>, what: &str) -> Result<(), String> {
    let missing = missing_libraries(binary, libs);
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{what} unpacked at {}, but these libraries are missing: {}",
        binary.display(),
        missing.join(", ")
    ))
}

/// The library directories of packages unpacked under `root` (by
/// `cargo xtask provision`), for `LD_LIBRARY_PATH`; `None` when there are
/// none. The launchers of unpacked servers run them with it.
pub fn library_path(root: &Path) -> Option<String> {
    let dirs: Vec<String> = [
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "lib/x86_64-linux-gnu",
        "lib/aarch64-linux-gnu",
    ]
    .iter()
    .map(|d| root.join(d))
    .filter(|d| d.is_dir())
    .map(|d| d.to_string_lossy().into_owned())
    .collect();
    (!dirs.is_empty()).then(|| dirs.join(":"))
}

/// `postgres --version` in `bin` (with `initdb` beside it), when it is 15.
fn postgres_version(bin: &Path, libs: Option<&str>) -> Result<String, String> {
    let server = bin.join("postgres");
    if !server.is_file() || !bin.join("initdb").is_file() {
        return Err(format!("{} missing", server.display()));
    }
    let mut cmd = Command::new(&server);
    cmd.arg("--version");
    if let Some(libs) = libs {
        cmd.env("LD_LIBRARY_PATH", libs);
    }
    let out = run_cmd(&mut cmd)?;
    // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    let v = out
        .split_once("(PostgreSQL)")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("")
        .to_string();
    if v.split('.').next() == Some("15") {
        Ok(v)
    } else {
        Err(format!("unexpected `postgres --version` output: {out}"))
    }
}

// ----------------------------------------------------------------- redis

/// Where Debian's `redis-server` puts the server.
const REDIS_SYSTEM_BIN: &str = "/usr/bin/redis-server";
/// The same, relative to the cache: `redis-server` unpacked under
/// `<servers>/redis/` (its libraries beside it, see [`library_path`]).
pub const REDIS_CACHED_BIN: &str = "redis/usr/bin/redis-server";
/// Debian's `redis-server` is a link to `redis-check-rdb` in `redis-tools`;
/// the two libraries are what a minimal system lacks.
const REDIS_PACKAGES: [&str; 4] = ["redis-server", "redis-tools", "libjemalloc2", "liblzf1"];
/// Minimum major version: the backend's scripts and `SET … GET` need 7.
const REDIS_MIN: u32 = 7;

/// The system's Redis (or Valkey) 7 or later when there is one (nothing is
/// copied); otherwise `redis-server` and the libraries it needs from this
/// release's archive, unpacked under `<dir>/redis`. No service is started
/// or installed.
fn ensure_redis(dir: &Path) -> Result<String, String> {
    let system = Path::new(REDIS_SYSTEM_BIN);
    if let Ok(v) = redis_version(system, None) {
        return Ok(format!("{v} at {} (the system's)", system.display()));
    }
    let root = dir.join("redis");
    let cached = dir.join(REDIS_CACHED_BIN);
    if let Ok(v) = redis_version(&cached, library_path(&root).as_deref()) {
        return Ok(format!("{v} at {} (already present)", cached.display()));
    }
    unpack_packages(dir, "redis", &REDIS_PACKAGES, &[])?;
    let libs = library_path(&root);
    let v = redis_version(&cached, libs.as_deref())?;
    check_libraries(&cached, libs.as_deref(), &v)?;
    Ok(format!(
        "{v} at {} (this release's redis-server)",
        cached.display()
    ))
}

/// Runs `redis-server --version` (with `libs` as `LD_LIBRARY_PATH`) and
/// checks it with [`redis_version_of`].
fn redis_version(bin: &Path, libs: Option<&str>) -> Result<String, String> {
    if !bin.is_file() {
        return Err(format!("{} missing", bin.display()));
    }
    let mut cmd = Command::new(bin);
    cmd.arg("--version");
    if let Some(libs) = libs {
        cmd.env("LD_LIBRARY_PATH", libs);
    }
    let out = run_cmd(&mut cmd)?;
    redis_version_of(&out).map_err(|e| format!("{}: {e}", bin.display()))
}

/// `redis-server --version` output (`Redis server v=7.0.15 sha=…`, or
/// Valkey's `Valkey server v=8.0.2 …`) as `Redis 7.0.15`, when at least
/// [`REDIS_MIN`].
fn redis_version_of(out: &str) -> Result<String, String> {
    let mut words = out.split_whitespace();
    let name = words.next().unwrap_or("");
    let v = words.find_map(|w| w.strip_prefix("v=")).unwrap_or("");
    match v.split('.').next().map(str::parse::<u32>) {
        Some(Ok(major)) if major >= REDIS_MIN => Ok(format!("{name} {v}")),
        Some(Ok(_)) => Err(format!(
            "{name} {v} is older than {REDIS_MIN} (the backend needs Redis 7)"
        )),
        _ => Err(format!(
            "unexpected `redis-server --version` output: {}",
            out.trim()
        )),
    }
}

/// Libraries `ldd` cannot find for `binary`.
fn missing_libraries(binary: &Path, libs: Option<&str>) -> Vec<String> {
    let mut cmd = Command::new("ldd");
    cmd.arg(binary);
    if let Some(libs) = libs {
        cmd.env("LD_LIBRARY_PATH", libs);
    }
    run_cmd(&mut cmd)
        .map(|out| {
            out.lines()
                .filter(|l| l.contains("not found"))
                .filter_map(|l| l.split_whitespace().next().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// libfaketime, preloaded into the private MongoDB-compatible server whose
/// wall clock the fault runs step (`lib/libfaketime.so.1`, from Debian's
/// `libfaketime` package; nothing is installed system-wide).
fn ensure_libfaketime(dir: &Path) -> Result<String, String> {
    let dest = dir.join("lib").join("libfaketime.so.1");
    if dest.is_file() {
        return Ok(format!(
            "libfaketime at {} (already present)",
            dest.display()
        ));
    }
    let triplet = match std::env::consts::ARCH {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        other => return Err(format!("no libfaketime path known for {other}")),
    };
    debian_package_from_system(
        dir,
        "libfaketime",
        &format!("usr/lib/{triplet}/faketime/libfaketime.so.1"),
        &dest,
    )?;
    Ok(format!(
        "libfaketime at {} (this release's libfaketime)",
        dest.display()
    ))
}

fn etcd_version(bin: &Path) -> Result<String, String> {
    if !bin.is_file() {
        return Err(format!("{} missing", bin.display()));
    }
    let out = run_cmd(Command::new(bin).arg("--version"))?;
    out.lines()
        .find_map(|l| l.strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("unexpected `etcd --version` output: {out}"))
}

fn ensure_nats(dir: &Path) -> Result<String, String> {
    let bin = dir.join("bin").join("nats-server");
    if let Ok(v) = nats_version(&bin) {
        return Ok(format!(
            "nats-server {v} at {} (already present)",
            bin.display()
        ));
    }
    debian_package_from_sid(dir, "nats-server", "usr/sbin/nats-server", &bin)?;
    let v = nats_version(&bin)?;
    Ok(format!(
        "nats-server {v} at {} (Debian sid nats-server)",
        bin.display()
    ))
}

/// Runs `nats-server --version` and checks it is at least [`NATS_MIN`].
fn nats_version(bin: &Path) -> Result<String, String> {
    if !bin.is_file() {
        return Err(format!("{} missing", bin.display()));
    }
    let out = run_cmd(Command::new(bin).arg("--version"))?;
    let v = out
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or("")
        .trim_start_matches('v')
        .to_string();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= NATS_MIN => Ok(v),
        (Some(_), Some(_)) => Err(format!(
            "nats-server {v} is older than {}.{} (no per-message TTL)",
            NATS_MIN.0, NATS_MIN.1
        )),
        _ => Err(format!("unexpected `nats-server --version` output: {out}")),
    }
}

/// Downloads `package` from Debian's `sid` suite through a temporary
/// sources list (the archive URI comes from this machine's apt
/// configuration), unpacks it and copies `binary_in_pkg` to `dest`.
fn debian_package_from_sid(
    dir: &Path,
    package: &str,
    binary_in_pkg: &str,
    dest: &Path,
) -> Result<(), String> {
    let work = dir.join(format!("tmp-{package}"));
    reset_dir(&work)?;
    let opts = sid_apt_options(dir)?;
    let debs = apt_download(&opts, &[package], &work)?;
    install_binary_from_debs(&work, package, &debs, binary_in_pkg, dest)?;
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// Same as [`debian_package_from_sid`] with the machine's own apt sources.
fn debian_package_from_system(
    dir: &Path,
    package: &str,
    binary_in_pkg: &str,
    dest: &Path,
) -> Result<(), String> {
    let work = dir.join(format!("tmp-{package}"));
    reset_dir(&work)?;
    system_apt_update()?;
    let debs = apt_download(&[], &[package], &work)?;
    install_binary_from_debs(&work, package, &debs, binary_in_pkg, dest)?;
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// Unpacks `debs` into `<work>/root` and copies `binary_in_pkg` to `dest`
/// (the caller removes `work`).
fn install_binary_from_debs(
    work: &Path,
    package: &str,
    debs: &[PathBuf],
    binary_in_pkg: &str,
    dest: &Path,
) -> Result<(), String> {
    let root = work.join("root");
    for deb in debs {
        dpkg_extract(deb, &root)?;
    }
    let src = root.join(binary_in_pkg);
    if !src.is_file() {
        return Err(format!("{package}: no {binary_in_pkg} in the package"));
    }
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    let tmp = dest.with_extension("partial");
    fs::copy(&src, &tmp)
        .map_err(|e| format!("copy {} to {}: {e}", src.display(), tmp.display()))?;
    set_executable(&tmp)?;
    fs::rename(&tmp, dest).map_err(|e| format!("rename to {}: {e}", dest.display()))?;
    Ok(())
}

/// apt options for a private `sid` sources list and lists dir under
/// `<dir>/apt-sid/`; runs `apt-get update` with them once per process.
static SID_UPDATED: AtomicBool = AtomicBool::new(false);

fn sid_apt_options(dir: &Path) -> Result<Vec<String>, String> {
    let base = dir.join("apt-sid");
    let lists = base.join("lists");
    let cache = base.join("cache");
    let list_file = base.join("sources.list");
    let opts = vec![
        format!("Dir::Etc::SourceList={}", list_file.display()),
        "Dir::Etc::SourceParts=/nonexistent".to_string(),
        format!("Dir::State::Lists={}", lists.display()),
        format!("Dir::Cache={}", cache.display()),
        "APT::Sandbox::User=root".to_string(),
        "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::CNF::DefaultEnabled=false".to_string(),
    ];
    if SID_UPDATED.load(Ordering::SeqCst) {
        return Ok(opts);
    }
    let archive = debian_archive()?;
    let signed_by = archive
        .signed_by
        .as_deref()
        .map(|k| format!(" [signed-by={k}]"))
        .unwrap_or_default();
    fs::create_dir_all(lists.join("partial")).map_err(|e| format!("mkdir: {e}"))?;
    fs::create_dir_all(cache.join("archives").join("partial"))
        .map_err(|e| format!("mkdir: {e}"))?;
    fs::write(
        &list_file,
        format!("deb{signed_by} {} sid main\n", archive.uri),
    )
    .map_err(|e| format!("write {}: {e}", list_file.display()))?;
    let mut cmd = Command::new("apt-get");
    for o in &opts {
        cmd.arg("-o").arg(o);
    }
    cmd.args(["--error-on=any", "update"]);
    run_cmd(&mut cmd).map_err(|e| format!("apt-get update (sid from {}): {e}", archive.uri))?;
    SID_UPDATED.store(true, Ordering::SeqCst);
    Ok(opts)
}

/// `apt-get update` with the machine's own configuration, once per process.
fn system_apt_update() -> Result<(), String> {
    static UPDATED: AtomicBool = AtomicBool::new(false);
    if UPDATED.load(Ordering::SeqCst) {
        return Ok(());
    }
    if !is_root() {
        return Err("not root: cannot run apt-get update".to_string());
    }
    run_cmd(Command::new("apt-get").arg("update")).map_err(|e| format!("apt-get update: {e}"))?;
    UPDATED.store(true, Ordering::SeqCst);
    Ok(())
}

/// `apt-get download` of `packages` into `into`; returns the .deb files.
fn apt_download(opts: &[String], packages: &[&str], into: &Path) -> Result<Vec<PathBuf>, String> {
    let mut cmd = Command::new("apt-get");
    for o in opts {
        cmd.arg("-o").arg(o);
    }
    if !opts.iter().any(|o| o.starts_with("APT::Sandbox::User")) {
        cmd.arg("-o").arg("APT::Sandbox::User=root");
    }
    cmd.arg("download").args(packages).current_dir(into);
    run_cmd(&mut cmd).map_err(|e| format!("apt-get download {}: {e}", packages.join(" ")))?;
    let mut debs: Vec<PathBuf> = fs::read_dir(into)
        .map_err(|e| format!("read {}: {e}", into.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension() == Some(OsStr::new("deb")))
        .collect();
    debs.sort();
    if debs.len() < packages.len() {
        return Err(format!(
            "apt-get download {} left only {debs:?}",
            packages.join(" ")
        ));
    }
    Ok(debs)
}

fn dpkg_extract(deb: &Path, into: &Path) -> Result<(), String> {
    fs::create_dir_all(into).map_err(|e| format!("mkdir {}: {e}", into.display()))?;
    run_cmd(Command::new("dpkg").arg("-x").arg(deb).arg(into))
        .map(|_| ())
        .map_err(|e| format!("dpkg -x {}: {e}", deb.display()))
}

struct Archive {
    uri: String,
    signed_by: Option<String>,
}

/// The archive serving this machine's main Debian suite, read from
/// `/etc/apt/sources.list.d/*.sources` (deb822) and `*.list` /
/// `/etc/apt/sources.list` (one-line format). No host name is hard-coded.
fn debian_archive() -> Result<Archive, String> {
    let mut candidates: Vec<SourceEntry> = Vec::new();
    let mut files: Vec<PathBuf> = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    for f in &files {
        let Ok(text) = fs::read_to_string(f) else {
            continue;
        };
        match f.extension().and_then(OsStr::to_str) {
            Some("sources") => candidates.extend(parse_deb822(&text)),
            Some("list") => candidates.extend(parse_one_line(&text)),
            _ => {}
        }
    }
    let codename = os_codename();
    let is_main_suite = |s: &str| {
        !s.contains('-')
            && (codename.as_deref() == Some(s)
                || matches!(s, "stable" | "testing" | "unstable" | "sid"))
    };
    candidates
        .iter()
        .find(|(uri, suites, comps, _)| {
            !uri.contains("security")
                && comps.iter().any(|c| c == "main")
                && suites.iter().any(|s| is_main_suite(s))
        })
        .or_else(|| {
            candidates.iter().find(|(uri, suites, comps, _)| {
                uri.contains("debian")
                    && !uri.contains("security")
                    && comps.iter().any(|c| c == "main")
                    && suites.iter().any(|s| !s.contains('-'))
            })
        })
        .map(|(uri, _, _, signed_by)| Archive {
            uri: uri.trim_end_matches('/').to_string(),
            signed_by: signed_by.clone(),
        })
        .ok_or_else(|| {
            "found no apt source serving the main Debian suite in /etc/apt/sources.list{,.d/}"
                .to_string()
        })
}

type SourceEntry = (String, Vec<String>, Vec<String>, Option<String>);

fn parse_deb822(text: &str) -> Vec<SourceEntry> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let mut types = Vec::new();
        let mut uris = Vec::new();
        let mut suites = Vec::new();
        let mut comps = Vec::new();
        let mut signed_by = None;
        let mut enabled = true;
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let words = || {
                value
                    .split_whitespace()
                    .map(String::from)
                    .collect::<Vec<_>>()
            };
            match key.trim().to_ascii_lowercase().as_str() {
                "types" => types = words(),
                "uris" => uris = words(),
                "suites" => suites = words(),
                "components" => comps = words(),
                "signed-by" => {
                    let v = value.trim();
                    if v.starts_with('/') && !v.contains(char::is_whitespace) {
                        signed_by = Some(v.to_string());
                    }
                }
                "enabled" => enabled = value.trim() != "no",
                _ => {}
            }
        }
        if enabled && types.iter().any(|t| t == "deb") {
            for uri in uris {
                out.push((uri, suites.clone(), comps.clone(), signed_by.clone()));
            }
        }
    }
    out
}

fn parse_one_line(text: &str) -> Vec<SourceEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("deb ") else {
            continue;
        };
        let mut rest = rest.trim();
        let mut signed_by = None;
        if let Some(after) = rest.strip_prefix('[') {
            let Some((options, tail)) = after.split_once(']') else {
                continue;
            };
            for opt in options.split_whitespace() {
                if let Some(v) = opt.strip_prefix("signed-by=") {
                    signed_by = Some(v.to_string());
                }
            }
            rest = tail.trim();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push((
            uri.to_string(),
            vec![suite.to_string()],
            words.map(String::from).collect(),
            signed_by,
        ));
    }
    out
}

fn os_codename() -> Option<String> {
    let text = fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
}

// ---------------------------------------------------------- Python venvs

fn ensure_moto(dir: &Path) -> Result<String, String> {
    let venv = dir.join("moto");
    let check = launcher_dir().join("moto_check.py");
    let marker = venv.join(".lease-ok");
    let python = venv.join("bin").join("python");
    if marker.is_file() {
        if let Ok(v) = python_package_version(&python, "moto") {
            if python_imports(&python, &["moto", "flask", "flask_cors", "boto3"]) {
                return Ok(format!("moto {v} at {} (already present)", venv.display()));
            }
        }
    }
    let mut last_err = String::new();
    for spec in MOTO_SPECS {
        create_venv(&venv)?;
        match pip_install(&venv, &[spec, "flask", "flask-cors"]) {
            Ok(()) => {
                last_err.clear();
                break;
            }
            Err(e) => {
                eprintln!("provision: pip install {spec} failed: {e}");
                last_err = e;
            }
        }
    }
    if !last_err.is_empty() {
        return Err(last_err);
    }
    let summary = run_cmd(Command::new(&python).arg(&check))
        .map_err(|e| format!("{} failed: {e}", check.display()))?;
    fs::write(&marker, summary.trim()).map_err(|e| format!("write marker: {e}"))?;
    let v = python_package_version(&python, "moto")?;
    Ok(format!(
        "moto {v} at {} (pip; {})",
        venv.display(),
        summary.trim().trim_start_matches("moto_check: ")
    ))
}

fn ensure_secantus(dir: &Path) -> Result<String, String> {
    let venv = dir.join("secantus");
    let check = launcher_dir().join("secantus_check.py");
    let marker = venv.join(".lease-ok");
    let python = venv.join("bin").join("python");
    let server = venv.join("bin").join("secantusd-py");
    if marker.is_file() && server.is_file() {
        if let Ok(v) = python_package_version(&python, "secantusdb") {
            return Ok(format!(
                "secantusdb {v} at {} (already present)",
                server.display()
            ));
        }
    }
    create_venv(&venv)?;
    pip_install(&venv, &[SECANTUS_SPEC])?;
    if !server.is_file() {
        return Err(format!("{} missing after pip install", server.display()));
    }
    let summary = run_cmd(Command::new(&python).arg(&check))
        .map_err(|e| format!("{} failed: {e}", check.display()))?;
    fs::write(&marker, summary.trim()).map_err(|e| format!("write marker: {e}"))?;
    let v = python_package_version(&python, "secantusdb")?;
    Ok(format!(
        "secantusdb {v} at {} (pip; {})",
        server.display(),
        summary.trim().trim_start_matches("secantus_check: ")
    ))
}

/// A fresh virtualenv at `venv` (any previous one is removed).
fn create_venv(venv: &Path) -> Result<(), String> {
    let _ = fs::remove_dir_all(venv);
    let python = which("python3").ok_or("python3 not found on PATH")?;
    let first = run_cmd(Command::new(&python).arg("-m").arg("venv").arg(venv));
    if first.is_ok() {
        return Ok(());
    }
    // Debian's own python3 needs python3-venv for `-m venv`.
    let _ = fs::remove_dir_all(venv);
    if is_root() && system_apt_update().is_ok() {
        let _ = run_cmd(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "python3-venv"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        );
        let _ = fs::remove_dir_all(venv);
        if run_cmd(Command::new(&python).arg("-m").arg("venv").arg(venv)).is_ok() {
            return Ok(());
        }
    }
    first
        .map(|_| ())
        .map_err(|e| format!("python3 -m venv {}: {e}", venv.display()))
}

fn pip_install(venv: &Path, specs: &[&str]) -> Result<(), String> {
    let python = venv.join("bin").join("python");
    run_cmd(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(specs),
    )
    .map(|_| ())
    .map_err(|e| format!("pip install {}: {e}", specs.join(" ")))
}

fn python_package_version(python: &Path, dist: &str) -> Result<String, String> {
    let out = run_cmd(Command::new(python).args([
        "-c",
        &format!("import importlib.metadata as m; print(m.version({dist:?}))"),
    ]))?;
    Ok(out.trim().to_string())
}

fn python_imports(python: &Path, modules: &[&str]) -> bool {
    run_cmd(Command::new(python).args(["-c", &format!("import {}", modules.join(", "))])).is_ok()
}

// ---------------------------------------------------------------- helpers

/// Runs a command to completion; Ok(stdout) on success, otherwise an error
/// naming the command with the tail of its stderr.
fn run_cmd(cmd: &mut Command) -> Result<String, String> {
    let shown = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out: Output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let mut tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        tail.reverse();
        Err(format!(
            "`{shown}` failed ({}): {}",
            out.status,
            if tail.is_empty() {
                stdout.trim().to_string()
            } else {
                tail.join(" | ")
            }
        ))
    }
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self is owned by the effective uid of this process.
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

fn reset_dir(dir: &Path) -> Result<(), String> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_deb822_sources() {
        let text = "Types: deb\n# a comment\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/k.gpg\n\nTypes: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\nComponents: main\n";
        let entries = parse_deb822(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].0, "http://mirror.invalid/debian");
        assert_eq!(entries[0].1, vec!["bookworm", "bookworm-updates"]);
        assert_eq!(entries[0].3.as_deref(), Some("/usr/share/keyrings/k.gpg"));
    }

    #[test]
    fn reads_redis_versions() {
        let ok = |out: &str| redis_version_of(out).expect(out);
        assert_eq!(
            ok("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n"),
            "Redis 7.0.15"
        );
        assert_eq!(
            ok("Valkey server v=8.0.2 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=1"),
            "Valkey 8.0.2"
        );
        let old =
            redis_version_of("Redis server v=6.0.16 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64")
                .expect_err("6 is too old");
        assert!(old.contains("older than 7"), "{old}");
        let odd = redis_version_of("redis-check-rdb 7.0.15").expect_err("not a server");
        assert!(odd.contains("unexpected"), "{odd}");
    }

    #[test]
    fn parses_one_line_sources() {
        let text = "# c\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.invalid/debian bookworm main contrib\ndeb-src http://x bookworm main\n";
        let entries = parse_one_line(text);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, "http://mirror.invalid/debian");
        assert_eq!(entries[0].1, vec!["bookworm"]);
        assert_eq!(entries[0].2, vec!["main", "contrib"]);
        assert_eq!(entries[0].3.as_deref(), Some("/k.gpg"));
    }
}
