//! The batch script's argument pairs: one per operation, except that consecutive
//! one-operation requests (not dry runs) with the same operation on the same counter,
//! a hot counter's requests under load, share one pair with a run length. Each
//! request is still decided and answered on its own (lua/batch.lua); a run spares
//! Redis a key and an operation argument per request, and the script its lookups.

use super::{Flag, Segment, WireOp};

/// One key and operation pair of a batch call, standing for `run` requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry<'a> {
    pub key: &'a str,
    pub op: &'a WireOp,
    pub flag: Flag,
    /// How many alike one-operation requests this pair stands for (1 to 255: one
    /// byte each in the script's run argument).
    pub run: u8,
    /// Whether this pair is a whole request (one operation, not a dry run), the only
    /// kind a run may extend.
    alone: bool,
}

/// The pairs of `segments`, in order.
pub(super) fn entries<'a, K: AsRef<str>>(segments: &[Segment<'a, K>]) -> Vec<Entry<'a>> {
    let mut out: Vec<Entry<'a>> = Vec::with_capacity(segments.len());
    for segment in segments {
        if let ([key], [op], false) = (segment.keys, segment.ops, segment.dry_run) {
            let key = key.as_ref();
            match out.last_mut() {
                Some(last)
                    if last.alone && last.run < u8::MAX && last.key == key && last.op == op =>
                {
                    last.run += 1;
                }
                _ => out.push(Entry {
                    key,
                    op,
                    flag: Flag::Starts,
                    run: 1,
                    alone: true,
                }),
            }
            continue;
        }
        let mut flag = if segment.dry_run {
            Flag::StartsDry
        } else if repeats(segment.keys) {
            Flag::StartsRepeating
        } else {
            Flag::Starts
        };
        for (key, op) in segment.keys.iter().zip(segment.ops) {
            out.push(Entry {
                key: key.as_ref(),
                op,
                flag,
                run: 1,
                alone: false,
            });
            flag = Flag::Continues;
        }
    }
    out
}

/// Whether `keys` name one counter more than once. Said here, once per request, so the
/// script's fast path need not compare each operation's key with the ones before it.
fn repeats<K: AsRef<str>>(keys: &[K]) -> bool {
    if keys.len() <= 16 {
        return keys
            .iter()
            .enumerate()
            .any(|(i, k)| keys[..i].iter().any(|e| e.as_ref() == k.as_ref()));
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    !keys.iter().all(|k| seen.insert(k.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(cost: u64) -> WireOp {
        WireOp {
            algorithm: 1,
            limit: 10,
            window_ms: 60_000,
            burst: 10,
            max_delay_ms: -1,
            cost,
            vetoes: true,
            calendar: None,
            mode: 0,
            lease: None,
        }
    }

    fn shape<'a>(entries: &[Entry<'a>]) -> Vec<(&'a str, u64, u8, u8)> {
        entries
            .iter()
            .map(|e| (e.key, e.op.cost, e.flag as u8, e.run))
            .collect()
    }

    #[test]
    fn alike_requests_in_a_row_share_a_pair_and_nothing_else_does() {
        let (one, two) = ([wire(1)], [wire(2)]);
        let (a, b) = (["a"], ["b"]);
        let pair_ops = [wire(1), wire(1)];
        let pair_keys = ["a", "a"];
        let alone = |keys, ops| Segment {
            keys,
            ops,
            dry_run: false,
        };
        let segments = [
            alone(&a[..], &one[..]),
            alone(&a, &one),
            alone(&a, &one),
            // Another cost, another counter: new pairs.
            alone(&a, &two),
            alone(&b, &two),
            // A dry run is never part of a run, nor is what follows it.
            Segment {
                keys: &b,
                ops: &two,
                dry_run: true,
            },
            alone(&b, &two),
            // A request of two operations: two pairs, and neither extends a run; it
            // names counter a twice, and its first pair says so.
            alone(&pair_keys, &pair_ops),
            alone(&a, &one),
        ];
        let (plus, minus, dot, star) = (b'+', b'-', b'.', b'*');
        assert_eq!(
            shape(&entries(&segments)),
            [
                ("a", 1, plus, 3),
                ("a", 2, plus, 1),
                ("b", 2, plus, 1),
                ("b", 2, minus, 1),
                ("b", 2, plus, 1),
                ("a", 1, star, 1),
                ("a", 1, dot, 1),
                ("a", 1, plus, 1),
            ]
        );
    }

    #[test]
    fn a_run_stops_at_255() {
        let op = [wire(1)];
        let key = ["hot"];
        let segments: Vec<Segment<'_, &str>> = (0..600)
            .map(|_| Segment {
                keys: &key,
                ops: &op,
                dry_run: false,
            })
            .collect();
        let runs: Vec<u8> = entries(&segments).iter().map(|e| e.run).collect();
        assert_eq!(runs, [255, 255, 90]);
    }
}
