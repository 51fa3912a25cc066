//! Support for the end-to-end tests: throw-away PKI, loopback destinations
//! (echo, server-speaks-first, never-answering), and a runner for the built
//! binaries that waits on their readiness instead of sleeping.
//!
//! Test code may panic: a panic is how a test reports failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod certs;
pub mod client;
pub mod dest;
pub mod h2raw;
pub mod konnectivity;
pub mod nodeport;
pub mod procs;
