//! `tollgate check`: one ShouldRateLimit call to any RateLimitService server, printed
//! as a table. Exit 0 when the server answered (whatever the decision), 1 otherwise.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::Unit;
use crate::proto::rate_limit_descriptor::Entry;
use crate::proto::rate_limit_response::Code;
use crate::proto::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};

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

pub async fn run(args: CheckArgs) -> ExitCode {
    let descriptors = match args
        .descriptors
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("tollgate check: {e}");
            return ExitCode::from(2);
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
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    };
    match tokio::time::timeout(Duration::from_millis(args.timeout_ms), call).await {
        Ok(Ok(response)) => {
            print!("{}", render(&request, &response));
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("tollgate check: {addr}: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!(
                "tollgate check: {addr}: no answer within {} ms",
                args.timeout_ms
            );
            ExitCode::FAILURE
        }
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

/// The decision as an aligned text table, one row per descriptor.
pub fn render(request: &RateLimitRequest, response: &RateLimitResponse) -> String {
    let mut rows = vec![[
        "DESCRIPTOR".to_owned(),
        "CODE".into(),
        "LIMIT".into(),
        "REMAINING".into(),
        "RESET".into(),
    ]];
    for (descriptor, status) in request.descriptors.iter().zip(&response.statuses) {
        let entries: Vec<String> = descriptor
            .entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        let limit = status.current_limit.as_ref().map_or("-".to_owned(), |l| {
            let unit = Unit::from_proto(l.unit).map_or("?", Unit::name);
            let name = if l.name.is_empty() {
                String::new()
            } else {
                format!(" ({})", l.name)
            };
            format!("{}/{unit}{name}", l.requests_per_unit)
        });
        let reset = status
            .duration_until_reset
            .as_ref()
            .map_or("-".to_owned(), |d| format!("{}s", d.seconds));
        rows.push([
            entries.join(","),
            code_name(status.code).into(),
            limit,
            status.limit_remaining.to_string(),
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
    out
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}
