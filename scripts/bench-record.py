#!/usr/bin/env python3
"""scripts/bench's arithmetic: one run's figures and checks, and the summary.

  bench-record.py OUTPUT STATUS key=value...   one run as a JSON line (stdout)
  bench-record.py --line < LINE                that line for a human (one line)
  bench-record.py --half RUNS SERVER LOAD      half the median req/s of its rounds
  bench-record.py --summary RUNS BUILT UNIFORM_KEYS ZIPF_KEYS CALLS DURATION MACHINE
                                               the tables (markdown); exit 1 when a
                                               run failed its checks

OUTPUT is what the load generator printed: `tollgate bench --json` (tool=bench) or
h2load's text (tool=h2load). The key=value pairs are scripts/bench's readings around
it: the server's CPU ticks, Redis' CPU, script and INCRBY/EXPIRE counts, tollgate's OK
count. A server's name is BASE[@BUILD][:ALGORITHM] (`standalone@new:gcra`).
"""

import json
import re
import statistics
import sys

LABEL = {
    "floor": "gRPC floor",
    "one-script": "one-script server",
    "one-script-each": "one-script server, a script per descriptor",
    "one-script-cluster": "one-script server + cluster",
    "pipeline": "pipeline server",
    "pipeline-cluster": "pipeline server + cluster",
    "memory": "tollgate, memory store",
    "standalone": "tollgate + Redis",
    "twin": "tollgate + Redis, its identical twin",
    "cluster": "tollgate + cluster",
}
# Column order of the headline table (variants after their base).
ORDER = ["standalone", "twin", "pipeline", "one-script", "one-script-each", "cluster",
         "pipeline-cluster", "one-script-cluster", "floor", "memory"]
# The servers whose rules can change algorithm; the baselines count fixed windows.
TOLLGATE = ("standalone", "twin", "cluster", "memory")


def describe(load, uniform_keys, zipf_keys):
    kind, d = load[0], int(load[1:])
    what = f"{d} descriptor{'s' if d > 1 else ''}"
    if kind == "u":
        return f"{what}, {short(uniform_keys)} keys uniform"
    if kind == "z":
        return f"{what}, zipf over {short(zipf_keys)} keys"
    return f"{what}, one hot key (h2load)"


