#!/usr/bin/env python3
"""The rules docs/architecture.md states about src/, checked on the code itself.

Each rule reads the source as text (comments and `#[cfg(test)]` modules left out), so
it is a tripwire, not a compiler: it looks for the shapes the rule forbids.

- layers: a module's `crate::` imports reach only its own top-level module or the
  lines below it in architecture.md's "Layers" drawing (and never its own line's
  neighbours: a line's modules do not import each other);
- length: no file under src/ passes MAX_LINES lines;
- lua: no file under lua/ passes LUA_FILE_LINES lines, and no Lua function (from its
  `function` to its `end`) LUA_FUNCTION_LINES;
- parent: no module imports (`use super::...`) an item its parent declares without
  any `pub`: what a parent shares with its children it says so, or keeps in a child
  module of its own;
- writers: no print!/println!/eprint!/eprintln!/dbg! (they panic on a closed pipe),
  and stdout and stderr are written only by the files WRITERS names;
- status: a gRPC status is made only where an error type is mapped to one (STATUS);
- algorithm: code outside src/algorithm/ names no algorithm but the default
  (`Algorithm::FixedWindow`), so behaviour that differs per algorithm is a method of
  `Model` (and the compiler asks every model for it).

What breaks a rule today, and is known, is listed under EXCEPTIONS with why; an
entry that no longer breaks its rule fails the check too, so the list only shrinks.

    scripts/architecture_rules.py      (scripts/check-doc-paths runs it as well)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
MAX_LINES = 400
LUA = os.path.join(ROOT, "lua")
LUA_FILE_LINES = 300
LUA_FUNCTION_LINES = 80

# The files that may write to stdout or stderr themselves, and why.
WRITERS = {
    "src/cli/console.rs": "the commands' output and messages",
    "src/telemetry/nonblocking.rs": "log lines, from the writer thread's queue",
    "src/bench/mod.rs": "`tollgate bench`'s progress line (below cli/, it cannot use console.rs)",
}
# Where an error type becomes a tonic::Status.
STATUS = {"src/error.rs", "src/rlqs/error.rs"}

# (rule, file, what): known breaks, each to be fixed by the work that owns the file.
EXCEPTIONS = {
    ("parent", "src/server/reload/files.rs", "LOAD_ATTEMPTS"): "a constant of reload/mod.rs",
    ("parent", "src/config/compile/rate_limits.rs", "Compiler"): "compile/mod.rs's compiler",
    ("parent", "src/rlqs/service.rs", "Registration"): "a type of rlqs/mod.rs",
    ("parent", "src/store/redis/batcher/recover.rs", "Health"): "batcher/mod.rs's health flag",
    ("algorithm", "src/rlqs/bucket.rs", "TokenBucket"): "RLQS burst: to be a Model method",
    ("algorithm", "src/rlqs/bucket.rs", "Gcra"): "RLQS burst: to be a Model method",
}


def sources():
    for folder, _, files in os.walk(SRC):
        for name in sorted(files):
            if name.endswith(".rs"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), open(path, encoding="utf-8").read()


def is_test_file(rel):
    name = os.path.basename(rel)
    return name == "tests.rs" or name.endswith("_tests.rs")


def blank(text):
    """`text` with comments removed and string and char literals emptied, read the way
    the lexer reads them (a `//` inside a string is not a comment)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:]):
            out.append("' '")
            i += len(re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def code(text):
    """`text` without comments, string and char contents, and `#[cfg(test)]` modules."""
    text = blank(text)
    out, i = [], 0
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*(\{|;)", text[i:])
        if not m:
            out.append(text[i:])
            break
        start = i + m.start()
        out.append(text[i:start])
        j = i + m.end()
        if m.group(1) == "{":
            depth = 1
            while depth and j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
        i = j
    return "".join(out)


def module_of(rel):
    """The top-level module of a file under src/ (`store` for src/store/redis/mod.rs)."""
    parts = rel.split("/")[1:]
    return parts[0][:-3] if len(parts) == 1 else parts[0]


def layers():
    """Top-level module -> its line in architecture.md's drawing (0 is the top)."""
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    block = text.split("Each line imports only from the lines below it:", 1)[1]
    block = block.split("```", 2)[1]
    out = {}
    for number, line in enumerate(block.strip().splitlines()):
        for name in line.split():
            out[name.rstrip("/").removesuffix(".rs")] = number
    return out


def check_layers(files):
    line = layers()
    found = []
    for rel, text in files:
        if is_test_file(rel):
            continue
        mine = module_of(rel)
        if mine in ("lib", "main") and mine not in line:
            continue
        for name in sorted(set(re.findall(r"\bcrate::([a-z_]+)", code(text)))):
            if name == mine or name not in line or mine not in line:
                continue
            if line[name] <= line[mine]:
                found.append(("layers", rel, name))
    return found


def check_length(files):
    return [("length", rel, "") for rel, text in files if text.count("\n") > MAX_LINES]


def lua_words(src):
    """(word, line) for each name or keyword of Lua source, comments and strings left
    out (long brackets included)."""
    i, line, n = 0, 1, len(src)
    while i < n:
        c = src[i]
        long = re.match(r"(?:--)?\[(=*)\[", src[i:i + 40])
        if c == "\n":
            line += 1
            i += 1
        elif long:
            j = src.find("]" + long.group(1) + "]", i)
            j = n if j < 0 else j + len(long.group(1)) + 2
            line += src[i:j].count("\n")
            i = j
        elif src.startswith("--", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            i = j + 1
        else:
            m = re.match(r"[A-Za-z_]\w*", src[i:])
            if m:
                yield m.group(0), line
                i += len(m.group(0))
            else:
                i += 1


def lua_functions(src):
    """(first line, lines) of every function of Lua source, by matching its blocks:
    `function`, `if`, `for`/`while` (whose `do` opens no block of its own) and a bare
    `do` close with `end`, `repeat` with `until`."""
    stack, out, loops = [], [], 0
    for word, line in lua_words(src):
        if word in ("function", "if", "repeat"):
            stack.append((word, line))
        elif word in ("for", "while"):
            stack.append((word, line))
            loops += 1
        elif word == "do":
            if loops:
                loops -= 1
            else:
                stack.append((word, line))
        elif word in ("end", "until") and stack:
            kind, start = stack.pop()
            if kind == "function":
                out.append((start, line - start + 1))
    return out


def check_lua(_files):
    found = []
    for name in sorted(os.listdir(LUA)):
        if not name.endswith(".lua"):
            continue
        rel = "lua/" + name
        src = open(os.path.join(LUA, name), encoding="utf-8").read()
        if src.count("\n") > LUA_FILE_LINES:
            found.append(("lua", rel, f"{src.count(chr(10))} lines"))
        for start, lines in lua_functions(src):
            if lines > LUA_FUNCTION_LINES:
                found.append(("lua", rel, f"a function of {lines} lines at line {start}"))
    return found


ITEM = re.compile(
    r"^(pub(?:\([^)]*\))?\s+)?(?:(?:async|const|unsafe)\s+)*"
    r"(fn|struct|enum|const|static|type|trait|union)\s+([A-Za-z_]\w*)", re.M)


def private_items(text):
    """Names the file declares at its top level without any `pub`."""
    return {m.group(3) for m in ITEM.finditer(code(text)) if not m.group(1)}


def parent_of(rel):
    folder, name = os.path.split(rel)
    if name == "mod.rs":
        folder = os.path.dirname(folder)
    if folder == "src":
        return "src/lib.rs"
    for candidate in (os.path.join(folder, "mod.rs"), folder + ".rs"):
        if os.path.exists(os.path.join(ROOT, candidate)):
            return candidate
    return None


def super_names(body):
    """The first names after `super::` in a use statement's body."""
    body = " ".join(body.split())
    if body.startswith("{"):
        body = body[1:body.rindex("}")]
        parts = re.split(r",(?![^{]*\})", body)
    else:
        parts = [body]
    return {re.split(r"::|\s", p.strip())[0] for p in parts if p.strip()}


def check_parent(files):
    texts = dict(files)
    found = []
    for rel, text in files:
        if is_test_file(rel):
            continue
        parent = parent_of(rel)
        if parent not in texts:
            continue
        private = private_items(texts[parent])
        for body in re.findall(r"\buse\s+super::([^;]+);", code(text)):
            for name in sorted(super_names(body) & private):
                found.append(("parent", rel, name))
    return found


def check_writers(files):
    found = []
    for rel, text in files:
        if is_test_file(rel):
            continue
        body = code(text)
        for macro in sorted(set(re.findall(r"\b(e?println|e?print|dbg)!", body))):
            found.append(("writers", rel, macro + "!"))
        if rel not in WRITERS:
            for stream in sorted(set(re.findall(r"\bio::(stdout|stderr)\(\)(?!\.is_terminal)", body))):
                found.append(("writers", rel, stream))
    return found


def check_status(files):
    found = []
    for rel, text in files:
        if rel in STATUS or is_test_file(rel):
            continue
        if re.search(r"\bStatus::(?!from\b|from_)[a-z_]+\(", code(text)):
            found.append(("status", rel, "tonic::Status"))
    return found


def check_algorithm(files):
    found = []
    for rel, text in files:
        if rel.startswith("src/algorithm/") or is_test_file(rel):
            continue
        for variant in sorted(set(re.findall(r"\bAlgorithm::([A-Z][a-z]\w*)", code(text)))):
            if variant != "FixedWindow":
                found.append(("algorithm", rel, variant))
    return found


def problems():
    files = list(sources())
    found = set()
    for rule in (check_layers, check_length, check_parent, check_writers, check_status,
                 check_algorithm, check_lua):
        found.update(rule(files))
    out = []
    for rule, rel, what in sorted(found - set(EXCEPTIONS)):
        out.append(f"{rel}: breaks the {rule} rule" + (f" ({what})" if what else ""))
    for rule, rel, what in sorted(set(EXCEPTIONS) - found):
        out.append(f"{rel}: listed as breaking the {rule} rule ({what or 'length'}), but no "
                   f"longer does: remove it from EXCEPTIONS in scripts/architecture_rules.py")
    return out


def main():
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(f"architecture_rules: {len(found)} problem(s); docs/architecture.md says why "
              "each rule holds", file=sys.stderr)
        return 1
    print(f"architecture_rules: src/ keeps the rules of docs/architecture.md "
          f"({len(EXCEPTIONS)} known exceptions listed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
