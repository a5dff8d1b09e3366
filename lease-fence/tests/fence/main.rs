//! lease-fence on the real things: keeper leases on the fake with a holder
//! paused past its TTL, object_store's InMemory and the S3 test server, and
//! a real HTTP server behind the tower layers, and a real PostgreSQL server
//! for the check inside transactions.

mod http;
mod http_turns;
mod metadata;
mod paused_holder;
mod postgres;
mod store;
