//! `tollgate check`: one ShouldRateLimit call to any RateLimitService server, printed
//! as a table. Exit 0 when the answer is OK, 1 when it is OVER_LIMIT, 2 on any error
//! (bad argument, no answer, gRPC error). The table says when a descriptor matched no
//! limit (unknown domain or no rule: the server answers OK without a limit) and when
//! the answer came from the domain's `failure_mode` rather than the counter store.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::console;
use crate::config::Unit;
use crate::limiter::answer::{FALLBACK_FIELD, METADATA_NAMESPACE};
use crate::proto::rate_limit_descriptor::Entry;
use crate::proto::rate_limit_response::Code;
use crate::proto::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};
use crate::settings::{DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Server address (http://host:port or host:port)
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub addr: String,
    #[arg(long)]
    pub domain: String,
    /// One descriptor as k=v[,k=v...]; repeat for several descriptors
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Request-level hits_addend
    #[arg(long)]
    pub hits: Option<u32>,
    /// Give up after this many milliseconds
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// What `check` ends with, and its exit code: scripts can branch on the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 0: the server answered OK.
    Ok,
    /// 1: the server answered OVER_LIMIT.
    OverLimit,
    /// 2: a bad argument, no answer, a gRPC error or an answer that is neither.
    Error,
}

impl Outcome {
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            Outcome::Ok => 0,
            Outcome::OverLimit => 1,
            Outcome::Error => 2,
        })
    }
}

pub async fn run(args: CheckArgs) -> ExitCode {
    check(args).await.exit_code()
}

async fn check(args: CheckArgs) -> Outcome {
    let descriptors = match args
        .descriptors
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(d) => d,
        Err(e) => {
            console::eprintln(&format!("tollgate check: {e}"));
            return Outcome::Error;
        }
    };
    let request = RateLimitRequest {
        domain: args.domain.clone(),
        descriptors,
        hits_addend: args.hits.unwrap_or(0),
    };
    let addr = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("http://{}", args.addr)
    };
    let call = async {
        let mut client = RateLimitServiceClient::connect(addr.clone())
            .await
            .map_err(|e| e.to_string())?;
        client
            .should_rate_limit(request.clone())
            .await
            .map(|r| r.into_inner())
            .map_err(|s| describe_status(&s))
    };
    match tokio::time::timeout(Duration::from_millis(args.timeout_ms), call).await {
        Ok(Ok(response)) => {
            if !console::print_or_report("check", &render(&request, &response)) {
                return Outcome::Error;
            }
            match Code::try_from(response.overall_code) {
                Ok(Code::Ok) => Outcome::Ok,
                Ok(Code::OverLimit) => Outcome::OverLimit,
                _ => {
                    console::eprintln(&format!(
                        "tollgate check: {addr}: the overall code {} is neither OK nor OVER_LIMIT",
                        response.overall_code
                    ));
                    Outcome::Error
                }
            }
        }
        Ok(Err(e)) => {
            console::eprintln(&format!("tollgate check: {addr}: {e}"));
            Outcome::Error
        }
        Err(_) => {
            console::eprintln(&format!(
                "tollgate check: {addr}: no answer within {} ms",
                args.timeout_ms
            ));
            Outcome::Error
        }
    }
}

/// A gRPC error as one line. An HTTP answer without `grpc-status` means the address
/// serves plain HTTP: most often tollgate's own admin port, so the line says which
/// port speaks gRPC instead of leaving the reader with tonic's wording alone.
pub fn describe_status(status: &tonic::Status) -> String {
    let line = format!("{:?}: {}", status.code(), status.message());
    if status.message().contains("grpc-status header missing") {
        let port = |addr: &'static str| addr.rsplit_once(':').map_or(addr, |(_, port)| port);
        let (grpc, http) = (port(DEFAULT_GRPC_ADDR), port(DEFAULT_HTTP_ADDR));
        format!(
            "{line}\n  this address answers plain HTTP, not gRPC: it looks like tollgate's HTTP \
             admin port ({http} by default); `check` talks to the gRPC port ({grpc} by \
             default), e.g. --addr 127.0.0.1:{grpc}"
        )
    } else {
        line
    }
}

/// `k=v,k2=v2` -> a descriptor. The first `=` of each entry separates key and value.
pub fn parse_descriptor(text: &str) -> Result<RateLimitDescriptor, String> {
    let entries = text
        .split(',')
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("descriptor entry '{pair}' is not key=value"))?;
            Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

/// The decision as an aligned text table, one row per descriptor, then notes on
/// descriptors that matched no limit and on a fallback answer.
pub fn render(request: &RateLimitRequest, response: &RateLimitResponse) -> String {
    let mut rows = vec![[
        "DESCRIPTOR".to_owned(),
        "CODE".into(),
        "LIMIT".into(),
        "REMAINING".into(),
        "RESET".into(),
    ]];
    let mut unmatched = Vec::new();
    for (descriptor, status) in request.descriptors.iter().zip(&response.statuses) {
        let entries: Vec<String> = descriptor
            .entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        let entries = entries.join(",");
        let (limit, remaining) = match &status.current_limit {
            Some(l) => {
                let unit = Unit::from_proto(l.unit).map_or("?", Unit::name);
                let name = if l.name.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", l.name)
                };
                (
                    format!("{}/{unit}{name}", l.requests_per_unit),
                    status.limit_remaining.to_string(),
                )
            }
            // tollgate (like envoyproxy/ratelimit) answers `unlimited: true` with all
            // the room there is, and "no limit applies" with 0: neither is a count.
            None if status.limit_remaining == u32::MAX => ("unlimited".into(), "-".into()),
            None => {
                unmatched.push(entries.clone());
                ("no-limit".into(), "-".into())
            }
        };
        let reset = status
            .duration_until_reset
            .as_ref()
            .map_or("-".to_owned(), |d| format!("{}s", d.seconds));
        rows.push([
            entries,
            code_name(status.code).into(),
            limit,
            remaining,
            reset,
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!("overall: {}\n", code_name(response.overall_code)));
    for entries in unmatched {
        out.push_str(&format!(
            "note: {entries} matched no limit: domain '{}' is not configured or has no rule \
             for this descriptor, so nothing was counted\n",
            request.domain
        ));
    }
    if let Some(mode) = fallback(response) {
        out.push_str(&format!(
            "note: fallback answer (failure_mode: {mode}): the counter store could not \
             decide, so the domain's failure_mode answered and nothing was counted there\n"
        ));
    }
    out
}

/// The failure mode that answered, when tollgate marked the answer as a fallback.
pub fn fallback(response: &RateLimitResponse) -> Option<&str> {
    use prost_types::value::Kind;
    let marks = response
        .dynamic_metadata
        .as_ref()?
        .fields
        .get(METADATA_NAMESPACE)?;
    let Some(Kind::StructValue(marks)) = &marks.kind else {
        return None;
    };
    match &marks.fields.get(FALLBACK_FIELD)?.kind {
        Some(Kind::StringValue(mode)) => Some(mode),
        _ => None,
    }
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}
