//! The pure algorithm models: state in, decision and new state out, no I/O and no
//! clock of their own. The memory store runs them directly; the Lua scripts in `lua/`
//! mirror them operation for operation (same float expressions in the same order, so
//! a differential test can demand exact agreement).
//!
//! Every algorithm is a [`Model`], and one list (the `algorithms!` call below) is the
//! only place that names them all: it declares the modules and generates the
//! [`Algorithm`] enum, the [`State`] enum and the dispatch of [`decide`] and
//! [`expires_at_ms`]. An algorithm's id on the wire is its position in that list
//! (counting from 1, as Lua arrays do), and the Lua dispatch is generated from the
//! same list when the scripts are assembled (`store/redis/scripts/`), so the
//! ids have one source of truth.
//!
//! # Adding an algorithm
//!
//! 1. `src/algorithm/<name>.rs`: the model. A `State` type, the maths as plain
//!    functions with their unit and property tests, and a unit struct named like the
//!    enum variant implementing [`Model`] (`NAME = "<name>"`, the name configs use;
//!    `KEY_NAME`, a new short name for its Redis keys;
//!    `LUA = include_str!("../../lua/<name>.lua")`; `USES_BURST`, `MAX_LIMIT`,
//!    `ALLOWS_ZERO_RATE`, `TAKES_MAX_DELAY`, `TAKES_TIME_ZONE` and `TAKES_LEASE`, the
//!    config rules it implies; `LAYOUT`, the Redis
//!    type its Lua twin keeps a counter in, and `describe`, that stored value in
//!    words for `tollgate inspect`; `heap_bytes`, what its state owns on the heap, so
//!    the memory store weighs it right; `CHARGE_REFUSAL`, why `overdraft` and
//!    `quota_mode` are refused for it at load, or `None`; `RELEASES`, whether a
//!    release gives hits back; `COUNTS_DENIALS`, whether a denial is counted all
//!    the same; `charge` and `release`, see `mode.rs`).
//! 2. `lua/<name>.lua`: its twin, a table `local <name> = {}` with the functions
//!    `lua/common.lua` lists (load, decide, save, refund, the charge and release
//!    steps, and its fast path's hooks). It must compute with the same expressions in
//!    the same order as the Rust model, so the differential test can demand exact
//!    agreement.
//! 3. One entry at the end of the list below: `Variant(module)`. Appending keeps the
//!    ids of the others (they are positions); the scripts' SHA changes either way.
//!
//! The differential test (`tests/it/differential.rs`) walks the list, so it proves
//! the new twins agree with no change of its own. Config parsing, the memory store,
//! Redis keys and scripts, `tollgate inspect` and `tollgate simulate` (its chart
//! colours too) pick the algorithm up from the list. Config rules specific to one
//! algorithm are stated by its model's constants (`USES_BURST`, `MAX_LIMIT`,
//! `ALLOWS_ZERO_RATE`, `TAKES_MAX_DELAY`) and checked in
//! `src/config/compile/limit.rs` and `tollgate simulate`.

pub mod calendar;
mod decision;
mod division;
mod mode;
mod model;
mod stored;
#[cfg(test)]
pub(crate) mod testing;

pub use self::decision::{Decision, EPSILON, Params};
use self::decision::{ceil_ms, floor_u64};
pub use self::division::Division;
pub use self::mode::Mode;
pub use self::model::Model;
pub use self::stored::{Layout, Stored};

use std::time::Duration;

/// A lease's length when a rule that takes one names none: longer than most requests
/// are slow, short enough that a crashed proxy's slots come back within minutes.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);

