//! The `lease` crate's tests, in one test binary: `connect` without a
//! server, `etcd` on a real etcd (with the `etcd` feature), `nats_tls`
//! on a TLS nats-server (with the `nats` feature) and `redis` on a real
//! Redis (with the `redis` feature).
//!
//! They share one process safely: none sets process-wide state (the
//! environment, signal handlers), and no backend installs a process-wide
//! rustls crypto provider, so which test runs first changes nothing for
//! the others' TLS clients.

mod connect;
mod etcd;
mod mongo;
mod nats_tls;
mod redis;
