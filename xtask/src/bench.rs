//! `cargo xtask bench [--quick] [--backend …] […]`: provisions the test
//! servers the chosen backends need, then runs the `lease-bench` binary
//! (release build) with the test environment; it starts the servers through
//! `lease-testkit` and writes `target/bench/{results.md,
//! results.json, chart.png}`. Arguments are passed through (see
//! `cargo run -p lease-bench -- --help`). Not part of `cargo xtask test`.

use std::time::Instant;

use crate::{cargo, provision, step};

pub fn run(args: &[String]) -> Result<(), String> {
    let mut servers: Vec<String> = vec!["all".into()];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let list = if a == "--backend" || a == "--backends" {
            it.next().cloned()
        } else {
            a.strip_prefix("--backend=")
                .or_else(|| a.strip_prefix("--backends="))
                .map(String::from)
        };
        if let Some(list) = list {
            servers = list
                .split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty() && *b != "fake")
                // lease-etcd with sessions runs on the etcd server, and
                // lease-postgres with its statement cache on the PostgreSQL one.
                .map(|b| match b {
                    "etcd-own-leases" => "etcd",
                    "postgres-statement-cache" => "postgres",
                    b => b,
                })
                .map(String::from)
                .collect();
        }
    }
    let refs: Vec<&str> = servers.iter().map(String::as_str).collect();
    // Always at least protoc: etcd-client's build script needs it.
    let provisioning = Instant::now();
    provision::ensure(if refs.is_empty() {
        &["protoc"][..]
    } else {
        &refs[..]
    })?;
    eprintln!(
        "xtask: provision: {:.1}s",
        provisioning.elapsed().as_secs_f64()
    );
    ensure_font();
    let start = Instant::now();
    let result = step(
        "bench",
        cargo()
            .args(["run", "--release", "-p", "lease-bench", "--"])
            .args(args)
            .envs(provision::env_for_tests()),
    );
    eprintln!("xtask: bench: {:.1}s", start.elapsed().as_secs_f64());
    result
}

/// The chart's text needs a TrueType font (DejaVu Sans on Debian, present
/// in this project's machine image); on a machine without one, install it.
fn ensure_font() {
    let known = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    if known.iter().any(|p| std::path::Path::new(p).is_file()) {
        return;
    }
    eprintln!("xtask: bench: no DejaVu Sans for the chart; installing fonts-dejavu-core");
    let _ = std::process::Command::new("apt-get")
        .args([
            "install",
            "-y",
            "--no-install-recommends",
            "fonts-dejavu-core",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
}