/// Declares the algorithm modules and generates everything that enumerates them from
/// one list of `Variant(module)` entries, where `module::Variant` is the [`Model`].
macro_rules! algorithms {
    ($($variant:ident($module:ident)),+ $(,)?) => {
        $(pub mod $module;)+

        /// How a limit counts.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Algorithm {
            $($variant,)+
        }

        /// One counter's state, whatever its algorithm.
        #[derive(Debug, Clone, PartialEq)]
        pub enum State {
            $($variant(<$module::$variant as Model>::State),)+
        }

        impl Algorithm {
            /// Every algorithm, in list order (so `ALL[id - 1]` has `id`).
            pub const ALL: [Algorithm; [$(Algorithm::$variant),+].len()] =
                [$(Algorithm::$variant),+];

            pub fn name(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::NAME,)+
                }
            }

            /// The short name inside Redis keys ([`Model::KEY_NAME`]).
            pub fn key_name(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::KEY_NAME,)+
                }
            }

            /// Whether `burst` means something for this algorithm.
            pub fn uses_burst(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::USES_BURST,)+
                }
            }

            /// The largest limit it can count ([`Model::MAX_LIMIT`]).
            pub fn max_limit(self) -> Option<u64> {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::MAX_LIMIT,)+
                }
            }

            /// Whether a limit of 0 is allowed ([`Model::ALLOWS_ZERO_RATE`]).
            pub fn allows_zero_rate(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::ALLOWS_ZERO_RATE,)+
                }
            }

            /// Whether `max_delay` means something ([`Model::TAKES_MAX_DELAY`]).
            pub fn takes_max_delay(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::TAKES_MAX_DELAY,)+
                }
            }

            /// Whether `time_zone` means something ([`Model::TAKES_TIME_ZONE`]).
            pub fn takes_time_zone(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::TAKES_TIME_ZONE,)+
                }
            }

            /// Whether `lease` means something ([`Model::TAKES_LEASE`]).
            pub fn takes_lease(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::TAKES_LEASE,)+
                }
            }

            /// Why charges are refused for it ([`Model::CHARGE_REFUSAL`]).
            pub fn charge_refusal(self) -> Option<&'static str> {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::CHARGE_REFUSAL,)+
                }
            }

            /// Whether a denial is counted too ([`Model::COUNTS_DENIALS`]).
            pub fn counts_denials(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::COUNTS_DENIALS,)+
                }
            }

            /// How its limit divides between regions ([`Model::DIVISION`]).
            pub fn division(self) -> Division {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::DIVISION,)+
                }
            }

            /// Whether a release gives hits back ([`Model::RELEASES`]).
            pub fn releases(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::RELEASES,)+
                }
            }

            /// Its packed state's format ([`Model::PACKED`]).
            pub fn packed(self) -> Option<&'static str> {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::PACKED,)+
                }
            }

            /// The constants its Lua twin reads ([`Model::LUA_CONSTANTS`]).
            pub fn lua_constants(self) -> &'static [(&'static str, u64)] {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::LUA_CONSTANTS,)+
                }
            }

            /// The Lua twin's source.
            pub fn lua(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::LUA,)+
                }
            }

            /// The Redis type the Lua twin keeps one counter in.
            pub fn layout(self) -> Layout {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::LAYOUT,)+
                }
            }

            /// A counter as the Lua twin stores it, in words ([`Model::describe`]).
            pub fn describe(self, stored: &Stored) -> String {
                match self {
                    $(Algorithm::$variant => <$module::$variant as Model>::describe(stored),)+
                }
            }
        }

        impl State {
            /// The heap bytes the state owns besides its own size.
            pub fn heap_bytes(&self) -> usize {
                match self {
                    $(State::$variant(s) => <$module::$variant as Model>::heap_bytes(s),)+
                }
            }
        }

        /// Decides `cost` hits at `now_ms` against `state` (None: never seen, or state
        /// of another algorithm). A denied operation returns the state unchanged.
        pub fn decide(
            state: Option<&State>,
            params: &Params,
            now_ms: u64,
            cost: u64,
        ) -> (State, Decision) {
            match params.algorithm {
                $(Algorithm::$variant => {
                    let prior = match state {
                        Some(State::$variant(s)) => Some(s),
                        _ => None,
                    };
                    let (s, d) = <$module::$variant as Model>::decide(prior, params, now_ms, cost);
                    (State::$variant(s), d)
                })+
            }
        }

        /// [`decide`] in `mode`: a charge or a release goes to the model's own
        /// ([`Model::charge`], [`Model::release`]); a charge where the model refuses
        /// charges (the config refuses it, so only a caller's mistake) is a limit. An
        /// operation naming its lease (`lease`) goes to [`Model::apply_named`].
        pub fn apply(
            state: Option<&State>,
            params: &Params,
            now_ms: u64,
            (cost, mode, lease): (u64, Mode, Option<&str>),
        ) -> (State, Decision) {
            match params.algorithm {
                $(Algorithm::$variant => {
                    type M = $module::$variant;
                    let prior = match state {
                        Some(State::$variant(s)) => Some(s),
                        _ => None,
                    };
                    let (s, d) = match (mode, lease) {
                        (_, Some(id)) => {
                            <M as Model>::apply_named(prior, params, now_ms, cost, mode, id)
                        }
                        (Mode::Release, None) => <M as Model>::release(prior, params, now_ms, cost),
                        (Mode::Overdraft | Mode::Quota, None)
                            if <M as Model>::CHARGE_REFUSAL.is_none() =>
                        {
                            <M as Model>::charge(prior, params, now_ms, cost, mode.need(cost))
                        }
                        _ => <M as Model>::decide(prior, params, now_ms, cost),
                    };
                    (State::$variant(s), d)
                })+
            }
        }

        /// [`Model::refund`] of `state` (another algorithm's state is no state: nothing).
        pub fn refund(
            state: &State,
            params: &Params,
            now_ms: u64,
            (token, cost): (i64, u64),
        ) -> State {
            match (params.algorithm, state) {
                $((Algorithm::$variant, State::$variant(s)) => State::$variant(
                    <$module::$variant as Model>::refund(s, params, now_ms, token, cost),
                ),)+
                _ => state.clone(),
            }
        }

        /// When a state stops mattering (the Redis TTL of its key): after this instant
        /// it is equivalent to no state at all.
        pub fn expires_at_ms(state: &State, params: &Params, now_ms: u64) -> u64 {
            match state {
                $(State::$variant(s) => {
                    <$module::$variant as Model>::expires_at_ms(s, params, now_ms)
                })+
            }
        }
    };
}

