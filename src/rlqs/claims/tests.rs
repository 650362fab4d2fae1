//! `claims`' steps, case by case: newcomers, more streams than tokens, a liar, holds
//! outliving their stream, client ids told apart, taken over, shown shared. The
//! bound itself is proven by the simulation (`simulation.rs`).

use super::*;
use crate::rlqs::share::SCALE;

/// Envoy 1.40's timing: 5 s reports, a 30 s TTL, 2 s margins.
pub(super) const TTL_MS: u64 = 30_000;
/// How long a resumed stream waits for its whole share (`answer.rs`).
pub(super) const WAIT_MS: u64 = TTL_MS - 5_000 - 2_000;
pub(super) const TIMING: Timing = Timing {
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
