//! TLS and credentials for etcd and NATS: the options, checked and read
//! before anything connects.
//!
//! MongoDB takes its TLS and credentials in its URL (`?tls=true&tlsCAFile=…`,
//! `mongodb://user:password@…`) and S3 from the AWS environment variables, so
//! these options apply to etcd and NATS only, and are refused elsewhere rather
//! than silently ignored.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::target::Target;

/// TLS and credential options (etcd and NATS).
#[derive(Args, Debug, Default, Clone)]
#[command(next_help_heading = "TLS and credentials (etcd, NATS)")]
pub struct Access {
    /// CA certificates (PEM) that signed the servers' certificates; turns
    /// TLS on. Needed for etcds:// (etcd has no system trust store here);
    /// natss:// without it trusts the system's roots.
    #[arg(long, env = "LEASE_CACERT", value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM) for TLS client authentication; turns TLS on
    /// and needs --key.
    #[arg(long, env = "LEASE_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long = "key",
        id = "cert_key",
        env = "LEASE_CERT_KEY",
        value_name = "FILE"
    )]
    pub cert_key: Option<PathBuf>,
    /// User name, or USER:PASSWORD (etcd auth, NATS user/password).
    #[arg(long, env = "LEASE_USER", value_name = "USER[:PASSWORD]")]
    pub user: Option<String>,
    /// The password of --user (better from LEASE_PASSWORD than the command
    /// line, where other users can read it).
    #[arg(long, env = "LEASE_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// NATS authentication token.
    #[arg(long, env = "LEASE_NATS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// NATS credentials file (user JWT and nkey seed, as `nsc` writes it).
    #[arg(long, env = "LEASE_NATS_CREDS", value_name = "FILE")]
    pub creds: Option<PathBuf>,
    /// NATS nkey seed file (a line starting with SU).
    #[arg(long, env = "LEASE_NATS_NKEY", value_name = "FILE")]
    pub nkey: Option<PathBuf>,
}

/// The options read and checked against the backend they are for.
#[derive(Default)]
pub struct Material {
    /// TLS is on (by the scheme or a TLS option).
    pub tls: bool,
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key, PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The key files, for async-nats (which reads them itself).
    pub identity_files: Option<(PathBuf, PathBuf)>,
    pub ca_file: Option<PathBuf>,
    pub user: Option<(String, String)>,
    pub token: Option<String>,
    pub creds: Option<PathBuf>,
    pub nkey_seed: Option<String>,
}

impl Access {
    /// Checks the options against `target` and reads the files they name;
    /// a mistake is a usage error, before anything connects.
    pub fn load(&self, target: &Target) -> Result<Material, String> {
        let (backend, scheme_tls) = match target {
            Target::Etcd { tls, .. } => ("etcd", *tls),
            Target::Nats { tls, .. } => ("nats", *tls),
            Target::Mongo { .. } => ("mongodb", false),
            Target::S3 { .. } => ("s3", false),
        };
        let given = self.given();
        if matches!(backend, "mongodb" | "s3") {
            if let Some(first) = given.first() {
                let instead = if backend == "s3" {
                    "S3 takes credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, and an https:// endpoint"
                } else {
                    "MongoDB takes them in its URL: mongodb://user:password@host/db?tls=true&tlsCAFile=FILE&tlsCertificateKeyFile=FILE"
                };
                return Err(format!("{first} applies to etcd and NATS only; {instead}"));
            }
            return Ok(Material::default());
        }
        if backend == "etcd" {
            for (set, name) in [
                (self.token.is_some(), "--token"),
                (self.creds.is_some(), "--creds"),
                (self.nkey.is_some(), "--nkey"),
            ] {
                if set {
                    return Err(format!("{name} applies to NATS only"));
                }
            }
        }
        let identity_files = match (&self.cert, &self.cert_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            (Some(_), None) => {
                return Err("--cert needs --key (the certificate's private key)".into())
            }
            (None, Some(_)) => return Err("--key needs --cert (the client certificate)".into()),
        };
        let tls = scheme_tls || self.cacert.is_some() || identity_files.is_some();
        let ca_pem = self
            .cacert
            .as_deref()
            .map(|p| pem(p, "--cacert"))
            .transpose()?;
        if backend == "etcd" && tls && ca_pem.is_none() {
            return Err(
                "TLS to etcd needs --cacert FILE: the CA that signed the etcd servers' certificates"
                    .into(),
            );
        }
        let identity = match &identity_files {
            Some((c, k)) => Some((pem(c, "--cert")?, pem(k, "--key")?)),
            None => None,
        };
        let user =
            match (&self.user, &self.password) {
                (None, None) => None,
                (None, Some(_)) => return Err("--password needs --user".into()),
                (Some(u), password) => {
                    let (name, inline) = match u.split_once(':') {
                        Some((n, p)) => (n, Some(p)),
                        None => (u.as_str(), None),
                    };
                    if name.is_empty() {
                        return Err("--user: empty user name".into());
                    }
                    let password = match (inline, password) {
                    (Some(_), Some(_)) => return Err(
                        "the password is given twice: in --user USER:PASSWORD and in --password"
                            .into(),
                    ),
                    (Some(p), None) => p.to_owned(),
                    (None, Some(p)) => p.clone(),
                    (None, None) => return Err(format!(
                        "--user {name} needs a password: --user {name}:PASSWORD, or LEASE_PASSWORD"
                    )),
                };
                    Some((name.to_owned(), password))
                }
            };
        let methods = [
            user.is_some(),
            self.token.is_some(),
            self.creds.is_some(),
            self.nkey.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err("give one of --user, --token, --creds and --nkey".into());
        }
        if let Some(c) = &self.creds {
            readable(c, "--creds")?;
        }
        let nkey_seed = match &self.nkey {
            Some(p) => Some(seed(p)?),
            None => None,
        };
        Ok(Material {
            tls,
            ca_pem,
            identity,
            identity_files,
            ca_file: self.cacert.clone(),
            user,
            token: self.token.clone(),
            creds: self.creds.clone(),
            nkey_seed,
        })
    }

