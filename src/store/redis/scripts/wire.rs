//! One operation as the batch and refund scripts read it ([`WireOp`], 43 packed bytes,
//! and a time_zone rule's 48 bytes of calendar periods), and the estimate of Redis's
//! clock the periods are chosen around.

use compact_str::CompactString;
use redis::Cmd;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::algorithm::calendar::Calendar;
use crate::clock::{Clock, SystemClock};
use crate::store::CounterOp;

/// One operation as both scripts read it, owned and `Copy` so a request can wait in
/// the batcher's queue, or for its refund, without borrowing from its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireOp {
    pub(super) algorithm: u8,
    pub(super) limit: u64,
    pub(super) window_ms: u64,
    pub(super) burst: u64,
    pub(super) max_delay_ms: i64,
    pub(super) cost: u64,
    pub(super) vetoes: bool,
    /// `time_zone`: the periods are sent with the operation ([`CALENDAR_LEN`]).
    pub(super) calendar: Option<Calendar>,
    /// The mode's bits, `Mode::wire_bits`.
    pub(super) mode: u8,
    /// The request's own lease (`CounterOp::lease`): sent after the operation's bytes
    /// ([`bits::LEASE`]).
    pub(super) lease: Option<CompactString>,
}

pub(super) use super::contract::OP_LEN;
use super::contract::{CALENDAR_LEN, bits, flag};

/// Redis's clock minus tollgate's (ms), as the batch script last reported it when a
/// calendar's periods missed Redis's clock ([`learn_redis_clock`]); 0 until then.
/// The periods are chosen around tollgate's clock plus this, so clocks that differ
/// by more than a period (a host whose clock is off, a test that sets Redis's) cost
/// one failed call, not wrong periods.
static REDIS_AHEAD_MS: AtomicI64 = AtomicI64::new(0);

/// Notes that Redis's clock read `redis_ms` just now.
pub fn learn_redis_clock(redis_ms: u64) {
    let ours = i128::from(SystemClock.now_millis());
    let ahead = (i128::from(redis_ms) - ours).clamp(i128::from(i64::MIN), i128::from(i64::MAX));
    REDIS_AHEAD_MS.store(ahead as i64, Ordering::Relaxed);
}

/// Tollgate's best idea of Redis's clock: its own, moved by what it learned.
pub fn redis_clock_estimate() -> u64 {
    SystemClock
        .now_millis()
        .saturating_add_signed(REDIS_AHEAD_MS.load(Ordering::Relaxed))
}

/// Where an operation stands in its call, the first byte of its encoding
/// ([`flag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flag {
    /// The first operation of a request.
    Starts = flag::START as isize,
    /// The first operation of a request decided as a dry run.
    StartsDry = flag::DRY as isize,
    /// The first operation of a request (not a dry run) naming a counter twice.
    StartsRepeating = flag::REPEATS as isize,
    /// A further operation of the same request (and every refund operation).
    Continues = flag::MORE as isize,
}

impl WireOp {
    pub fn new(op: &CounterOp) -> Self {
        let p = &op.params;
        Self {
            algorithm: p.algorithm.id(),
            limit: p.limit,
            window_ms: p.window_ms.max(1000),
            burst: p.burst,
            max_delay_ms: p
                .max_delay_ms
                .map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
            // Lua numbers are doubles: costs above the burst or limit are all equally
            // impossible, so they are clamped to stay exact. A charge, a release or a
            // lease counts in full (up to 2^53, where doubles stop being exact).
            cost: if !op.commits() {
                op.cost.min(p.limit.max(p.burst).saturating_add(1))
            } else {
                op.cost.min(1 << 53)
            },
            vetoes: op.vetoes,
            calendar: p.calendar,
            mode: op.mode.wire_bits(),
            lease: op.lease.clone(),
        }
    }

    /// The encoder: appends this operation to `cmd` as one argument, the contract's
    /// layout ([`super::contract`]): [`OP_LEN`] bytes, numbers as the doubles Lua
    /// computes with, then a calendar's periods (those around `around_ms`: tollgate's
    /// clock, or a test's injected one) or a lease's id. Why one argument: the script
    /// parses each distinct operation once per call, and a call's operations mostly
    /// repeat (same rule, same cost); why binary: one `struct.unpack` reads it. A u64
    /// becomes the double nearest to it, as Lua's `tonumber` of its decimal did.
    pub(super) fn write(&self, cmd: &mut Cmd, flag: Flag, around_ms: u64) {
        let mut buf = [0u8; OP_LEN + CALENDAR_LEN];
        buf[0] = flag as u8;
        buf[1] = self.algorithm;
        let numbers = [
            self.limit as f64,
            self.window_ms as f64,
            self.burst as f64,
            self.max_delay_ms as f64,
        ];
        for (i, x) in numbers.into_iter().enumerate() {
            buf[2 + 8 * i..10 + 8 * i].copy_from_slice(&x.to_le_bytes());
        }
        buf[34] = (u8::from(self.vetoes) * bits::VETOES) | self.mode;
        buf[35..OP_LEN].copy_from_slice(&(self.cost as f64).to_le_bytes());
        if let Some(lease) = &self.lease {
            // A rule with a lease takes no time_zone (the config refuses it): the id is
            // all that follows.
            buf[34] |= bits::LEASE;
            let mut text = Vec::with_capacity(OP_LEN + lease.len());
            text.extend_from_slice(&buf[..OP_LEN]);
            text.extend_from_slice(lease.as_bytes());
            cmd.arg(text);
            return;
        }
        let Some(calendar) = self.calendar else {
            cmd.arg(&buf[..OP_LEN]);
            return;
        };
        // The script cannot read a time-zone database, so it picks Redis's period
        // among six around tollgate's idea of Redis's clock.
        buf[34] |= bits::CALENDAR;
        let (bounds, first) = calendar.numbered_bounds_around(around_ms);
        let numbers = bounds
            .map(|start| start as f64)
            .into_iter()
            .chain([first as f64]);
        for (i, x) in numbers.enumerate() {
            let at = OP_LEN + 8 * i;
            buf[at..at + 8].copy_from_slice(&x.to_le_bytes());
        }
        cmd.arg(&buf[..]);
    }
}
