//! `claims`' bound proven the way Envoys see it: a simulation of Envoys (streams that
//! report, end with or without a release, reconnect and resume, restart; client ids
//! absent, unique or shared; liars; answers delivered late, by up to the margin the
//! ledger allows) checks, at every instant an answer reaches an Envoy, that the
//! assignments in force sum to at most the limit. Two timings: any gaps between
//! reports (clients that are not Envoy), with ids absent or unique; and Envoy's (a
//! live stream reports every 4-6 s), with ids shared by several Envoys too.

use proptest::prelude::*;

use super::*;
use crate::rlqs::share::SCALE;

/// Envoy 1.40's timing: 5 s reports, a 30 s TTL, 2 s margins.
const TTL_MS: u64 = 30_000;
/// How long a resumed stream waits for its whole share (`answer.rs`).
const WAIT_MS: u64 = TTL_MS - 5_000 - 2_000;
const TIMING: Timing = Timing {
    stale_ms: 15_000,
    hold_ms: TTL_MS + 2_000,
    grace_ms: 2_000,
};

fn report<'a>(name: &'a str, weight: Option<u64>, tokens: u64) -> Report<'a> {
    Report {
        name,
        alias: name,
        owner: name,
        weight,
        resumed: false,
        tokens,
    }
}

#[test]
fn a_newcomer_takes_what_is_unassigned_and_the_rest_after_the_others_report() {
    let mut claims = Claims::new(0);
    let a = claims.claim(&report("a", None, 600), &TIMING, 0);
    assert_eq!((a.tokens, a.streams), (600, 1), "alone, the whole limit");
    let b = claims.claim(&report("b", None, 600), &TIMING, 100);
    assert_eq!(b.tokens, 0, "nothing is unassigned yet");
    let a = claims.claim(&report("a", Some(SCALE), 600), &TIMING, 5_000);
    assert_eq!(a.tokens, 300, "a gives half back");
    assert_eq!(claims.assigned(), 600, "given back, but not reusable yet");
    let b = claims.claim(&report("b", Some(SCALE), 600), &TIMING, 7_100);
    assert_eq!(b.tokens, 300, "b's share, after the grace");
}

#[test]
fn more_streams_than_tokens_share_whole_tokens() {
    for (streams, tokens) in [(20usize, 10u64), (2_000, 600)] {
        let mut claims = Claims::new(0);
        let names: Vec<String> = (0..streams).map(|i| format!("s{i:04}")).collect();
        let mut held = vec![0u64; streams];
        for round in 0..3u64 {
            for (i, name) in names.iter().enumerate() {
                let now = round * 5_000 + i as u64;
                held[i] = claims
                    .claim(&report(name, Some(SCALE / 2), tokens), &TIMING, now)
                    .tokens;
                assert!(held.iter().sum::<u64>() <= tokens);
            }
        }
        assert_eq!(held.iter().sum::<u64>(), tokens, "{streams} streams");
        assert!(held.iter().all(|&t| t <= 1), "one token at most each");
    }
}

#[test]
fn a_liar_weighs_at_most_the_whole_rate() {
    // Two honest streams at 5 per second each, on 10 per second (600 per minute); a
    // third reports u64::MAX: weight() caps it at the whole rate.
    let mut claims = Claims::new(0);
    let honest = crate::rlqs::share::weight(5.0, 600, 60);
    let liar = crate::rlqs::share::weight(u64::MAX as f64, 600, 60);
    let mut shares = [0u64; 3];
    for round in 0..4u64 {
        for (i, (name, w)) in [("h1", honest), ("h2", honest), ("liar", liar)]
            .into_iter()
            .enumerate()
        {
            let now = round * 5_000 + i as u64 * 2_100;
            shares[i] = claims
                .claim(&report(name, Some(w), 600), &TIMING, now)
                .tokens;
        }
    }
    // The floor docs/rlqs.md states: min(demand, limit) / streams = 300 / 3.
    assert!(shares[0] >= 100 && shares[1] >= 100, "{shares:?}");
    assert_eq!(shares, [150, 150, 300]);
}

