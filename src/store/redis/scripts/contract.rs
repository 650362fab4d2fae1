//! The contract between tollgate and its Lua engine, written once, here: how an
//! operation is laid out (its struct format, its flag bytes and bits, the bytes that
//! may follow it), the mode numbers, the reply's forms, the error codes the engine
//! answers with, and each algorithm's constants and flags. [`prelude`] renders it as
//! the Lua definitions the engine's files read, and [`module_header`] as each
//! algorithm module's; no file under `lua/` writes any of these numbers itself, so
//! the two sides cannot drift. The encoder ([`super::wire`]) and the reply parser
//! ([`super::reply`]) read the same constants.

use crate::algorithm::{Algorithm, Mode};

/// One operation's fixed part as `struct.unpack` reads it: the flag byte, the
/// algorithm id, limit, window ms, burst, max delay ms (-1 none) as little-endian
/// doubles, the bits byte, the cost as a double.
pub const OP_FORMAT: &str = "<BBddddBd";
/// Its bytes.
pub const OP_LEN: usize = 1 + 1 + 4 * 8 + 1 + 8;
/// A calendar's six period starts (ms) and the first one's number (periods counted
/// from 1970's first), after the fixed part when [`bits::CALENDAR`] is set.
pub const CALENDAR_FORMAT: &str = "<ddddddd";
pub const CALENDAR_LEN: usize = 7 * 8;

/// The first byte of an operation: where it stands in its call.
pub mod flag {
    /// The first operation of a request.
    pub const START: u8 = b'+';
    /// The first operation of a request decided as a dry run.
    pub const DRY: u8 = b'-';
    /// The first operation of a request that names one counter more than once (its
    /// operations are decided on each other's tentative state: never the fast path).
    pub const REPEATS: u8 = b'*';
    /// A further operation of the same request (and every refund operation).
    pub const MORE: u8 = b'.';
}

/// The bits byte of an operation.
pub mod bits {
    /// A denial of this operation denies its request.
    pub const VETOES: u8 = 1;
    /// The mode ([`crate::algorithm::Mode`]) is `(bits >> MODE_SHIFT) & MODE_MASK`.
    pub const MODE_SHIFT: u8 = 1;
    pub const MODE_MASK: u8 = 3;
    /// The request's lease id follows, the rest of the argument.
    pub const LEASE: u8 = 8;
    /// A calendar's periods follow ([`super::CALENDAR_LEN`] bytes).
    pub const CALENDAR: u8 = 16;
    /// Every bit the engine knows.
    pub const ALL: u8 = VETOES | (MODE_MASK << MODE_SHIFT) | LEASE | CALENDAR;
}

/// A reply's full form: remaining (or -1 when denied), reset ms, the delay us when
/// allowed or the retry ms when denied (-1: never), the refund token.
pub const FULL_FORM: usize = 4;
/// The grid of a packed state's expiry (ms): a bucket's key expires on a multiple of
/// it, at least one step after its state stops mattering (`lua/timed.lua`).
pub const GRID_MS: u64 = 1 << 16;

/// The batch call's arguments before its specs: the clock, the call's flags, the
/// index, the run lengths (`lua/call.lua`).
pub const CALL_HEADER: usize = 4;

/// Which layouts the engine writes counters in (the call's flags argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateLayout {
    /// This release's: every algorithm's compact state, with its fast path.
    #[default]
    Compact,
    /// tollgate 0.1's (fixed windows, token buckets and sliding windows as hashes,
    /// arrival times in decimal), for a rolling upgrade from 0.1: its replicas read
    /// what this writes, and this reads both (docs/operations.md, "Upgrading").
    V0_1,
}

impl StateLayout {
    /// The call's flags argument asking for it.
    pub fn flag(self) -> &'static str {
        match self {
            StateLayout::Compact => "",
            StateLayout::V0_1 => LAYOUTS_0_1,
        }
    }

    /// The setting's spellings (`--state-layout`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "compact" => Some(StateLayout::Compact),
            "0.1" => Some(StateLayout::V0_1),
            _ => None,
        }
    }
}

/// The flags argument of a call writing tollgate 0.1's layouts.
const LAYOUTS_0_1: &str = "0.1";

/// A repeat form is one number, `REPEAT_FROM - first` (so at most `REPEAT_FROM + 1`),
/// standing for a full form whose last three values equal the previous one's.
pub const REPEAT_FROM: i64 = -3;

/// The codes the engine's errors start with (Redis's error reply: the first word is
/// the code), so tollgate steers by code, never by an error's text.
pub mod code {
    /// The call's arguments did not parse: nothing was decided.
    pub const MALFORMED: &str = "TGMALFORMED";
    /// A calendar rule's periods, chosen around tollgate's clock, do not hold Redis's:
    /// nothing was decided, and the next word is Redis's clock (ms).
    pub const CLOCK: &str = "TGCLOCK";
    /// A command failed midway (on a cluster, a key the node does not serve): what the
    /// call had written is undone, nothing was decided; the next words are Redis's
    /// error.
    pub const ABORTED: &str = "TGABORT";
}

