//! Shared integration-test support: an in-process tollgate server on port 0
//! ([`server`]), `tollgate serve` as a child process ([`process`]), and real
//! `redis-server` processes, standalone and cluster ([`redis`]).
//! Each test binary uses only part of it.

#![allow(dead_code)]

pub mod envoy;
pub mod process;
pub mod redis;
pub mod server;
pub mod stores;