#[test]
fn an_ended_stream_keeps_its_tokens_until_its_hold_runs_out() {
    let mut claims = Claims::new(0);
    claims.claim(&report("a", Some(SCALE), 10), &TIMING, 0);
    claims.release("a", "a", "a", &TIMING, 1_000);
    let b = claims.claim(&report("b", Some(SCALE), 10), &TIMING, 2_000);
    assert_eq!((b.tokens, b.streams), (0, 1), "a's Envoy may still hold 10");
    let b = claims.claim(&report("b", Some(SCALE), 10), &TIMING, TIMING.hold_ms + 1);
    assert_eq!(b.tokens, 10);
    assert_eq!(claims.len(), 1, "a's record is gone");
}

#[test]
fn streams_sharing_a_client_id_are_told_apart() {
    let mut claims = Claims::new(0);
    let on = |owner: &'static str, resumed| Report {
        name: "client:fleet",
        alias: owner,
        owner,
        weight: Some(SCALE),
        resumed,
        tokens: 600,
    };
    let mut total = 0;
    for (i, owner) in ["o1", "o2", "o3"].into_iter().enumerate() {
        let g = claims.claim(&on(owner, false), &TIMING, i as u64);
        assert_eq!(g.on_alias, i > 0);
        total += g.tokens;
    }
    assert_eq!(total, 600, "one limit, not three");
    // o1's stream goes stale; o2 reconnects (resumed): the id is shared, so o2 may
    // not take o1's tokens, which o1's Envoy may still enforce.
    let g = claims.claim(&on("o2", true), &TIMING, 20_000);
    assert!(g.on_alias);
}

#[test]
fn a_reconnected_envoy_takes_over_its_own_claim() {
    let mut claims = Claims::new(0);
    let on = |owner: &'static str| Report {
        name: "client:e1",
        alias: owner,
        owner,
        weight: Some(SCALE),
        resumed: owner != "s1",
        tokens: 600,
    };
    assert_eq!(claims.claim(&on("s1"), &TIMING, 0).tokens, 600);
    // s1 dies without a word; the Envoy reconnects as s2 and reports 5 s later.
    let g = claims.claim(&on("s2"), &TIMING, 5_000);
    assert!(g.on_alias && g.partial, "s1 might still be alive");
    let g = claims.claim(&on("s2"), &TIMING, 15_000);
    assert!(!g.on_alias && !g.partial);
    assert_eq!((g.tokens, g.streams), (600, 1), "its own tokens, at once");
    assert_eq!(claims.len(), 1, "the alias merged into the id's claim");
    // Ended cleanly, a stream is taken over at once.
    claims.release("client:e1", "s2", "s2", &TIMING, 16_000);
    let g = claims.claim(&on("s3"), &TIMING, 17_000);
    assert_eq!((g.tokens, g.on_alias), (600, false));
}

#[test]
fn a_claim_renewed_while_another_stream_waits_is_shared() {
    let mut claims = Claims::new(0);
    let on = |owner: &'static str, resumed| Report {
        name: "client:twin",
        alias: owner,
        owner,
        weight: Some(SCALE),
        resumed,
        tokens: 600,
    };
    claims.claim(&on("a", false), &TIMING, 0);
    // b resumes beside a live a: told apart, not yet known to be another Envoy.
    assert!(claims.claim(&on("b", true), &TIMING, 1_000).on_alias);
    // a reports after b began: two live streams, so the id is shared, and when a
    // goes stale b may not take its tokens over.
    claims.claim(&on("a", false), &TIMING, 5_000);
    claims.claim(&on("b", true), &TIMING, 6_000);
    let g = claims.claim(&on("b", true), &TIMING, 21_000);
    assert!(g.on_alias, "{g:?}");
}

