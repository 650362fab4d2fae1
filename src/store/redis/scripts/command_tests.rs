//! Unit tests of [`super`]: each command's arguments in order (keys, segments,
//! arguments), alike operations sent once, the any-slot layout, a hot counter's run,
//! the extremes' encoding, and the refund command.

use super::*;
use crate::config::{Limit, Unit};
use crate::store::{CounterKey, CounterOp};
use std::sync::Arc;

fn op(limit: u32, cost: u64, vetoes: bool) -> CounterOp {
    let limit = Limit::fixed(limit, Unit::Minute);
    CounterOp {
        key: CounterKey {
            domain: Arc::from("d"),
            rule: Arc::from("k"),
            entries: [("k".into(), "v".into())].into_iter().collect(),
            algorithm: limit.algorithm,
            window_secs: limit.window_secs(),
            time_zone: None,
            hash_tag: None,
        },
        params: limit.params(),
        cost,
        vetoes,
        mode: crate::algorithm::Mode::Limit,
        lease: None,
    }
}

/// The bytes of one operation as the scripts unpack them (`<BBddddBd`).
fn encoded(flag: u8, id: u8, numbers: [f64; 4], vetoes: u8, cost: f64) -> Vec<u8> {
    let mut bytes = vec![flag, id];
    for x in numbers {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.push(vetoes);
    bytes.extend_from_slice(&cost.to_le_bytes());
    bytes
}

fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            _ => b"<other>".to_vec(),
        })
        .collect()
}

#[test]
fn batch_cmd_is_evalsha_with_keys_then_segments_then_arguments() {
    let ops = [op(10, 1, true), op(5, 2, false), op(7, 1, true)];
    let wire: Vec<WireOp> = ops.iter().map(WireOp::new).collect();
    let keys = ["a{x}", "b{x}", "c{y}"];
    let segments = [
        Segment {
            keys: &keys[..2],
            ops: &wire[..2],
            dry_run: true,
        },
        Segment {
            keys: &keys[2..],
            ops: &wire[2..],
            dry_run: false,
        },
    ];
    let cmd = batch_cmd(&segments, None);
    let text = |s: &str| s.as_bytes().to_vec();
    let expected = [
        text("EVALSHA"),
        text(BATCH.get_hash()),
        text("3"),
        text("a{x}"),
        text("b{x}"),
        text("c{y}"),
        text(""),
        // The call's flags: this release's layouts.
        text(""),
        // Each key's operation among the distinct ones; no run.
        vec![1, 2, 3],
        text(""),
        // The first segment is a dry run: "-" starts it, "." continues it.
        encoded(b'-', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0),
        encoded(b'.', 1, [5.0, 60000.0, 5.0, -1.0], 0, 2.0),
        encoded(b'+', 1, [7.0, 60000.0, 7.0, -1.0], 1, 1.0),
    ];
    assert_eq!(args(&cmd), expected);
    assert!(expected[10..].iter().all(|op| op.len() == OP_LEN));
    let one = [Segment {
        keys: &keys[..1],
        ops: &wire[..1],
        dry_run: false,
    }];
    let injected = args(&batch_cmd(&one, Some(1234)));
    assert_eq!(injected[4], b"1234");
    assert_eq!(
        injected[8],
        encoded(b'+', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0)
    );
}

/// A call's operations are sent once each: the index names each key's, by its
/// place among them, a flag apart making another; past 32 every key sends its own.
#[test]
fn alike_operations_are_sent_once_and_indexed() {
    let wire = [WireOp::new(&op(10, 1, true)), WireOp::new(&op(5, 2, false))];
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    // Requests of two operations, each the same pair: "+" first, "." second.
    let segments: Vec<Segment<'_, String>> = keys
        .chunks(2)
        .map(|keys| Segment {
            keys,
            ops: &wire[..],
            dry_run: false,
        })
        .collect();
    let sent = args(&batch_cmd(&segments, None));
    assert_eq!(sent.len(), 3 + 6 + 4 + 2);
    assert_eq!(sent[11], vec![1, 2, 1, 2, 1, 2]);
    assert_eq!(sent[13][0], b'+');
    assert_eq!(sent[14][0], b'.');

    let many: Vec<WireOp> = (0..300)
        .map(|i| WireOp::new(&op(10 + i, 1, true)))
        .collect();
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    let segments: Vec<Segment<'_, String>> = keys
        .iter()
        .zip(&many)
        .map(|(key, op)| Segment {
            keys: std::slice::from_ref(key),
            ops: std::slice::from_ref(op),
            dry_run: false,
        })
        .collect();
    let sent = args(&batch_cmd(&segments, None));
    assert_eq!(sent[3 + 300 + 2], b"", "no index");
    assert_eq!(sent.len(), 3 + 300 + 4 + 300);
}

