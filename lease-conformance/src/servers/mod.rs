//! Test servers (in progress).
