//! Free loopback ports for the processes the tests start (`tollgate serve`, Envoy,
//! redis-server, the upstreams), chosen where nothing but an explicit bind takes one.
//!
//! Binding port 0 hands out a port of the kernel's ephemeral range, the range every
//! outgoing connection takes its local port from. Between the test noting such a port
//! and the server binding it, a connection of anything running beside it (Envoy to its
//! upstream, tollgate to Redis, a probe) can take it, and the server exits "Address
//! already in use": seen in CI, a failed run. Below the ephemeral range only explicit
//! binds take a port, so a port this process finds free and never hands out twice
//! stays free for its server. A cluster's bus port (port + 10000) stays below the
//! range too. Where the range is not the usual one, port 0 is the fallback.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Ports handed out: [`FIRST`, `FIRST + SPAN`); their bus ports, + 10000, end below
/// 32768, Linux's default start of the ephemeral range.
const FIRST: u32 = 12_000;
const SPAN: u32 = 10_000;
const BUS_OFFSET: u32 = 10_000;

/// `count` distinct loopback ports free right now, never handed out before by this
/// process; with `with_bus_ports`, port + 10000 of each is free too.
pub fn free_ports(count: usize, with_bus_ports: bool) -> Vec<u16> {
    if !below_ephemeral_range() {
        return any_ports(count, with_bus_ports);
    }
    // Each test binary starts at an offset of its own, so two binaries running at
    // once rarely probe the same ports (the bind below settles it when they do).
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let free = |p: u32| TcpListener::bind((Ipv4Addr::LOCALHOST, p as u16)).is_ok();
    let mut ports = Vec::with_capacity(count);
    for _ in 0..SPAN {
        let port = FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if free(port) && (!with_bus_ports || free(port + BUS_OFFSET)) {
            ports.push(port as u16);
            if ports.len() == count {
                return ports;
            }
        }
    }
    panic!(
        "no {count} free loopback ports in {FIRST}..{}",
        FIRST + SPAN
    );
}

/// One free loopback port, as [`free_ports`].
pub fn free_port() -> u16 {
    free_ports(1, false)[0]
}

/// Whether the ephemeral range starts above every port (and bus port) handed out.
fn below_ephemeral_range() -> bool {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range");
    let first = range
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u32>().ok());
    first.is_some_and(|first| first >= FIRST + SPAN + BUS_OFFSET)
}

/// The fallback: ports the kernel picks (bound on port 0 together, noted, released).
fn any_ports(count: usize, with_bus_ports: bool) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < count {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("bound").port();
        held.push(listener);
        if with_bus_ports {
            match port
                .checked_add(BUS_OFFSET as u16)
                .and_then(|bus| TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).ok())
            {
                Some(bus) => held.push(bus),
                None => continue,
            }
        }
        ports.push(port);
    }
    ports
}
