//! Which master serves which hash slot, as `CLUSTER SLOTS` tells it: the map the
//! cluster path attributes each slot group's call to, so that each master has its
//! own breaker, errors and metrics. redis-rs routes the calls by its own slot map,
//! which it does not expose; this one is only for attribution, so a stale entry
//! (a failover not yet seen) blames the wrong breaker for a moment, never sends a
//! call to the wrong node.

use redis::Value;

/// Slot ranges (inclusive) with their master's `host:port`, sorted by start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMap {
    ranges: Vec<(u16, u16, String)>,
}

impl SlotMap {
    /// The master serving `slot`, if the map knows one.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        let i = self.ranges.partition_point(|(start, _, _)| *start <= slot);
        let (_, end, master) = self.ranges.get(i.checked_sub(1)?)?;
        (slot <= *end).then_some(master.as_str())
    }

    /// Every master that serves at least one slot, sorted, once each.
    pub fn masters(&self) -> Vec<&str> {
        let mut masters: Vec<&str> = self.ranges.iter().map(|(_, _, m)| m.as_str()).collect();
        masters.sort_unstable();
        masters.dedup();
        masters
    }

    /// Whether every one of the 16384 slots has a master.
    pub fn covers_all(&self) -> bool {
        let mut next: u32 = 0;
        for (start, end, _) in &self.ranges {
            if u32::from(*start) > next {
                return false;
            }
            next = next.max(u32::from(*end) + 1);
        }
        next == 16384
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Parses a `CLUSTER SLOTS` reply: per range `[start, end, [host, port, id, ...],
    /// replicas...]`. A master whose host is empty or `?` (an endpoint the node does not
    /// know) is skipped: its slots stay unmapped rather than wrongly named.
    pub fn parse(reply: &Value) -> Result<SlotMap, String> {
        let Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS: expected an array, got {reply:?}"));
        };
        let mut map = Vec::with_capacity(ranges.len());
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(format!("CLUSTER SLOTS: bad range {range:?}"));
            };
            let (Some(start), Some(end), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(format!("CLUSTER SLOTS: bad range {range:?}"));
            };
            let (start, end) = (slot(start)?, slot(end)?);
            let host = master.first().and_then(text).unwrap_or_default();
            let port = master.get(1).and_then(int);
            if let Some(port) = port.filter(|_| !host.is_empty() && host != "?") {
                map.push((start.min(end), end.max(start), format!("{host}:{port}")));
            }
        }
        map.sort_unstable();
        Ok(SlotMap { ranges: map })
    }
}

fn slot(value: &Value) -> Result<u16, String> {
    int(value)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&n| n < 16384)
        .ok_or_else(|| format!("CLUSTER SLOTS: bad slot number {value:?}"))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn range(start: i64, end: i64, master: Value) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            master,
            node("127.0.0.1", 9999),
        ])
    }

    #[test]
    fn maps_each_slot_to_its_master() {
        let reply = Value::Array(vec![
            range(10923, 16383, node("127.0.0.1", 7003)),
            range(0, 5460, node("127.0.0.1", 7001)),
            range(5461, 10922, node("10.0.0.2", 7002)),
            range(100, 100, node("?", 7004)),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.master_of(0), Some("127.0.0.1:7001"));
        assert_eq!(map.master_of(5460), Some("127.0.0.1:7001"));
        assert_eq!(map.master_of(5461), Some("10.0.0.2:7002"));
        assert_eq!(map.master_of(16383), Some("127.0.0.1:7003"));
        assert_eq!(map.master_of(16384), None);
        assert_eq!(
            map.masters(),
            ["10.0.0.2:7002", "127.0.0.1:7001", "127.0.0.1:7003"]
        );
        assert!(map.covers_all());
    }

    #[test]
    fn gaps_and_garbage() {
        let reply = Value::Array(vec![range(10, 20, node("h", 1))]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.master_of(9), None);
        assert_eq!(map.master_of(21), None);
        assert!(!map.covers_all() && !SlotMap::default().covers_all());
        assert!(SlotMap::parse(&Value::Int(1)).is_err());
        assert!(SlotMap::parse(&Value::Array(vec![Value::Int(1)])).is_err());
        let bad = Value::Array(vec![range(0, 70000, node("h", 1))]);
        assert!(SlotMap::parse(&bad).is_err());
        assert!(SlotMap::default().is_empty());
    }
}