/// One Envoy of the simulation.
struct Envoy {
    id: Option<u8>,
    stream: u32,
    had_bucket: bool,
    /// This stream's bucket was resumed, when it was first reported, and whether the
    /// stream has sent anything.
    resumed: bool,
    first_seen: u64,
    sent: bool,
    /// The assignment in force (tokens, until) and the last delivery's time.
    force: Option<(u64, u64)>,
    last_delivery: u64,
    /// Envoy's next report (the Envoy timing only).
    next: u64,
}

impl Envoy {
    fn new(id: Option<u8>) -> Self {
        Self {
            id,
            stream: 0,
            had_bucket: false,
            resumed: false,
            first_seen: 0,
            sent: false,
            force: None,
            last_delivery: 0,
            next: 0,
        }
    }

    fn names(&self, i: usize) -> (String, String) {
        let own = format!("e{i}-s{}", self.stream);
        let name = self
            .id
            .map_or_else(|| own.clone(), |id| format!("client:{id}"));
        (name, own)
    }
}

/// Envoys, the ledger's claims and the answers on their way.
struct Sim {
    tokens: u64,
    claims: Claims,
    envoys: Vec<Envoy>,
    /// (delivery time, order sent, envoy, tokens): one stream's answers arrive in
    /// the order sent.
    inflight: Vec<(u64, usize, usize, u64)>,
    sent: usize,
    trace: Vec<String>,
}

impl Sim {
    fn new(tokens: u64, ids: Vec<Option<u8>>) -> Self {
        Self {
            tokens,
            claims: Claims::new(0),
            envoys: ids.into_iter().map(Envoy::new).collect(),
            inflight: Vec::new(),
            sent: 0,
            trace: Vec::new(),
        }
    }

    /// Delivers what arrives by `now`, in time order, checking at each arrival.
    fn deliver(&mut self, now: u64) -> Result<(), TestCaseError> {
        self.inflight.sort();
        while let Some(&(at, _, envoy, granted)) = self.inflight.first() {
            if at > now {
                break;
            }
            self.inflight.remove(0);
            self.envoys[envoy].force = Some((granted, at + TTL_MS));
            self.trace.push(format!("{at}: e{envoy} gets {granted}"));
            let in_force: u64 = self
                .envoys
                .iter()
                .filter_map(|e| e.force)
                .filter(|&(_, until)| until > at)
                .map(|(t, _)| t)
                .sum();
            prop_assert!(
                in_force <= self.tokens,
                "{in_force} in force at {at} ms on a limit of {}\n{}",
                self.tokens,
                self.trace.join("\n")
            );
        }
        Ok(())
    }

    /// Envoy `i`'s stream reports at `now`; its answer (as `answer.rs` decides it)
    /// arrives `delay` later.
    fn report(&mut self, i: usize, weight: Option<u64>, delay: u64, now: u64) {
        let e = &mut self.envoys[i];
        let (name, own) = e.names(i);
        if !e.sent && e.first_seen == u64::MAX {
            e.first_seen = now;
        }
        let granted = self.claims.claim(
            &Report {
                name: &name,
                alias: &own,
                owner: &own,
                weight,
                resumed: e.resumed,
                tokens: self.tokens,
            },
            &TIMING,
            now,
        );
        self.trace.push(format!(
            "{now}: e{i} {own} as {name} resumed {} -> {granted:?}",
            e.resumed
        ));
        e.had_bucket = true;
        let waiting = e.resumed && !e.sent && now < e.first_seen + WAIT_MS;
        let own_claim = granted.on_alias || name == own;
        if waiting && own_claim && (granted.partial || granted.tokens == 0) {
            return;
        }
        e.sent = true;
        let at = (now + delay).max(e.last_delivery);
        e.last_delivery = at;
        self.sent += 1;
        self.inflight.push((at, self.sent, i, granted.tokens));
    }

