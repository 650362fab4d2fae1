//! The batch script's reply: one string of little-endian doubles holding, per
//! operation, a full form or a repeat of the previous operation's last three values
//! (lua/batch.lua), parsed into decisions and refund tokens. A reply that does not
//! parse is an error, never a panic.

use std::time::Duration;

use crate::algorithm::Decision;

/// One operation's reply: the decision and the refund token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub decision: Decision,
    pub token: i64,
}

/// Parses the batch reply for `n` operations (see [`parse_values`]).
pub fn parse_batch_reply(bytes: &[u8], n: usize) -> Result<Vec<Reply>, String> {
    parse_values(&numbers(bytes, n)?, n)
}

/// The reply's numbers. Why doubles: they are Lua's numbers, so the script packs them
/// without converting; `as` truncates toward zero, as Redis did when it turned a Lua
/// number into an integer reply, so every value is the one the table reply carried.
fn numbers(bytes: &[u8], n: usize) -> Result<Vec<i64>, String> {
    let (chunks, rest) = bytes.as_chunks::<8>();
    if !rest.is_empty() {
        return Err(format!(
            "batch script reply for {n} operations: {} bytes, not whole numbers",
            bytes.len()
        ));
    }
    chunks
        .iter()
        .map(|chunk| {
            let value = f64::from_le_bytes(*chunk);
            if value.is_finite() {
                Ok(value as i64)
            } else {
                Err(format!(
                    "batch script reply for {n} operations: {value} is not a number of one"
                ))
            }
        })
        .collect()
}

/// Parses the reply's numbers for `n` operations: per operation either the full form,
/// `[remaining, or -1 when denied; reset; delay if allowed, else retry (-1 = never);
/// token]`, or one value v <= -2 that repeats the previous operation's last three
/// with -3 - v first (see lua/batch.lua).
fn parse_values(values: &[i64], n: usize) -> Result<Vec<Reply>, String> {
    let malformed = |what: &str| format!("batch script reply for {n} operations: {what}");
    let mut replies = Vec::with_capacity(n);
    let mut previous: Option<[i64; 3]> = None;
    let mut rest = values;
    while let Some((&head, tail)) = rest.split_first() {
        if replies.len() == n {
            return Err(malformed(&format!("{} values too many", rest.len())));
        }
        let (first, last3) = if head <= -2 {
            let last3 = previous.ok_or_else(|| malformed("a repeat with nothing before it"))?;
            rest = tail;
            // Cannot overflow: head <= -2.
            (-3 - head, last3)
        } else {
            let (full, tail) = tail
                .split_first_chunk::<3>()
                .ok_or_else(|| malformed("a full form cut short"))?;
            rest = tail;
            (head, *full)
        };
        previous = Some(last3);
        replies.push(reply(first, last3));
    }
    if replies.len() != n {
        return Err(malformed(&format!("{} replies", replies.len())));
    }
    Ok(replies)
}

/// One operation's reply from its four values (see [`parse_batch_reply`]).
fn reply(first: i64, [reset, third, token]: [i64; 3]) -> Reply {
    let non_negative = |v: i64| u64::try_from(v).unwrap_or(0);
    let allowed = first >= 0;
    Reply {
        decision: Decision {
            allowed,
            remaining: non_negative(first),
            reset_after: Duration::from_millis(non_negative(reset)),
            retry_after: (!allowed && third >= 0)
                .then(|| Duration::from_millis(non_negative(third))),
            delay: if allowed {
                Duration::from_micros(non_negative(third))
            } else {
                Duration::ZERO
            },
        },
        token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_carry_remaining_or_denial_then_reset_then_delay_or_retry() {
        let replies = parse_values(&[3, 1000, 250, 7, -1, 500, 400, 0, -1, 60, -1, 0], 3)
            .expect("well-formed");
        let ms = Duration::from_millis;
        let allowed = replies[0].decision;
        assert!(allowed.allowed);
        assert_eq!(
            (allowed.remaining, allowed.reset_after, allowed.retry_after),
            (3, ms(1000), None)
        );
        assert_eq!(allowed.delay, Duration::from_micros(250));
        assert_eq!(replies[0].token, 7);
        let denied = replies[1].decision;
        assert!(!denied.allowed);
        assert_eq!((denied.remaining, denied.retry_after), (0, Some(ms(400))));
        assert_eq!(denied.delay, Duration::ZERO);
        assert_eq!(replies[2].decision.retry_after, None, "-1: never");
        assert!(parse_values(&[1, 2, 3], 1).is_err());
    }

    /// A repeat takes the previous operation's reset, delay or retry and token, with
    /// its own first value: -2 a denial, -3 - r an admission with r remaining.
    #[test]
    fn a_repeat_is_one_value_with_the_previous_last_three() {
        let replies =
            parse_values(&[9, 1000, 0, 42, -12, -2, 5, 700, 0, 43], 4).expect("well-formed");
        let first: Vec<_> = replies
            .iter()
            .map(|r| (r.decision.allowed, r.decision.remaining, r.token))
            .collect();
        assert_eq!(
            first,
            [(true, 9, 42), (true, 9, 42), (false, 0, 42), (true, 5, 43)]
        );
        assert_eq!(replies[1].decision.reset_after, Duration::from_millis(1000));
        // A denial repeating an admission's "delay 0" reads it as "retry in 0 ms".
        assert_eq!(replies[2].decision.retry_after, Some(Duration::ZERO));
        assert_eq!(replies[3].decision.reset_after, Duration::from_millis(700));
    }

    #[test]
    fn a_reply_that_does_not_add_up_is_an_error() {
        for (values, n) in [
            (&[-5, 1, 2, 3][..], 1),
            (&[1, 2, 3][..], 1),
            (&[1, 2, 3, 4, -3][..], 1),
            (&[1, 2, 3, 4][..], 2),
            (&[][..], 1),
            (&[i64::MIN, 1, 2, 3][..], 1),
        ] {
            assert!(parse_values(values, n).is_err(), "{values:?} for {n}");
        }
        let min = parse_values(&[1, 2, 3, 4, i64::MIN], 2).expect("repeat");
        assert_eq!(min[1].decision.remaining, (i64::MAX - 2) as u64);
    }

    fn packed(values: &[f64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn the_string_holds_doubles_truncated_as_redis_truncated_lua_numbers() {
        let replies =
            parse_batch_reply(&packed(&[3.0, 1000.9, -1.0, 1.7e15]), 1).expect("well-formed");
        assert_eq!(replies[0].decision.remaining, 3);
        assert_eq!(replies[0].decision.reset_after, Duration::from_millis(1000));
        assert_eq!(replies[0].token, 1_700_000_000_000_000);
        let bytes = packed(&[3.0, 1000.0, 0.0, 7.0]);
        for bad in [&bytes[..31], &packed(&[3.0, 1000.0, f64::NAN, 7.0])[..]] {
            assert!(parse_batch_reply(bad, 1).is_err());
        }
        assert!(parse_batch_reply(&packed(&[f64::INFINITY, 1.0, 0.0, 7.0]), 1).is_err());
    }
}