def short(n):
    n = int(n)
    for unit, size in (("M", 10**6), ("k", 10**3)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def parts(server):
    """(base, build, algorithm) of BASE[@BUILD][:ALGORITHM]; build and algorithm "" when
    absent (no algorithm: the config as it is, fixed windows)."""
    rest, _, algorithm = server.partition(":")
    base, _, build = rest.partition("@")
    return base, build, algorithm


def name(server):
    base, build, algorithm = parts(server)
    return (LABEL.get(base, base) + (f", {algorithm}" if algorithm else "")
            + (f" [{build}]" if build else ""))


# ---- one run ----------------------------------------------------------------------


def parse_h2load(text, calls):
    """(req/s, calls done, problems) from h2load's summary."""
    rps = re.search(r"^finished in [\d.]+\w*, ([\d.]+) req/s", text, re.M)
    req = re.search(r"^requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", text, re.M)
    if not (rps and req):
        return 0.0, 0, ["h2load printed no summary"]
    succeeded = int(req.group(3))
    problems = [] if succeeded == calls else [f"h2load: {succeeded} of {calls} succeeded"]
    return float(rps.group(1)), succeeded, problems


def record(output, status, fields):
    f = dict(kv.split("=", 1) for kv in fields)
    load = f["load"]
    d = int(load[1:])
    run = {"server": f["server"], "load": load, "descriptors": d, "round": int(f["round"]),
           "kind": f["kind"], "tool": f["tool"]}
    problems = [] if status == "0" else [f"the load generator exited {status}"]
    try:
        text = open(output).read()
    except OSError as e:
        text, problems = "", problems + [str(e)]
    if f["tool"] == "h2load":
        calls = int(f["calls"])
        rps, answered, more = parse_h2load(text, calls)
        problems += more
        run.update(rps=rps, calls=calls)
    else:
        try:
            report = json.loads(text)
        except ValueError:
            report = None
        if report is None:
            problems.append("tollgate bench printed no report")
            run.update(rps=0.0, calls=0)
            answered = 0
        else:
            answered, more = check_report(report, f)
            problems += more
            lat = report["latency_ms"]
            run.update(rps=report["ok_rps"], calls=report["totals"]["sent"],
                       p50_ms=lat["p50"], p99_ms=lat["p99"], p999_ms=lat["p999"],
                       max_ms=lat["max"], rate=report["rate"], unsent=report["unsent"])
    problems += check_server(f, answered, d)
    calls = max(run["calls"], 1)
    script_calls = int(f["script_calls"])
    commands = int(f["incrby_calls"]) + int(f["expire_calls"])
    run.update(
        cpu_us=int(f["ticks"]) / float(f["tick"]) / calls * 1e6,
        redis_cpu_us=(float(f["rcpu1"]) - float(f["rcpu0"])) / calls * 1e6,
        script_calls_per_request=script_calls / calls,
        script_us_per_call=int(f["script_usec"]) / script_calls if script_calls else 0.0,
        incrby_per_request=int(f["incrby_calls"]) / calls,
        expire_per_request=int(f["expire_calls"]) / calls,
        command_us_per_call=(int(f["incrby_usec"]) + int(f["expire_usec"])) / commands
        if commands else 0.0,
        check="ok" if not problems else "; ".join(problems),
    )
    print(json.dumps(run))


def check_report(report, f):
    """Answered calls, and what is wrong with a tollgate bench report."""
    totals = report["totals"]
    problems = []
    if totals["errors"] or totals["in_flight"]:
        problems.append(f"{totals['errors']} failed, {totals['in_flight']} unanswered "
                        f"(in the measured window: {report['errors']})")
    if totals["answered"] == 0:
        problems.append("nothing answered")
    # tollgate and the pipeline server answer with the limit they counted against.
    if f["tollgate"] or f["commands_per"]:
        if report["answers_without_limit"]:
            problems.append(f"{report['answers_without_limit']} answers carried no limit")
        if totals["over_limit"]:
            problems.append(f"{totals['over_limit']} answered OVER_LIMIT")
    return totals["answered"], problems


def check_server(f, answered, d):
    """What the server's own counts say against the calls the load generator saw."""
    problems = []
    if f["tollgate"]:
        counted = int(float(f["ok1"])) - int(float(f["ok0"]))
        if counted != answered:
            problems.append(f"tollgate counted {counted} OK, the load generator {answered}")
    if f["scripts_per"]:
        per = 1 if f["scripts_per"] == "request" else d
        if int(f["script_calls"]) != answered * per:
            problems.append(f"Redis ran {f['script_calls']} scripts for {answered} calls "
                            f"(one per {f['scripts_per']})")
    if f["commands_per"]:
        per = 1 if f["commands_per"] == "request" else d
        for command in ("incrby", "expire"):
            if int(f[f"{command}_calls"]) != answered * per:
                problems.append(f"Redis ran {f[command + '_calls']} {command.upper()} for "
                                f"{answered} calls (one per {f['commands_per']})")
        if int(f["script_calls"]):
            problems.append(f"Redis ran {f['script_calls']} scripts for a server that sends none")
    return problems


def redis_calls(r):
    """What Redis ran per request: scripts, or (none) INCRBY and EXPIRE."""
    if r["script_calls_per_request"] or not r.get("incrby_per_request"):
        return f"scripts {r['script_calls_per_request']:.3f}"
    return f"INCRBY {r['incrby_per_request']:.3f} + EXPIRE {r['expire_per_request']:.3f}"


def line():
    r = json.loads(sys.stdin.read())
    latency = f"  p99 {r['p99_ms']:.2f} ms" if "p99_ms" in r else ""
    print(f"  {r['load']:<3} {r['kind']:<5} {r['server']:<24} {r['rps']:>8.0f} req/s  "
          f"server {r['cpu_us']:5.1f}  Redis {r['redis_cpu_us']:5.1f} us/req  "
          f"{redis_calls(r)}/req{latency}  check: {r['check']}")


def half(path, server, load):
    rounds = [r["rps"] for r in read(path)
              if r["server"] == server and r["load"] == load and r["kind"] == "max"]
    print(max(1, round(statistics.median(rounds) / 2)) if rounds else 1)


def read(path):
    return [json.loads(x) for x in open(path) if x.strip()]


# ---- the summary ------------------------------------------------------------------


def base_of(server, base):
    """The server `server` is compared with, of its own build and algorithm
    (`cluster@new:gcra` -> `standalone@new:gcra`); a baseline has neither."""
    _, build, algorithm = parts(server)
    if base not in TOLLGATE:
        return base
    return base + (f"@{build}" if build else "") + (f":{algorithm}" if algorithm else "")


def ratio(by_round, server, base):
    """Median over the rounds of server's req/s / base's in the same round."""
    mine, theirs = by_round.get(server, {}), by_round.get(base, {})
    ratios = [mine[r] / theirs[r] for r in mine if theirs.get(r)]
    return statistics.median(ratios) if ratios else None


def twin(by_round):
    """The twin of this load's runs (it runs one algorithm), or None."""
    return next((s for s in by_round if parts(s)[0] == "twin"), None)


def noise(by_round):
    """The identical pair's ratio (twin / standalone: same binary, same Redis, same
    algorithm): its median and the lowest and highest of its rounds, or None without a
    twin."""
    t = twin(by_round)
    if t is None:
        return None
    mine, theirs = by_round.get(t, {}), by_round.get(base_of(t, "standalone"), {})
    pair = [mine[r] / theirs[r] for r in mine if theirs.get(r)]
    return (statistics.median(pair), min(pair), max(pair)) if pair else None


def noise_text(by_round):
    n = noise(by_round)
    return f"{n[0]:.2f}x ({n[1]:.2f}-{n[2]:.2f})" if n else "not run"


def ratios(by_round, server):
    """The ratios a server's row shows, as text."""
    base, build, algorithm = parts(server)
    out = []

    def against(other, label):
        x = ratio(by_round, server, other)
        out.append(f"{x:.2f}x {label}" if x else None)

    if base == "twin":
        n = noise(by_round)
        return f"{n[0]:.2f}x its identical server (rounds {n[1]:.2f}-{n[2]:.2f})" if n else "-"
    for baseline in ("pipeline", "one-script"):
        if base != baseline:
            against(baseline, baseline)
    if base in ("standalone", "memory") and "one-script-each" in by_round:
        against("one-script-each", "one-script-each")
    if base == "cluster":
        against(base_of(server, "standalone"), "standalone")
    if base in ("cluster", "one-script-cluster"):
        against("pipeline-cluster", "pipeline cluster")
    if base == "cluster":
        against("one-script-cluster", "one-script cluster")
    if algorithm:
        against(server.partition(":")[0], "fixed window")
    if build:
        against(base + (f":{algorithm}" if algorithm else ""), base)
    return ", ".join(x for x in out if x) or "1.00x"


def figures(runs, load):
    """server -> medians of its rounds (and its half-rate and burst runs)."""
    out = {}
    for r in runs:
        if r["load"] != load:
            continue
        s = out.setdefault(r["server"], {"max": [], "half": None, "burst": None, "failed": []})
        if r["kind"] == "max":
            s["max"].append(r)
        else:
            s[r["kind"]] = r
        if r["check"] != "ok":
            s["failed"].append(f"{r['server']} {r['load']} {r['kind']} round {r['round']}: {r['check']}")
    for s in out.values():
        med = {k: statistics.median(r[k] for r in s["max"]) for k in
               ("rps", "cpu_us", "redis_cpu_us", "script_calls_per_request", "script_us_per_call")} \
            if s["max"] else {}
        if s["max"]:
            med.update({k: statistics.median(r.get(k, 0.0) for r in s["max"]) for k in
                        ("incrby_per_request", "expire_per_request", "command_us_per_call")})
        s["med"] = med
        s["rounds"] = {r["round"]: r["rps"] for r in s["max"]}
    return out


def redis_side(server):
    return parts(server)[0] not in ("floor", "memory")


def columns(servers):
    """Servers in ORDER, each build's beside the others of its kind."""
    def key(server):
        base, build, algorithm = parts(server)
        return (ORDER.index(base) if base in ORDER else len(ORDER), algorithm, build)
    return sorted(servers, key=key)


def headline(loads, per_load, servers, args):
    cols = [s for s in columns(servers) if parts(s)[0] != "twin"]
    print("| load | identical pair (the noise) | " + " | ".join(name(s) for s in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for load in loads:
        f = per_load[load]
        by_round = {s: f[s]["rounds"] for s in f}
        cells = []
        for s in cols:
            v = f.get(s)
            if not v or not v["med"]:
                cells.append("-")
                continue
            m = v["med"]
            cell = f"{m['rps'] / 1000:.1f}k ({ratios(by_round, s)})"
            if redis_side(s):
                cell += f", Redis {m['redis_cpu_us']:.1f}"
            cell += f", server {m['cpu_us']:.1f} us/req"
            if v["half"]:
                cell += f", p99 {v['half']['p99_ms']:.1f} ms"
            cells.append(cell)
        print(f"| {describe(load, *args)} | {noise_text(by_round)} | " + " | ".join(cells) + " |")


def detail(load, f, args):
    print(f"\n### {describe(load, *args)}\n")
    print("| server | req/s (rounds) | ratios | server CPU us/req | Redis CPU us/req | "
          "Redis calls/req | us/call | p50 / p99 / p99.9 ms at half rate | checks |")
    print("|---|---|---|---|---|---|---|---|---|")
    by_round = {s: f[s]["rounds"] for s in f}
    for s in columns(f):
        v = f[s]
        m = v["med"]
        if not m:
            continue
        each = ", ".join("%.0f" % v["rounds"][r] for r in sorted(v["rounds"]))
        redis = "-" if not redis_side(s) else "%.1f" % m["redis_cpu_us"]
        calls = "-" if not redis_side(s) else redis_calls(m)
        usec = "-" if not redis_side(s) else "%.2f" % (
            m["script_us_per_call"] if m["script_calls_per_request"] else m["command_us_per_call"])
        h = v["half"]
        lat = "-"
        if h:
            lat = f"{h['p50_ms']:.2f} / {h['p99_ms']:.2f} / {h['p999_ms']:.2f} ({h['rate'] or 0:.0f} req/s)"
        checks = "ok" if not v["failed"] else f"{len(v['failed'])} FAILED"
        print(f"| {name(s)} | {m['rps']:.0f} ({each}) | {ratios(by_round, s)} | {m['cpu_us']:.1f} | "
              f"{redis} | {calls} | {usec} | {lat} | {checks} |")
    bursts = [(s, v["burst"]) for s, v in f.items() if v["burst"]]
    if bursts:
        print("\nBurst of 300 calls at once on the hot key (300 in flight, no warm-up): "
              + "; ".join(f"{name(s)} p50 {b['p50_ms']:.1f}, p99 {b['p99_ms']:.1f}, "
                          f"max {b['max_ms']:.1f} ms" for s, b in bursts))


def summary(path, built, uniform_keys, zipf_keys, calls, duration, machine):
    runs = read(path)
    loads = list(dict.fromkeys(r["load"] for r in runs))
    servers = list(dict.fromkeys(r["server"] for r in runs))
    per_load = {load: figures(runs, load) for load in loads}
    args = (uniform_keys, zipf_keys)
    print(open(machine).read().strip() + "\n")
    print(f"Medians of alternating rounds (every server in turn each round); ratios are "
          f"medians of the rounds' ratios. The identical pair is two tollgate servers of "
          f"the same binary on the same Redis, loaded as far apart in each round as the "
          f"servers allow: its ratio (median, and its rounds' lowest-highest) is this run's "
          f"noise, and a ratio inside that range is no difference. Distinct keys: `tollgate bench -k 4 -c 64 "
          f"--entry-keys 'key{{d}}'`, {duration} s after 1 s of warm-up, a fresh draw each run; "
          f"hot key: `h2load -n {calls} -c 4 -m 16 -t 1`, one fixed body. p99 at half the "
          f"maximum rate: open loop (`tollgate bench --rate`). tollgate and the baselines: "
          f"{built}. Redis calls per request: script calls (EVAL, EVALSHA, FCALL), or for "
          f"a server that sends none the masters' INCRBY and EXPIRE; us per call is "
          f"Redis's own time per such call. The baselines count fixed windows; a tollgate "
          f"server named with an algorithm (`tollgate + Redis, gcra`) serves "
          f"benches/config/ with every rule switched to it.\n")
    headline(loads, per_load, servers, args)
    for load in loads:
        detail(load, per_load[load], args)
    failed = [x for f in per_load.values() for v in f.values() for x in v["failed"]]
    if failed:
        print("\nCHECKS FAILED:\n" + "\n".join(f"- {x}" for x in failed))
        sys.exit(1)


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--line"]:
        line()
    elif argv[:1] == ["--half"]:
        half(*argv[1:4])
    elif argv[:1] == ["--summary"]:
        summary(*argv[1:8])
    else:
        record(argv[0], argv[1], argv[2:])


if __name__ == "__main__":
    main()
