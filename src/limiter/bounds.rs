//! Bounds on what one request may carry, and the check of a request against them and
//! the protocol: beyond them a request is refused with `INVALID_ARGUMENT` and a
//! message saying what is wrong, rather than costing memory and Redis work.

use crate::error::Error;
use crate::proto::RateLimitRequest;

pub const MAX_DOMAIN_BYTES: usize = 256;
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 32;
pub const MAX_KEY_BYTES: usize = 256;
pub const MAX_VALUE_BYTES: usize = 8 * 1024;

pub fn validate(request: &RateLimitRequest) -> Result<(), Error> {
    let invalid = |msg: String| Err(Error::InvalidRequest(msg));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > MAX_DOMAIN_BYTES {
        return invalid(format!(
            "domain is {} bytes; at most {MAX_DOMAIN_BYTES} are allowed",
            request.domain.len()
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS} are allowed per request",
            request.descriptors.len()
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptor {i}: {} entries; at most {MAX_ENTRIES} are allowed",
                descriptor.entries.len()
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return invalid(format!("descriptor {i} entry {j}: key must not be empty"));
            }
            if entry.key.len() > MAX_KEY_BYTES {
                return invalid(format!(
                    "descriptor {i} entry {j}: key is {} bytes; at most {MAX_KEY_BYTES} are allowed",
                    entry.key.len()
                ));
            }
            if entry.value.len() > MAX_VALUE_BYTES {
                return invalid(format!(
                    "descriptor {i} entry {j} ('{}'): value is {} bytes; at most {MAX_VALUE_BYTES} are allowed",
                    entry.key,
                    entry.value.len()
                ));
            }
        }
    }
    Ok(())
}
