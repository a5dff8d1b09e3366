//! TLS and credentials for etcd and NATS, and the CA for Redis: the
//! options, checked and read before anything connects.
//!
//! MongoDB takes its TLS and credentials in its URL (`?tls=true&tlsCAFile=…`,
//! `mongodb://user:password@…`), PostgreSQL and Redis their credentials in
//! theirs, and S3 from the AWS environment variables, so these options apply
//! to etcd and NATS (and `--cacert` to Redis) only, and are refused
//! elsewhere rather than silently ignored.

use std::path::{Path, PathBuf};

use clap::Args;

use lease::{BackendKind, BackendUrl, Connect};

/// The help heading of the TLS and credential options.
pub const HEADING: &str = "TLS and credentials (etcd, NATS; --cacert for Redis too)";

/// TLS and credential options (etcd and NATS; the CA for Redis).
///
/// Each option names its heading itself: a heading set for the group would
/// carry over to every option of the command declared after it.
#[derive(Args, Debug, Default, Clone)]
pub struct Access {
    /// CA certificates (PEM) that signed the servers' certificates; turns
    /// TLS on. Needed for etcds:// (etcd has no system trust store here);
    /// natss:// and rediss:// without it trust the system's roots.
    #[arg(help_heading = HEADING, long, env = "LEASE_CACERT", value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM) for TLS client authentication; turns TLS on
    /// and needs --key.
    #[arg(help_heading = HEADING, long, env = "LEASE_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        help_heading = HEADING,
        long = "key",
        id = "cert_key",
        env = "LEASE_CERT_KEY",
        value_name = "FILE"
    )]
    pub cert_key: Option<PathBuf>,
    /// User name, or USER:PASSWORD (etcd auth, NATS user/password).
    #[arg(help_heading = HEADING, long, env = "LEASE_USER", value_name = "USER[:PASSWORD]")]
    pub user: Option<String>,
    /// The password of --user (better from LEASE_PASSWORD than the command
    /// line, where other users can read it).
    #[arg(help_heading = HEADING, long, env = "LEASE_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// NATS authentication token.
    #[arg(help_heading = HEADING, long, env = "LEASE_NATS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// NATS credentials file (user JWT and nkey seed, as `nsc` writes it).
    #[arg(help_heading = HEADING, long, env = "LEASE_NATS_CREDS", value_name = "FILE")]
    pub creds: Option<PathBuf>,
    /// NATS nkey seed file (a line starting with SU).
    #[arg(help_heading = HEADING, long, env = "LEASE_NATS_NKEY", value_name = "FILE")]
    pub nkey: Option<PathBuf>,
}