    /// Envoy `i`'s stream ends; a restart also loses the Envoy's assignment.
    fn end(&mut self, i: usize, release: bool, restart: bool, now: u64) {
        let e = &mut self.envoys[i];
        let (name, own) = e.names(i);
        self.trace.push(format!(
            "{now}: e{i} {own} ends, release {release}, restart {restart}"
        ));
        if release {
            self.claims.release(&name, &own, &own, &TIMING, now);
        }
        e.stream += 1;
        e.sent = false;
        e.first_seen = u64::MAX;
        if restart {
            e.had_bucket = false;
            e.force = None;
            self.inflight.retain(|&(_, _, envoy, _)| envoy != i);
        }
        e.resumed = e.had_bucket;
    }
}

fn weights() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        Just(None),
        Just(Some(0)),
        Just(Some(SCALE)),
        (0..=SCALE).prop_map(Some)
    ]
}

fn limits() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1u64), Just(3), Just(10), Just(600)]
}

#[derive(Debug, Clone)]
enum Step {
    Report {
        weight: Option<u64>,
        delay: u64,
    },
    /// The stream ends (released or not) and the Envoy reconnects, keeping its
    /// assignment: its next report resumes the bucket.
    Reconnect {
        release: bool,
    },
    /// The Envoy process restarts: its assignment is gone, the bucket new to it.
    Restart {
        release: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        18 => (weights(), 0..=TIMING.grace_ms).prop_map(|(weight, delay)| Step::Report { weight, delay }),
        1 => any::<bool>().prop_map(|release| Step::Reconnect { release }),
        1 => any::<bool>().prop_map(|release| Step::Restart { release }),
    ]
}

impl Sim {
    fn apply(&mut self, i: usize, step: &Step, now: u64) {
        match *step {
            Step::Report { weight, delay } => self.report(i, weight, delay, now),
            Step::Reconnect { release } => self.end(i, release, false, now),
            Step::Restart { release } => self.end(i, release, true, now),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any timing: streams silent for any while, reports bunched; ids absent or each
    /// Envoy's own.
    #[test]
    fn assignments_in_force_never_sum_past_the_limit(
        tokens in limits(),
        unique in proptest::collection::vec(any::<bool>(), 12),
        steps in proptest::collection::vec((0..12usize, 0..8_000u64, step()), 1..300),
    ) {
        let ids = unique.iter().enumerate().map(|(i, u)| u.then_some(i as u8)).collect();
        let mut sim = Sim::new(tokens, ids);
        let mut now = 0;
        for (envoy, wait, step) in steps {
            now += wait;
            sim.deliver(now)?;
            sim.apply(envoy, &step, now);
        }
        sim.deliver(u64::MAX)?;
    }

    /// Envoy's timing (a live stream reports every 4-6 s; a restarted Envoy comes
    /// back within 10 s), with ids shared by several Envoys.
    #[test]
    fn with_envoys_timing_shared_ids_hold_too(
        tokens in limits(),
        ids in proptest::collection::vec(prop_oneof![Just(None), (0..3u8).prop_map(Some)], 2..10),
        steps in proptest::collection::vec((4_000..6_000u64, step()), 1..400),
    ) {
        let mut sim = Sim::new(tokens, ids);
        for (i, e) in sim.envoys.iter_mut().enumerate() {
            e.next = i as u64 * 700;
        }
        for (jitter, step) in steps {
            let (envoy, now) = sim
                .envoys
                .iter()
                .enumerate()
                .map(|(i, e)| (i, e.next))
                .min_by_key(|&(_, next)| next)
                .expect("envoys");
            sim.deliver(now)?;
            sim.apply(envoy, &step, now);
            // A reconnected Envoy's next report is on its timer; a restarted one
            // comes back after a while.
            sim.envoys[envoy].next = now
                + match step {
                    Step::Restart { .. } => jitter * 2,
                    _ => jitter,
                };
        }
        sim.deliver(u64::MAX)?;
    }
}
