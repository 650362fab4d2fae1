//! Where a request's counter operations go on a cluster: grouped by the master that
//! serves their slots (every slot of one master in one atomic call, the any-slot
//! batch script), or by hash slot when the slot map names no master for a slot, and
//! for a request decided again after a misrouted call (`misroute.rs`).
//!
//! Why by master: with the default hash tag, distinct counters spread over all 16384
//! slots, so calls batched per slot carried about one decision each and paid the
//! script's whole fixed cost for it (1.00 EVALSHA per one-descriptor request, 6.02
//! per three-descriptor request on 3 masters). Per master, concurrent requests share
//! a call whatever their slots, and a request whose counters all live on one master
//! is one group: decided in one atomic call, nothing to order or refund.

use std::ops::Deref;
use std::sync::Arc;

use super::super::keys::slot_of;
use super::super::nodes::Nodes;

/// Where a group's call goes. The derived order (masters by address, then slots by
/// number) is the one global order every request acquires its groups in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// Every key of the group is on this master (`host:port`), by the slot map.
    Master(Arc<str>),
    /// Every key of the group is in this slot.
    Slot(u16),
}

/// One group: its route and the indices of its operations, in request order (so
/// duplicate counters are decided in request order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub route: Route,
    /// The slot of the group's first key: its master's breaker is the group's.
    pub slot: u16,
    pub indices: Vec<usize>,
}

impl Deref for Group {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        &self.indices
    }
}

impl<'a> IntoIterator for &'a Group {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;

    fn into_iter(self) -> Self::IntoIter {
        self.indices.iter()
    }
}

/// Indices of `keys` grouped by master (`nodes`' map; by slot for a slot it has no
/// master for, or for every key when `nodes` is `None`), groups in [`Route`] order.
pub fn group(keys: &[String], nodes: Option<&Nodes>) -> Vec<Group> {
    let slots: Vec<u16> = keys.iter().map(|key| slot_of(key)).collect();
    let owners = match nodes {
        Some(nodes) => nodes.owners(slots.iter().copied()),
        None => vec![None; slots.len()],
    };
    let mut groups: Vec<Group> = Vec::new();
    for (i, (slot, owner)) in slots.into_iter().zip(owners).enumerate() {
        let route = owner.map_or(Route::Slot(slot), Route::Master);
        match groups.iter_mut().find(|g| g.route == route) {
            Some(group) => group.indices.push(i),
            None => groups.push(Group {
                route,
                slot,
                indices: vec![i],
            }),
        }
    }
    // Routes are distinct, so the order is total: no two groups tie.
    groups.sort_unstable_by(|a, b| a.route.cmp(&b.route));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_hash_tag_in_slot_then_request_order() {
        let keys: Vec<String> = ["a{x}", "b{y}", "c{x}", "a{x}", "d{z}"]
            .map(String::from)
            .into();
        let slot = |tag: &str| slot_of(tag);
        let mut expected = vec![
            (slot("x"), vec![0, 2, 3]),
            (slot("y"), vec![1]),
            (slot("z"), vec![4]),
        ];
        expected.sort();
        let expected: Vec<Group> = expected
            .into_iter()
            .map(|(slot, indices)| Group {
                route: Route::Slot(slot),
                slot,
                indices,
            })
            .collect();
        assert_eq!(group(&keys, None), expected);
        assert!(slot("x") != slot("y") && slot("y") != slot("z"));
    }

    #[test]
    fn masters_come_before_slots_in_the_one_order() {
        let a = Route::Master(Arc::from("127.0.0.1:7000"));
        let b = Route::Master(Arc::from("127.0.0.1:7001"));
        let mut routes = vec![Route::Slot(3), b.clone(), Route::Slot(1), a.clone()];
        routes.sort();
        assert_eq!(routes, [a, b, Route::Slot(1), Route::Slot(3)]);
    }

    #[test]
    fn slot_numbers_agree_with_redis() {
        use redis::cluster_routing::Slot;
        // CRC16/XMODEM's check value, then the tag rules against redis-rs's own slots:
        // the first '{', the first '}' after it, an empty tag hashes the whole key.
        // (0x31C3, already below 16384).
        assert_eq!(slot_of("123456789"), 0x31C3);
        for key in [
            "foo",
            "{user1000}.following",
            "a{}b",
            "{}",
            "x{a}{b}",
            "{{a}}",
            "t{\u{e9}}z",
            "",
        ] {
            assert_eq!(
                Slot::new(slot_of(key)),
                Some(Slot::for_key(key.as_bytes())),
                "{key}"
            );
        }
    }
}
