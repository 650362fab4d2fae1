//! Global rules in one request (`global: true`, docs/global.md): the region's share
//! becomes the operation's limit ([`share`], from the table the ledger client keeps;
//! no request waits on the ledger), and operations whose region holds no share of
//! the window are denied here, never sent to the store ([`count`]).
//!
//! A global operation always limits: a release (`is_negative_hits`) is a check (hits
//! given back would let the region pass its share: the ledger counts what the
//! counter holds), and the deployment-wide charges (`QUOTA_MODE`,
//! `--overdraft-domains`) do not apply (a charge admits past the limit, once per
//! region); the config refuses them on a global rule itself.

use std::sync::Arc;

use crate::algorithm::{Decision, Division, Mode, Params};
use crate::config::{Rule, RuleKind};
use crate::global::table::{Entry, Lookup, Table};
use crate::store::CounterOp;

/// One global operation of a request.
pub struct GlobalOp {
    /// Its index in the request's operations.
    pub op: usize,
    /// Its counter in the table, to note the request's demand on.
    pub entry: Arc<Entry>,
    /// `Some`: no share, denied with this decision without asking the store.
    pub unshared: Option<Decision>,
}

/// The configured limit a global counter divides, when `op` counts on one: the
/// rule's limit of the operation's algorithm and window (an operation from Envoy's
/// override counts on the rule's counter when those agree).
fn divided(rule: &Rule, op: &CounterOp) -> Option<Params> {
    if !rule.global {
        return None;
    }
    let RuleKind::Limited(limits) = &rule.kind else {
        return None;
    };
    limits
        .iter()
        .find(|l| l.algorithm == op.key.algorithm && l.window_secs() == op.key.window_secs)
        .map(|l| l.params())
}

/// Makes `op` (the request's `index`-th) decide against the region's share when it
/// counts on a global rule's counter.
pub fn share(
    table: &Table,
    counter_rule: Option<&Rule>,
    index: usize,
    op: &mut CounterOp,
) -> Option<GlobalOp> {
    let base = divided(counter_rule?, op)?;
    let division = base.algorithm.division();
    if matches!(division, Division::Refused(_)) {
        return None;
    }
    if op.mode == Mode::Release {
        op.cost = 0;
    }
    op.mode = Mode::Limit;
    let (entry, lookup) = table.lookup(&op.key, &base, division);
    let unshared = match lookup {
        Lookup::Shared(shared) => {
            // Envoy's override on the rule's counter keeps its own limit where lower
            // (it only admits less: the counter also holds what the region released).
            let limit = if op.params == base {
                shared.limit
            } else {
                shared.limit.min(op.params.limit)
            };
            op.params = Params { limit, ..shared };
            None
        }
        Lookup::Unshared(denied) => Some(denied),
    };
    Some(GlobalOp {
        op: index,
        entry,
        unshared,
    })
}

/// The operations the store decides: all but those denied for want of a share
/// (`None` when there are none), with each one's index in the request's.
pub fn to_decide(ops: &[CounterOp], global: &[GlobalOp]) -> Option<(Vec<CounterOp>, Vec<usize>)> {
    if global.iter().all(|g| g.unshared.is_none()) {
        return None;
    }
    let denied = |i: usize| global.iter().any(|g| g.op == i && g.unshared.is_some());
    let (kept, index): (Vec<CounterOp>, Vec<usize>) = ops
        .iter()
        .enumerate()
        .filter(|(i, _)| !denied(*i))
        .map(|(i, op)| (op.clone(), i))
        .unzip();
    Some((kept, index))
}

/// Whether a denial for want of a share vetoes the request (it is not shadow).
pub fn unshared_vetoes(ops: &[CounterOp], global: &[GlobalOp]) -> bool {
    global
        .iter()
        .any(|g| g.unshared.is_some() && ops[g.op].vetoes)
}

/// The request's decisions in its operations' order: the store's for the operations
/// it decided (`index` says which), the denials for the others.
pub fn merge(
    total: usize,
    decided: Vec<Decision>,
    index: &[usize],
    global: &[GlobalOp],
) -> Vec<Decision> {
    let mut out: Vec<Option<Decision>> = vec![None; total];
    for (d, &i) in decided.into_iter().zip(index) {
        out[i] = Some(d);
    }
    for g in global {
        if let Some(denied) = g.unshared {
            out[g.op] = Some(denied);
        }
    }
    out.into_iter()
        .map(|d| d.expect("every operation is decided or denied"))
        .collect()
}

/// Notes the request's demand on each global counter, and wakes the sync when one
/// was denied (it may bring more share).
pub fn note(table: &Table, ops: &[CounterOp], decisions: &[Decision], global: &[GlobalOp]) {
    for g in global {
        g.entry.note(ops[g.op].cost);
        if !decisions[g.op].allowed {
            table.denied();
        }
    }
}