impl Access {
    /// Checks the options against `url` and reads the files they name (a
    /// mistake is a usage error, before anything connects), then hands them
    /// to `connect`.
    pub fn apply(&self, url: &BackendUrl, connect: Connect) -> Result<Connect, String> {
        let kind = url.kind();
        let given = self.given();
        if kind == BackendKind::Redis {
            return self.redis(connect);
        }
        if !matches!(kind, BackendKind::Etcd | BackendKind::Nats) {
            if let Some(first) = given.first() {
                let instead = match kind {
                    BackendKind::S3 => "S3 takes credentials and TLS settings from the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, container and instance credentials, …) and an https:// endpoint",
                    BackendKind::Mongo => "MongoDB takes them in its URL: mongodb://user:password@host/db?tls=true&tlsCAFile=FILE&tlsCertificateKeyFile=FILE",
                    BackendKind::Postgres => "PostgreSQL takes them in its URL: postgres://user:password@host/db?sslmode=…",
                    _ => "this backend takes none",
                };
                return Err(format!("{first} applies to etcd and NATS only; {instead}"));
            }
            return Ok(connect);
        }
        if kind == BackendKind::Etcd {
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
        let tls = url.tls() || self.cacert.is_some() || identity_files.is_some();
        if let Some(ca) = &self.cacert {
            pem(ca, "--cacert")?;
        }
        if kind == BackendKind::Etcd && tls && self.cacert.is_none() {
            return Err(
                "TLS to etcd needs --cacert FILE: the CA that signed the etcd servers' certificates"
                    .into(),
            );
        }
        if let Some((c, k)) = &identity_files {
            pem(c, "--cert")?;
            pem(k, "--key")?;
        }
        let user = self.user_and_password()?;
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
        // The files as files: async-nats reads them itself, as it always
        // has for `lease`; the library reads them for etcd.
        let mut connect = connect;
        if let Some(ca) = &self.cacert {
            connect = connect.ca_file(ca);
        }
        if let Some((cert, key)) = identity_files {
            connect = connect.identity_files(cert, key);
        }
        if let Some((name, password)) = user {
            connect = connect.user(name, password);
        }
        if let Some(token) = &self.token {
            connect = connect.nats_token(token);
        }
        if let Some(creds) = &self.creds {
            connect = connect.nats_credentials_file(creds);
        }
        if let Some(seed) = nkey_seed {
            connect = connect.nats_nkey_seed(seed);
        }
        Ok(connect)
    }

    /// Redis takes `--cacert` alone: its user and password are in its URL,
    /// and its TLS authenticates the server only.
    fn redis(&self, connect: Connect) -> Result<Connect, String> {
        if let Some(other) = self.given().into_iter().find(|g| *g != "--cacert") {
            let why = match other {
                "--user" | "--password" => {
                    "Redis takes its user and password in its URL: redis://user:password@host:6379/0"
                }
                "--cert" | "--key" => {
                    "TLS to Redis authenticates the server only: give its CA with --cacert, no client certificate"
                }
                _ => "it applies to NATS only",
            };
            return Err(format!("{other} does not apply to Redis: {why}"));
        }
        match &self.cacert {
            Some(ca) => {
                pem(ca, "--cacert")?;
                Ok(connect.ca_file(ca))
            }
            None => Ok(connect),
        }
    }

    /// `--user USER[:PASSWORD]` and `--password`, as one user and password.
    fn user_and_password(&self) -> Result<Option<(String, String)>, String> {
        let (u, password) = match (&self.user, &self.password) {
            (None, None) => return Ok(None),
            (None, Some(_)) => return Err("--password needs --user".into()),
            (Some(u), password) => (u, password),
        };
        let (name, inline) = match u.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (u.as_str(), None),
        };
        if name.is_empty() {
            return Err("--user: empty user name".into());
        }
        let password = match (inline, password) {
            (Some(_), Some(_)) => {
                return Err(
                    "the password is given twice: in --user USER:PASSWORD and in --password".into(),
                )
            }
            (Some(p), None) => p.to_owned(),
            (None, Some(p)) => p.clone(),
            (None, None) => {
                return Err(format!(
                    "--user {name} needs a password: --user {name}:PASSWORD, or LEASE_PASSWORD"
                ))
            }
        };
        Ok(Some((name.to_owned(), password)))
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

    fn etcd(tls: bool) -> BackendUrl {
        let url = if tls {
            "etcds://h:2379"
        } else {
            "etcd://h:2379"
        };
        BackendUrl::parse(url).expect("url")
    }

    fn refused(access: &Access, url: &BackendUrl) -> String {
        access
            .apply(url, Connect::from(url.clone()))
            .err()
            .unwrap_or_default()
    }

    #[test]
    fn mistakes_are_named() {
        let s3 = BackendUrl::parse("s3://b/p").expect("url");
        let with_token = Access {
            token: Some("t".into()),
            ..Access::default()
        };
        let e = refused(&with_token, &s3);
        assert!(e.contains("--token applies to etcd and NATS only"), "{e}");
        let e = refused(&with_token, &etcd(false));
        assert!(e.contains("NATS only"), "{e}");
        let e = refused(&Access::default(), &etcd(true));
        assert!(e.contains("--cacert"), "{e}");
        let half = Access {
            cert: Some("c.pem".into()),
            ..Access::default()
        };
        let e = refused(&half, &etcd(false));
        assert!(e.contains("--cert needs --key"), "{e}");
        let no_password = Access {
            user: Some("root".into()),
            ..Access::default()
        };
        let e = refused(&no_password, &etcd(false));
        assert!(e.contains("needs a password"), "{e}");
        let missing = Access {
            cacert: Some("/nonexistent/ca.pem".into()),
            ..Access::default()
        };
        let e = refused(&missing, &etcd(false));
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let two = Access {
            token: Some("t".into()),
            user: Some("u:p".into()),
            ..Access::default()
        };
        let nats = BackendUrl::parse("nats://h:4222").expect("url");
        let e = refused(&two, &nats);
        assert!(e.contains("give one of"), "{e}");
    }

    #[test]
    fn redis_takes_the_ca_alone() {
        let redis = BackendUrl::parse("rediss://h:6380/0").expect("url");
        for (access, said) in [
            (
                Access {
                    user: Some("u:p".into()),
                    ..Access::default()
                },
                "--user does not apply to Redis: Redis takes its user and password in its URL",
            ),
            (
                Access {
                    cacert: Some("ca.pem".into()),
                    cert: Some("c.pem".into()),
                    cert_key: Some("k.pem".into()),
                    ..Access::default()
                },
                "--cert does not apply to Redis: TLS to Redis authenticates the server only",
            ),
            (
                Access {
                    token: Some("t".into()),
                    ..Access::default()
                },
                "--token does not apply to Redis: it applies to NATS only",
            ),
            (
                Access {
                    cacert: Some("/nonexistent/ca.pem".into()),
                    ..Access::default()
                },
                "/nonexistent/ca.pem",
            ),
        ] {
            let e = refused(&access, &redis);
            assert!(e.contains(said), "{e}");
        }
        assert!(Access::default()
            .apply(&redis, Connect::from(redis.clone()))
            .is_ok());
    }

    #[test]
    fn user_and_password_forms() {
        let inline = Access {
            user: Some("root:s:cret".into()),
            ..Access::default()
        };
        assert_eq!(
            inline.user_and_password(),
            Ok(Some(("root".into(), "s:cret".into())))
        );
        assert!(inline
            .apply(&etcd(false), Connect::from(etcd(false)))
            .is_ok());
        let separate = Access {
            user: Some("root".into()),
            password: Some("pw".into()),
            ..Access::default()
        };
        assert_eq!(
            separate.user_and_password(),
            Ok(Some(("root".into(), "pw".into())))
        );
        let twice = Access {
            user: Some("root:a".into()),
            password: Some("b".into()),
            ..Access::default()
        };
        assert!(twice.user_and_password().is_err());
        let only_password = Access {
            password: Some("b".into()),
            ..Access::default()
        };
        assert!(only_password.user_and_password().is_err());
    }
}
