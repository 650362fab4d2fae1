//! `tollgate inspect`: the counters one request would touch, read from Redis without
//! consuming anything (the non-consuming check upstream users ask for, and what
//! limitador's `/counters` shows). The request is planned exactly as the limiter plans
//! it (`limiter::plan`), so the keys are the ones `serve` writes; the store side is
//! `store::redis::inspect`. Redis and the config are found as `serve` finds them:
//! flags, then envoyproxy/ratelimit's variables. A global rule's counter also shows
//! its division between regions, read from the ledger (`--global-ledger`). Exit 0
//! after printing, 2 on errors.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::check::parse_descriptor;
use super::console;
use crate::config::{self, Limit};
use crate::global::ledger::Ledger;
use crate::global::ledger::redis::RedisLedger;
use crate::global::record::Record;
use crate::global::{self};
use crate::limiter::{bounds, plan};
use crate::proto::{RateLimitDescriptor, RateLimitRequest};
use crate::settings::global::GlobalFlags;
use crate::settings::{self, RedisFlags, ServeFlags, ServeSettings};
use crate::store::Backend;
use crate::store::redis::connect::RedisOptions;
use crate::store::redis::inspect::{self, CounterState};

#[derive(Debug, Args)]
// RedisFlags' help for the budget is serve's (a default of 250 and failure_mode):
// here the default is --timeout-ms and nothing answers in Redis' place.
#[command(mut_arg("redis_timeout_ms", |arg| arg.help(
    "Budget in milliseconds for each Redis call [default: --timeout-ms]"
)))]
pub struct InspectArgs {
    #[arg(long)]
    pub domain: String,
    /// One descriptor as k=v[,k=v...]; repeat for several descriptors
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Config file or directory the server runs [default: as serve's files: $RUNTIME_ROOT/..., else config/, whatever $CONFIG_TYPE says]
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where Redis is, as `serve` takes it.
    #[command(flatten)]
    pub redis: RedisFlags,
    /// The global ledger, as `serve` takes it: a global rule's counter shows every region's share
    #[arg(long, value_name = "URL")]
    pub global_ledger: Option<String>,
    /// The global ledger on a Redis Cluster, as `serve` takes it
    #[arg(long, value_name = "NODES")]
    pub global_ledger_cluster: Option<String>,
    /// Prefix of the ledger's keys, as `serve` takes it
    #[arg(long, value_name = "PREFIX")]
    pub global_ledger_prefix: Option<String>,
    /// Give up after this many milliseconds (also each Redis call's budget, unless --redis-timeout-ms)
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

pub async fn run(args: InspectArgs) -> ExitCode {
    match inspect(&args).await {
        Ok(text) if console::print_or_report("inspect", &text) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(2),
        Err(e) => {
            console::eprintln(&format!("tollgate inspect: {e}"));
            ExitCode::from(2)
        }
    }
}

async fn inspect(args: &InspectArgs) -> Result<String, String> {
    let (config_path, redis) = settings(args)?;
    let config = config::load_path(&config_path).map_err(|errors| {
        let all: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        format!(
            "{}: config errors:\n{}",
            config_path.display(),
            all.join("\n")
        )
    })?;
    let descriptors = args
        .descriptors
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<Result<Vec<RateLimitDescriptor>, _>>()?;
    let request = RateLimitRequest {
        domain: args.domain.clone(),
        descriptors,
        hits_addend: 0,
    };
    bounds::validate(&request).map_err(|e| e.to_string())?;
    let Some(domain) = config.domain(&request.domain) else {
        return Ok(format!(
            "domain '{}' is not in {}: no counter (the server answers OK without a limit)\n",
            request.domain,
            config_path.display()
        ));
    };
    let planned = plan::resolve_all(Some(domain), &request).map_err(|e| e.to_string())?;
    let plan = plan::build(Some(domain), &request, planned, (false, false, false), None);
    let states = if plan.ops.is_empty() {
        Vec::new()
    } else {
        let read = inspect::read(&redis, &plan.ops);
        tokio::time::timeout(Duration::from_millis(args.timeout_ms), read)
            .await
            .map_err(|_| format!("Redis did not answer within {} ms", args.timeout_ms))?
            .map_err(|e| e.to_string())?
    };
    let mut text = render(&request, &plan, &states);
    global_lines(args, &plan, &mut text).await?;
    Ok(text)
}

/// Each global counter's division, from the ledger: every region's share of the
/// windows it holds, and their demand. Without a ledger named, says where to look.
async fn global_lines(
    args: &InspectArgs,
    plan: &plan::RequestPlan<'_>,
    text: &mut String,
) -> Result<(), String> {
    let global: Vec<&crate::store::CounterOp> = plan
        .descriptors
        .iter()
        .filter_map(|p| match p {
            plan::Plan::Limited {
                rule: Some(rule),
                ops,
                ..
            } if rule.global => Some(&plan.ops[ops.clone()]),
            _ => None,
        })
        .flatten()
        .collect();
    if global.is_empty() {
        return Ok(());
    }
    let flags = GlobalFlags {
        global_ledger: args.global_ledger.clone(),
        global_ledger_cluster: args.global_ledger_cluster.clone(),
        global_ledger_prefix: args.global_ledger_prefix.clone(),
        ..GlobalFlags::default()
    };
    let env = |name: &str| std::env::var(name).ok();
    let Some((options, prefix)) =
        settings::global::ledger(&flags, &env).map_err(|e| e.to_string())?
    else {
        let _ = writeln!(
            text,
            "global counters: each region decides against its share of the limit; give \
             --global-ledger to see the shares"
        );
        return Ok(());
    };
    let ledger = RedisLedger::new(options, Duration::from_millis(args.timeout_ms.max(1)))?;
    let keys: Vec<String> = global
        .iter()
        .map(|op| RedisLedger::key(&prefix, &global::id::of(&op.key)))
        .collect();
    let records = ledger.read(&keys).await.map_err(|e| e.to_string())?;
    let now = crate::clock::Clock::now_millis(&crate::clock::SystemClock);
    for ((op, key), record) in global.iter().zip(&keys).zip(records) {
        let _ = writeln!(text, "global    {}", global::id::of(&op.key));
        let _ = writeln!(text, "  ledger key {key}");
        match record.as_deref().map(Record::decode) {
            None => {
                let _ = writeln!(text, "    no record (no region has reported it lately)");
            }
            Some(Err(e)) => {
                let _ = writeln!(text, "    {e}");
            }
            Some(Ok(record)) => {
                let stale = u64::try_from(crate::global::DEFAULT_REPORT_PERIOD.as_millis())
                    .unwrap_or(2000)
                    * 3;
                text.push_str(&global::view::describe(&record, now, stale));
            }
        }
    }
    Ok(())
}

/// Where the config and Redis are, resolved by `serve`'s own rules and flags.
fn settings(args: &InspectArgs) -> Result<(PathBuf, RedisOptions), String> {
    let flags = ServeFlags {
        config: args.config.clone(),
        redis: args.redis.clone(),
        ..ServeFlags::default()
    };
    // inspect reads config files whatever source the server takes its limits from
    // (it cannot ask a control plane): CONFIG_TYPE is left out, so the files are
    // found as they always were, --config, then RUNTIME_ROOT, then config/.
    let env = |name: &str| match name {
        "CONFIG_TYPE" => None,
        _ => std::env::var(name).ok(),
    };
    let settings = ServeSettings::resolve(&flags, &env).map_err(|e| e.to_string())?;
    let Some(files) = settings.source.files() else {
        return Err("limits do not come from files: give the config the server \
                    serves with --config"
            .into());
    };
    let config = files.path.clone();
    let mut redis = match settings.backend {
        Backend::Redis { options, .. } => *options,
        Backend::Memory { .. } => {
            return Err(
                "counters live in Redis: give --redis-url, --redis-cluster or \
                        --redis-sentinel (or REDIS_URL); a server on the memory store keeps \
                        them inside its own process"
                    .into(),
            );
        }
    };
    if args.redis.redis_timeout_ms.is_none() {
        // A one-off read, not a request on the hot path: the whole budget is the user's.
        redis.timeout = Duration::from_millis(args.timeout_ms.max(1));
    }
    Ok((config, redis))
}

/// One block per counter, under its descriptor.
fn render(
    request: &RateLimitRequest,
    plan: &plan::RequestPlan<'_>,
    states: &[CounterState],
) -> String {
    let mut text = String::new();
    for (descriptor, planned) in request.descriptors.iter().zip(&plan.descriptors) {
        let entries: Vec<String> = descriptor
            .entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        let _ = writeln!(text, "descriptor {}", entries.join(","));
        let (limits, rule, range) = match planned {
            plan::Plan::NoLimit => {
                let _ = writeln!(
                    text,
                    "  no limit: no rule of domain '{}' matches (nothing is counted)",
                    request.domain
                );
                continue;
            }
            plan::Plan::Unlimited => {
                let _ = writeln!(text, "  unlimited (nothing is counted)");
                continue;
            }
            plan::Plan::Limited {
                limits, rule, ops, ..
            } => (limits.as_slice(), *rule, ops.clone()),
        };
        for (limit, state) in limits.iter().zip(&states[range]) {
            counter_lines(&mut text, plan::rule_name(rule), limit, state);
        }
    }
    text
}

fn counter_lines(text: &mut String, rule: &str, limit: &Limit, state: &CounterState) {
    let ms = |d: Duration| match d.subsec_millis() {
        0 => format!("{}s", d.as_secs()),
        _ => format!("{:.3}s", d.as_secs_f64()),
    };
    let _ = writeln!(text, "  counter   {}", state.key);
    let _ = writeln!(text, "    rule      {rule}");
    let _ = writeln!(text, "    algorithm {}", limit.algorithm.name());
    let _ = writeln!(text, "    limit     {limit}");
    let _ = writeln!(
        text,
        "    state     {}",
        state
            .stored
            .as_deref()
            .unwrap_or("no key (never counted, or expired)")
    );
    let _ = writeln!(text, "    remaining {}", state.now.remaining);
    // What a request is told (a fixed window counts whole seconds, as upstream does),
    // beside the key's exact time to live: the two may differ by under a second.
    let _ = writeln!(
        text,
        "    reset     {} (as an answer reports it)",
        ms(state.now.reset_after)
    );
    let _ = writeln!(
        text,
        "    ttl       {}",
        state.ttl_ms.map_or("- (no key)".to_owned(), |t| {
            format!("{} (the key's, in Redis)", ms(Duration::from_millis(t)))
        })
    );
}