/// The Lua definitions of the contract, put before every file of the engine.
pub fn prelude() -> String {
    let modes: Vec<(String, u8)> = Mode::ALL
        .iter()
        .map(|m| {
            (
                format!("MODE_{}", m.name().to_uppercase()),
                m.wire_bits() >> bits::MODE_SHIFT,
            )
        })
        .collect();
    let names: Vec<&str> = modes.iter().map(|(n, _)| n.as_str()).collect();
    let values: Vec<String> = modes.iter().map(|(_, v)| v.to_string()).collect();
    format!(
        "-- Generated from src/store/redis/scripts/contract.rs: the contract with tollgate.\n\
         local OP_FORMAT, OP_LEN = '{OP_FORMAT}', {OP_LEN}\n\
         local CALENDAR_FORMAT, CALENDAR_LEN = '{CALENDAR_FORMAT}', {CALENDAR_LEN}\n\
         local FLAG_START, FLAG_DRY, FLAG_REPEATS, FLAG_MORE = {}, {}, {}, {}\n\
         local BIT_VETOES, BIT_LEASE, BIT_CALENDAR, BITS_ALL = {}, {}, {}, {}\n\
         local MODE_DIVISOR, MODE_MODULUS = {}, {}\n\
         local {} = {}\n\
         local FULL_FORM, REPEAT_FROM, GRID = {FULL_FORM}, {REPEAT_FROM}, {GRID_MS}\n\
         local CODE_MALFORMED, CODE_CLOCK, CODE_ABORTED = '{}', '{}', '{}'\n\
         local CALL_HEADER, LAYOUTS_0_1 = {CALL_HEADER}, '{LAYOUTS_0_1}'\n",
        flag::START,
        flag::DRY,
        flag::REPEATS,
        flag::MORE,
        bits::VETOES,
        bits::LEASE,
        bits::CALENDAR,
        bits::ALL,
        1u8 << bits::MODE_SHIFT,
        bits::MODE_MASK + 1,
        names.join(", "),
        values.join(", "),
        code::MALFORMED,
        code::CLOCK,
        code::ABORTED,
    )
}

/// What an algorithm's module gets before its source: its constants, from its model.
pub fn module_header(algorithm: Algorithm) -> String {
    let mut header = String::new();
    let constants = algorithm.lua_constants();
    if !constants.is_empty() {
        let names: Vec<&str> = constants.iter().map(|(n, _)| *n).collect();
        let values: Vec<String> = constants.iter().map(|(_, v)| v.to_string()).collect();
        header.push_str(&format!(
            "local {} = {}\n",
            names.join(", "),
            values.join(", ")
        ));
    }
    if let Some(format) = algorithm.packed() {
        header.push_str(&format!(
            "local PACKED, PACKED_LEN = '{format}', {}\n",
            packed_len(format)
        ));
    }
    header
}

/// The bytes `struct.pack` makes of `format` (`d` 8, `I` 4).
pub fn packed_len(format: &str) -> usize {
    format
        .chars()
        .map(|c| match c {
            'd' => 8,
            'I' => 4,
            _ => 0,
        })
        .sum()
}

/// What follows an algorithm's module: the flags its model states, read by the
/// engine's parser (whether a charge or a release has a meaning for it, whether a
/// denial is counted).
pub fn module_footer(algorithm: Algorithm) -> String {
    format!(
        "{name}.charges, {name}.releases, {name}.counts_denials = {}, {}, {}\n",
        algorithm.charge_refusal().is_none(),
        algorithm.releases(),
        algorithm.counts_denials(),
        name = algorithm.name(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prelude_defines_every_mode_and_code() {
        let lua = prelude();
        for mode in Mode::ALL {
            assert!(lua.contains(&format!("MODE_{}", mode.name().to_uppercase())));
        }
        assert!(lua.contains("MODE_DIVISOR, MODE_MODULUS = 2, 4"), "{lua}");
        assert!(
            lua.contains("local OP_FORMAT, OP_LEN = '<BBddddBd', 43"),
            "{lua}"
        );
    }

    /// The mode numbers are the wire bits shifted down, in Lua as in Rust.
    #[test]
    fn modes_fit_their_mask() {
        for mode in Mode::ALL {
            assert!(mode.wire_bits() >> bits::MODE_SHIFT <= bits::MODE_MASK);
            assert_eq!(mode.wire_bits() & !(bits::MODE_MASK << bits::MODE_SHIFT), 0);
        }
    }
}