/// The any-slot layout declares no key: their count, the keys, then the
/// arguments exactly as the declared layout sends them.
#[test]
fn any_slot_cmd_passes_its_keys_after_their_count() {
    let wire = [WireOp::new(&op(10, 1, true)), WireOp::new(&op(5, 2, false))];
    let keys = ["a{x}", "b{y}"];
    let segments = [Segment {
        keys: &keys[..],
        ops: &wire[..],
        dry_run: false,
    }];
    let declared = args(&batch_cmd(&segments, None));
    let any = args(&batch_cmd_in(Layout::AnySlot, &segments, None));
    let text = |s: &str| s.as_bytes().to_vec();
    assert_eq!(
        any[..3],
        [text("EVALSHA"), text(BATCH_ANY_SLOT.get_hash()), text("0")]
    );
    // Declared: EVALSHA, sha, 2, keys, ...; any-slot: EVALSHA, sha, 0, 2, keys, ...
    assert_eq!(any[3..], declared[2..]);
    assert!(BATCH_ANY_SLOT.get_hash() != BATCH.get_hash());
}

/// Alike one-operation requests in a row on one counter are one pair; their run
/// lengths follow the index, one byte per pair.
#[test]
fn a_hot_counter_is_one_pair_with_its_run_length() {
    let wire = [WireOp::new(&op(10, 1, true))];
    let (hot, other) = (["hot"], ["other"]);
    let segment = |keys| Segment {
        keys,
        ops: &wire[..],
        dry_run: false,
    };
    let segments = [
        segment(&hot[..]),
        segment(&hot),
        segment(&hot),
        segment(&other),
    ];
    let op = encoded(b'+', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0);
    let text = |s: &str| s.as_bytes().to_vec();
    assert_eq!(
        args(&batch_cmd(&segments, None)),
        [
            text("EVALSHA"),
            text(BATCH.get_hash()),
            text("2"),
            text("hot"),
            text("other"),
            text(""),
            text(""),
            vec![1, 1],
            vec![3, 1],
            op,
        ]
    );
}

/// The extremes arrive as the doubles Lua would have read from their decimals.
#[test]
fn the_extremes_are_encoded_as_the_nearest_doubles() {
    let wire = WireOp {
        algorithm: u8::MAX,
        limit: u64::MAX,
        window_ms: u64::MAX,
        burst: u64::MAX,
        max_delay_ms: i64::MIN,
        cost: u64::MAX,
        vetoes: true,
        calendar: None,
        mode: 0,
        lease: None,
    };
    let mut cmd = Cmd::new();
    wire.write(&mut cmd, Flag::StartsDry, 0);
    let max: f64 = u64::MAX.to_string().parse().expect("a number");
    let min: f64 = i64::MIN.to_string().parse().expect("a number");
    assert_eq!(
        args(&cmd),
        [encoded(b'-', 255, [max, max, max, min], 1, max)]
    );
}

#[test]
fn refund_cmd_is_evalsha_with_the_batch_encoding_then_the_token() {
    let ops = [op(10, 1, true), op(5, 2, false)];
    let refunds: Vec<Refund> = ops
        .iter()
        .zip(["a{x}", "b{x}"])
        .zip([7, -3])
        .map(|((o, key), token)| Refund {
            key: key.into(),
            op: WireOp::new(o),
            token,
        })
        .collect();
    let refs: Vec<&Refund> = refunds.iter().collect();
    let text = |s: &str| s.as_bytes().to_vec();
    // The clock ("": the server's), then per operation: its encoding as the batch
    // script reads it, then the token.
    let expected = [
        text("EVALSHA"),
        text(REFUND.get_hash()),
        text("2"),
        text("a{x}"),
        text("b{x}"),
        text(""),
        encoded(b'.', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0),
        text("7"),
        encoded(b'.', 1, [5.0, 60000.0, 5.0, -1.0], 0, 2.0),
        text("-3"),
    ];
    assert_eq!(args(&refund_cmd(&refs, None)), expected);
}
