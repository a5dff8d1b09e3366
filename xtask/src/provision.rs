//! `cargo xtask provision`: the native test servers, installed by
//! `lease_testkit::provision` (which the tests' launchers share) under
//! `target/lease-servers/` (or `$LEASE_SERVERS_DIR`).

pub use lease_testkit::provision::{ensure, env_for_tests};
use lease_testkit::{servers_dir, SERVER_BACKENDS};

/// `cargo xtask provision [--backend etcd,nats,s3,mongo,postgres,redis]`
/// (default: all, plus protoc).
pub fn run(args: &[String]) -> Result<(), String> {
    let mut backends: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let list = if arg == "--backend" || arg == "--backends" {
            it.next()
                .ok_or_else(|| format!("{arg} needs a value such as etcd,redis"))?
                .clone()
        } else if let Some(v) = arg
            .strip_prefix("--backend=")
            .or_else(|| arg.strip_prefix("--backends="))
        {
            v.to_string()
        } else if arg == "-h" || arg == "--help" {
            println!(
                "usage: cargo xtask provision [--backend {},protoc|all]\n\
                 Installs native test servers under {}",
                SERVER_BACKENDS.join(","),
                servers_dir().display()
            );
            return Ok(());
        } else {
            return Err(format!(
                "provision: unknown argument {arg:?} (usage: cargo xtask provision [--backend {},protoc|all])",
                SERVER_BACKENDS.join(",")
            ));
        };
        backends.extend(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
    }
    if backends.is_empty() {
        backends.push("all".to_string());
    }
    let refs: Vec<&str> = backends.iter().map(String::as_str).collect();
    let start = std::time::Instant::now();
    ensure(&refs)?;
    eprintln!("xtask: provision: {:.1}s", start.elapsed().as_secs_f64());
    for (k, v) in env_for_tests() {
        println!("provision: test env {k}={v}");
    }
    Ok(())
}
