//! `cargo xtask`: project automation.
//!
//! - `cargo xtask test [--no-lint] [--backend fake,etcd,…]`: the one command CI and contributors
//!   run — format and import-circle checks, test-server provisioning, clippy
//!   (the default features and the other feature sets that matter) and
//!   rustdoc with warnings denied (beside the tests), every test
//!   of the workspace (the conformance suite on every backend present
//!   included), and the backend × property matrix; `--backend` keeps only
//!   the server backends named (their provisioning, tests and matrix
//!   columns).
//! - `cargo xtask conformance [--backend fake,etcd,…]`: only the conformance
//!   suite, with the matrix.
//! - `cargo xtask provision [--backend etcd,nats,s3,mongo,postgres,redis]`: install the
//!   native test servers under `target/lease-servers/` (with
//!   `lease-testkit`'s provisioning, which the tests' launchers share).
//! - `cargo xtask circles`: import circles between the modules of each
//!   crate (`test` runs it with its lint).
//! - `cargo xtask bench`: the benchmarks (see `lease-bench`), written to
//!   `target/bench/`.

mod bench;
mod circles;
mod conformance;
mod parallel;
mod provision;
mod public_docs;

use std::process::Command;

use lease_testkit::workspace_root;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test [--no-lint] [--backend NAME,...]  fmt check, provision, clippy (default and other feature sets) and rustdoc -D warnings,
                                         all tests, conformance matrix; --no-lint: provision, tests and matrix only;
                                         --backend: only these backends' servers, tests and matrix columns
  conformance [--backend NAME,...] [--soak SECS]  the conformance suite and fault runs with their matrix (backends: fake, etcd, nats, s3, mongo, postgres, redis; default: every backend present)
  provision [--backend etcd,nats,s3,mongo,postgres,redis]  install the native test servers under target/lease-servers/
  bench [--quick] [--backend NAME,...]   benchmarks: latency, requests, failover, scale; writes target/bench/
  circles                                import circles between the modules of each crate (also part of test's lint)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("provision") => provision::run(&args[1..]),
        Some("conformance") => conformance::run(&args[1..]),
        Some("test") => conformance::test(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("circles") => circles::check(),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}

/// A `cargo` command run from the workspace root.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Runs `cmd`, echoing it; an error names the step that failed.
pub fn step(name: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {name}: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("{name}: could not run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name} failed ({status})"))
    }
}
