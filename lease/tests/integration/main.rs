//! The `lease` crate's tests, in one test binary: `connect` without a
//! server, `etcd` on a real etcd (with the `etcd` feature) and `nats_tls`
//! on a TLS nats-server (with the `nats` feature).
//!
//! They share one process safely: none sets process-wide state; the TLS
//! clients install the same rustls crypto provider (ring) only when none
//! is installed.

mod connect;
mod etcd;
mod nats_tls;
