//! `claims`' bound proven the way Envoys see it: a simulation of Envoys (streams that
//! report, end with or without a release, reconnect and resume, restart; client ids
//! absent, unique or shared; liars; answers delivered late, by up to the margin the
//! ledger allows) checks, at every instant an answer reaches an Envoy, that the
//! assignments in force sum to at most the limit. Two timings: any gaps between
//! reports (clients that are not Envoy), with ids absent or unique; and Envoy's (a
//! live stream reports every 4-6 s), with ids shared by several Envoys too.

use proptest::prelude::*;

use super::tests::{TIMING, TTL_MS, WAIT_MS};
use super::*;
use crate::rlqs::share::SCALE;

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
