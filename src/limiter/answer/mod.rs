//! What an answer carries beyond OK / OVER_LIMIT ([`headers`]).

mod headers;

pub use self::headers::{
    HeaderStyle, SHADOW_HEADER, denied_body, rate_limit_headers, retry_after_header,
    shadow_header,
};
