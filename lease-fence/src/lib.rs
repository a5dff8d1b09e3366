#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod fences;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlx"))))]
pub mod postgres;
#[cfg(feature = "object-store")]
mod store;

pub use fences::{Admission, Fences, Stale};
#[cfg(feature = "object-store")]
#[cfg_attr(docsrs, doc(cfg(feature = "object-store")))]
pub use store::{
    FencedError, FencedObject, FencedStore, FENCE_ATTRIBUTE, NONCE_ATTRIBUTE, TOMBSTONE_ATTRIBUTE,
};
