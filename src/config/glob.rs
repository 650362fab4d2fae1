//! Wildcard values: a descriptor `value` containing `*` matches any request value in
//! which every `*` stands for any (possibly empty) run of characters. There may be
//! several `*` anywhere in the value (`api-*-v*`); a bare `*` matches every value.

/// A compiled wildcard pattern: literal pieces between the stars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    /// Literal text between stars; `pieces.len() == stars + 1`.
    pieces: Vec<String>,
}

impl Glob {
    /// `None` when `pattern` holds no `*` (an exact value, not a wildcard).
    pub fn new(pattern: &str) -> Option<Glob> {
        if !pattern.contains('*') {
            return None;
        }
        Some(Glob {
            pattern: pattern.to_owned(),
            pieces: pattern.split('*').map(str::to_owned).collect(),
        })
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `value` matches. Leftmost-first matching of each middle piece is
    /// enough: with only `*` wildcards, taking the earliest occurrence of a piece never
    /// prevents a later piece from matching. No allocation.
    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return false,
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        let Some(mut tail) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        for piece in middle {
            match tail.find(piece.as_str()) {
                Some(at) => tail = &tail[at + piece.len()..],
                None => return false,
            }
        }
        tail.len() >= last.len() && tail.ends_with(last.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn glob(p: &str) -> Glob {
        Glob::new(p).expect("pattern has a star")
    }

    #[test]
    fn exact_values_are_not_globs() {
        assert!(Glob::new("plain").is_none());
    }

    #[test]
    fn trailing_star_is_a_prefix_match() {
        assert!(glob("foo*").matches("foo"));
        assert!(glob("foo*").matches("foobar"));
        assert!(!glob("foo*").matches("fo"));
        assert!(!glob("foo*").matches("xfoo"));
    }

    #[test]
    fn stars_anywhere_and_several() {
        let g = glob("api-*-v*");
        assert!(g.matches("api-users-v2"));
        assert!(g.matches("api--v"));
        assert!(!g.matches("api-users-2"));
        assert!(glob("*.example.com").matches("a.b.example.com"));
        assert!(!glob("*.example.com").matches("example.com"));
        assert!(glob("a*b*c").matches("abc"));
        assert!(glob("a*b*c").matches("aXbYbZc"));
        assert!(!glob("a*b*c").matches("acb"));
        assert!(glob("*").matches(""));
        assert!(glob("**").matches("anything"));
    }

    #[test]
    fn suffix_cannot_overlap_the_prefix() {
        assert!(!glob("ab*ba").matches("aba"));
        assert!(glob("ab*ba").matches("abba"));
    }
}
