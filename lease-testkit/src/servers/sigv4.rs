//! Just enough AWS Signature Version 4 to create a bucket on a server that
//! checks signatures (MinIO in the container fallback; moto accepts the
//! unsigned request the native path sends). SHA-256 and HMAC come from the
//! RustCrypto crates; the tests check the signature against botocore's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Credentials and region to sign for.
pub(crate) struct Signer<'a> {
    pub(crate) access_key: &'a str,
    pub(crate) secret_key: &'a str,
    pub(crate) region: &'a str,
}

impl Signer<'_> {
    /// Headers (besides `Host`) for a request with an empty body and no
    /// query, signed now.
    pub(crate) fn headers(
        &self,
        method: &str,
        host: &str,
        path: &str,
    ) -> Vec<(&'static str, String)> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.headers_at(method, host, path, secs)
    }

    pub(crate) fn headers_at(
        &self,
        method: &str,
        host: &str,
        path: &str,
        unix_secs: u64,
    ) -> Vec<(&'static str, String)> {
        let amz_date = amz_date(unix_secs);
        let day = &amz_date[..8];
        let signed = "host;x-amz-content-sha256;x-amz-date";
        let canonical = format!(
            "{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{EMPTY_SHA256}\nx-amz-date:{amz_date}\n\n{signed}\n{EMPTY_SHA256}"
        );
        let scope = format!("{day}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(&sha256(canonical.as_bytes()))
        );
        let key = signing_key(self.secret_key, day, self.region, "s3");
        let signature = hex(&hmac(&key, to_sign.as_bytes()));
        vec![
            ("x-amz-content-sha256", EMPTY_SHA256.to_string()),
            ("x-amz-date", amz_date),
            (
                "Authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
                    self.access_key
                ),
            ),
        ]
    }
}

pub(crate) fn signing_key(secret: &str, day: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), day.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC): RFC 3339 without
/// the separators.
pub(crate) fn amz_date(unix_secs: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(unix_secs);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace(['-', ':'], "")
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}