    /// The options given, by name.
    fn given(&self) -> Vec<&'static str> {
        [
            (self.cacert.is_some(), "--cacert"),
            (self.cert.is_some(), "--cert"),
            (self.cert_key.is_some(), "--key"),
            (self.user.is_some(), "--user"),
            (self.password.is_some(), "--password"),
            (self.token.is_some(), "--token"),
            (self.creds.is_some(), "--creds"),
            (self.nkey.is_some(), "--nkey"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

fn readable(path: &Path, option: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{option} {}: {e}", path.display()))
}

/// A PEM file: read, and refused early when it is not PEM at all.
fn pem(path: &Path, option: &str) -> Result<Vec<u8>, String> {
    let bytes = readable(path, option)?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{option} {}: not a PEM file", path.display()));
    }
    Ok(bytes)
}

/// An nkey seed file: the first line that looks like a user seed.
fn seed(path: &Path) -> Result<String, String> {
    let text = String::from_utf8(readable(path, "--nkey")?)
        .map_err(|_| format!("--nkey {}: not a text file", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "--nkey {}: no user nkey seed (a line starting with SU)",
                path.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(tls: bool) -> Target {
        Target::Etcd {
            endpoints: vec!["https://h:2379".into()],
            prefix: "lease/".into(),
            tls,
        }
    }

    #[test]
    fn mistakes_are_named() {
        let s3 = Target::parse("s3://b/p").expect("url");
        let with_token = Access {
            token: Some("t".into()),
            ..Access::default()
        };
        let e = with_token.load(&s3).err().unwrap_or_default();
        assert!(e.contains("--token applies to etcd and NATS only"), "{e}");
        let e = with_token.load(&etcd(false)).err().unwrap_or_default();
        assert!(e.contains("NATS only"), "{e}");
        let e = Access::default()
            .load(&etcd(true))
            .err()
            .unwrap_or_default();
        assert!(e.contains("--cacert"), "{e}");
        let half = Access {
            cert: Some("c.pem".into()),
            ..Access::default()
        };
        let e = half.load(&etcd(false)).err().unwrap_or_default();
        assert!(e.contains("--cert needs --key"), "{e}");
        let no_password = Access {
            user: Some("root".into()),
            ..Access::default()
        };
        let e = no_password.load(&etcd(false)).err().unwrap_or_default();
        assert!(e.contains("needs a password"), "{e}");
        let missing = Access {
            cacert: Some("/nonexistent/ca.pem".into()),
            ..Access::default()
        };
        let e = missing.load(&etcd(false)).err().unwrap_or_default();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn user_and_password_forms() {
        let inline = Access {
            user: Some("root:s:cret".into()),
            ..Access::default()
        };
        let m = inline.load(&etcd(false)).expect("loads");
        assert_eq!(m.user, Some(("root".into(), "s:cret".into())));
        assert!(!m.tls);
        let separate = Access {
            user: Some("root".into()),
            password: Some("pw".into()),
            ..Access::default()
        };
        let m = separate.load(&etcd(false)).expect("loads");
        assert_eq!(m.user, Some(("root".into(), "pw".into())));
        let twice = Access {
            user: Some("root:a".into()),
            password: Some("b".into()),
            ..Access::default()
        };
        assert!(twice.load(&etcd(false)).is_err());
    }
}
