//! [`Model`]: what one algorithm is to the rest of tollgate (its names, its Lua twin,
//! the config rules it implies, its arithmetic and how its limit divides between
//! regions). Each algorithm's module implements it on a unit struct; the
//! `algorithms!` list in `mod.rs` is its only caller.

use super::{Decision, Division, Layout, Mode, Params, Stored};

/// What one algorithm is: its names, its Lua twin and its arithmetic. Implemented by a
/// unit struct in each algorithm's module; nothing calls it but the code the
/// `algorithms!` list generates, so a model is plain functions plus this registration.
pub trait Model {
    /// The name configs use (`rate_limit.algorithm`), and the name of the Lua table
    /// that `LUA` defines (the generated dispatch returns it).
    const NAME: &'static str;
    /// Its short name inside Redis keys: distinct per algorithm, so a rule that
    /// changes algorithm starts from a fresh counter instead of misreading the old
    /// state. Never change one: every counter in Redis would start over.
    const KEY_NAME: &'static str;
    /// The Lua twin: the source of `lua/<NAME>.lua`.
    const LUA: &'static str;
    /// Whether `burst` means something for this algorithm.
    const USES_BURST: bool;
    /// The largest limit (`requests_per_unit`) it can count, if it has one (a log
    /// keeps one entry per hit).
    const MAX_LIMIT: Option<u64>;
    /// Whether a limit of 0 means something (deny everything) rather than no
    /// emission interval at all.
    const ALLOWS_ZERO_RATE: bool;
    /// Whether it shapes, so `leaky_bucket.max_delay` means something for it.
    const TAKES_MAX_DELAY: bool;
    /// The Redis type its Lua twin keeps one counter in.
    const LAYOUT: Layout;
    /// Whether it counts in periods, so `time_zone` can make them calendar periods
    /// ([`Params::calendar`]); a bucket has a rate, not a period.
    const TAKES_TIME_ZONE: bool;
    /// Whether its window is a lease (`rate_limit.lease`, default [`DEFAULT_LEASE`]):
    /// how long an acquisition counts unless released first.
    const TAKES_LEASE: bool;
    /// Why a charge ([`Mode::Overdraft`], [`Mode::Quota`]) makes no sense for it, as
    /// the config error says; `None`: [`Model::charge`] is defined.
    const CHARGE_REFUSAL: Option<&'static str>;
    /// Whether [`Model::release`] gives hits back; false: a release is answered as a
    /// check, changes nothing and is counted as ignored.
    const RELEASES: bool;
    /// Whether a denied operation is counted all the same (its state written): a
    /// concurrency lease is taken admitted or not, because its release comes anyway.
    const COUNTS_DENIALS: bool;
    /// How its limit divides between regions for a `global: true` rule, or why it
    /// cannot ([`Division`]).
    const DIVISION: Division;
    /// The constants its Lua twin reads, by name (`SHIFT` for the fixed window's value
    /// layout): written here once, and put before the twin's source when the engine
    /// is assembled, so the two cannot disagree.
    const LUA_CONSTANTS: &'static [(&'static str, u64)] = &[];
    /// For a state stored as numbers packed into one string, their `struct.pack`
    /// format (`<dI`): its Lua twin packs with it (as `PACKED`, with `PACKED_LEN`, the
    /// bytes it makes), and `describe` reads it back ([`Stored::unpacked`]).
    const PACKED: Option<&'static str> = None;
    type State: Clone + std::fmt::Debug + PartialEq;

    /// Decides `cost` hits at `now_ms` against `state` (`None`: never seen). A denied
    /// operation returns the state unchanged.
    fn decide(
        state: Option<&Self::State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
    ) -> (Self::State, Decision);

    /// A charge of `cost` at `now_ms`: consumed whatever the answer (the state may
    /// go past the limit: a debt), admitted iff at least `need` remained before it
    /// ([`Mode::need`]). `remaining` is 0 while overdrawn; the reset says when the
    /// debt is paid back. Never called where [`Model::CHARGE_REFUSAL`] refuses.
    fn charge(
        state: Option<&Self::State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        need: u64,
    ) -> (Self::State, Decision);

    /// A release of `cost` hits: given back, never below an empty counter, always
    /// allowed; the decision is what a check would report after it.
    fn release(
        state: Option<&Self::State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
    ) -> (Self::State, Decision);

    /// An operation that names its own lease (`lease_key`: the request's id), in
    /// `mode`. Only a model that takes a lease is sent one (the config refuses
    /// `lease_key` elsewhere); for any other the id means nothing and this is
    /// [`Model::decide`] or [`Model::release`].
    fn apply_named(
        state: Option<&Self::State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        mode: Mode,
        id: &str,
    ) -> (Self::State, Decision) {
        let _ = id;
        match mode {
            Mode::Release => Self::release(state, params, now_ms, cost),
            _ => Self::decide(state, params, now_ms, cost),
        }
    }

    /// When `state` stops mattering (the Redis TTL of its key): after this instant it
    /// is equivalent to no state at all.
    fn expires_at_ms(state: &Self::State, params: &Params, now_ms: u64) -> u64;

    /// Gives back what an admitted limit of `cost` took from `state`, `token` naming
    /// the state it took from (what the decision's reply carried: a window's start, a
    /// log entry's group, a drain time), at `now_ms`: the Lua twin's `refund`, which
    /// the cluster sends when another group of the request denied it. Nothing when the
    /// token names a state gone by (the window moved on): a refund may under-admit,
    /// never over-admit. Only a limit is refunded (a charge or a release commits).
    fn refund(
        state: &Self::State,
        params: &Params,
        now_ms: u64,
        token: i64,
        cost: u64,
    ) -> Self::State;

    /// A counter as the Lua twin stores it (in [`Self::LAYOUT`]), in words.
    fn describe(stored: &Stored) -> String;

    /// The heap bytes `state` owns besides its own size (the memory store's budget
    /// counts them): none for a state of plain numbers.
    fn heap_bytes(state: &Self::State) -> usize;
}