// The list. An algorithm's wire id is its position here, counting from 1.
algorithms! {
    FixedWindow(fixed_window),
    SlidingWindow(sliding_window),
    SlidingLog(sliding_log),
    TokenBucket(token_bucket),
    Gcra(gcra),
    LeakyBucket(leaky_bucket),
    Concurrency(concurrency),
}

impl Algorithm {
    pub fn parse(text: &str) -> Option<Algorithm> {
        Self::ALL.into_iter().find(|a| a.name() == text)
    }

    /// The algorithms that limit a rate (all but those counting requests in flight,
    /// whose leases a simulation of arrivals cannot release): what `tollgate
    /// simulate` compares by default.
    pub fn rate_limits() -> Vec<Algorithm> {
        Self::ALL
            .into_iter()
            .filter(|a| !a.counts_denials())
            .collect()
    }

    /// Every name, in list order (for command lines that take one).
    pub fn names() -> [&'static str; Algorithm::ALL.len()] {
        Self::ALL.map(Algorithm::name)
    }

    /// The names of the algorithms `which` selects, for messages: `a, b and c`.
    pub fn names_where(which: impl Fn(Algorithm) -> bool) -> String {
        let names: Vec<&str> = Self::ALL
            .into_iter()
            .filter(|a| which(*a))
            .map(Algorithm::name)
            .collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            Some((last, _)) => (*last).to_owned(),
            None => String::new(),
        }
    }

    /// The id the Lua scripts dispatch on: the position in the list, from 1 (the
    /// generated Lua table is an array in the same order).
    pub fn id(self) -> u8 {
        self as u8 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_key_names_safe_in_keys() {
        for (i, a) in Algorithm::ALL.into_iter().enumerate() {
            for b in &Algorithm::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
                assert_ne!(a.key_name(), b.key_name());
            }
            assert!(a.key_name().bytes().all(|c| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn ids_are_list_positions_from_one() {
        for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(algorithm.id()), i + 1);
            assert_eq!(Algorithm::parse(algorithm.name()), Some(algorithm));
        }
    }

    /// The generated Lua dispatch names each algorithm's table by `NAME`.
    #[test]
    fn each_lua_twin_defines_the_table_named_like_its_model() {
        for algorithm in Algorithm::ALL {
            let definition = format!("local {} = {{}}", algorithm.name());
            assert!(
                algorithm.lua().lines().any(|line| line == definition),
                "{} lacks `{definition}`",
                algorithm.name()
            );
        }
    }
}
