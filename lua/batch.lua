-- batch.lua: decide the counter operations of one or more requests ("segments") on
-- one hash slot (or one standalone server), atomically, each request all or nothing.
--
-- KEYS[i]   the counter of operation i, all segments' operations in order. On a
--           cluster, either every key shares one hash slot and the call routes by
--           KEYS[1], or (the any-slot variant, BATCH_ANY_SLOT in store/redis/scripts/) no key
--           is declared, the call goes to one master by address, and `batch` takes
--           KEYS from ARGV (ANY_SLOT): Redis then checks each key as it is touched,
--           and a key the node does not serve fails the call, which then gives back
--           what it took (see `done` below), so such a call leaves nothing.
-- ARGV[1]   "" to read the server's clock (TIME); a number of milliseconds only in
--           tests, which inject time (production never sends one).
-- ARGV[2]   the index: n bytes (n = #KEYS), byte i the place of operation i's text
--           among ARGV[4...] (1 to 255); or empty, and ARGV[3+i] is operation i's.
--           Why: a call's operations mostly repeat (same rule, same cost), and each
--           argument costs Redis a string object and this script a Lua string.
-- ARGV[3]   empty, or n bytes: byte i is how many requests operation i stands for (1
--           to 255), consecutive one-operation requests (not dry runs) with the same
--           operation on the same counter, as a hot counter's are. Each is still
--           decided and replied to on its own; a run only spares Redis a key and this
--           script the lookups per request.
-- ARGV[4..] the distinct operations, each 43 bytes, struct.pack('<BBddddBd', f, id,
--           limit, window ms, burst, max delay ms (-1 = none), vetoes (1/0), cost),
--           and for a rule with a time_zone 48 more: its periods (`calendar` in
--           common.lua): f is "+" (byte 43) for the first operation of a request (a
--           segment), "-" (45) for the first of a dry run (decide, write nothing: the
--           request is already denied elsewhere, only true statuses are wanted), "."
--           (46) for a further operation of the same request. The id is looked up with
--           `algorithm(id)`, not in this file: store/redis/scripts/ generates it from
--           the Rust list (src/algorithm/mod.rs) and puts it before this entry point.
-- Returns   one string: the reply's numbers as little-endian doubles (8 bytes each,
--           exact for integers below 2^53), per decision (each operation, each request
--           of a run) in order either 4 (the full form):
--             remaining if allowed else -1, reset ms,
--             if allowed the delay us (leaky bucket) else the retry ms (-1 = never),
--             refund token
--           (a denial always has 0 remaining and no delay, an admission no retry), or
--           1 (the repeat form): -3 - (remaining if allowed else -1), so at most -2,
--           when the last 3 values equal the previous operation's. Why: a hot counter's
--           operations differ only in what remains. Why one string: Redis turns a
--           table reply into RESP value by value, and tollgate's client parsed it value
--           by value again; together they cost more than the decisions (3 descriptors:
--           12 values per request). struct.pack writes them in one C call per chunk.
--
-- Why atomic: a script runs alone on its server, so no other client's operation can
-- land between the checks and the writes. The clock is read once, inside, so all
-- replicas of tollgate agree on windows. Within a segment every operation is decided
-- first (in order, each seeing the tentative state left by earlier ones on the same
-- key); only if no vetoing operation was denied does the segment commit: all or
-- nothing. Segments run one after the other and each sees what the previous ones
-- committed, so a call carrying S requests decides exactly as S calls in that order
-- would. tollgate puts concurrent requests into one call to share the per-call cost
-- of EVALSHA.
--
-- Why the shape: this runs once per decision under load, so its cost per operation is
-- the service's cost in Redis, and on distinct counters that is the cost of its
-- commands. Two paths:
--   increment first (a module's `take`, the fixed window's): a limit's hits are
--     added in Redis at once and taken back on a denial or a veto, one INCRBY per
--     decision on a counter of this window (a read first made it two);
--   the general path (every other algorithm, charges, releases, dry runs, runs of a
--     hot counter): a counter is read once per call and its final state written once,
--     at the end (every segment in between works on the state kept here).
-- A distinct operation is one argument, parsed once per call into the one table its
-- operations share (`ops`).

-- This file is one chunk with lua/batch_lean.lua (the lean path) and
-- lua/batch_call.lua, assembled after it in that order (store/redis/scripts/).
-- `batch(KEYS, ARGV)` at the end of batch_call.lua is the entry point. Everything
-- before it is made once per load of the code: per call for EVALSHA (the script ends
-- with `return batch(KEYS, ARGV)`), once for the function library
-- (scripts/library.rs), so the helpers and scratch tables here are not made again by
-- each call. The call's state lives in these upvalues, set by `batch` at its start;
-- nothing of one call is read by the next but the scratch, always written before it
-- is read.
local tonumber = tonumber
-- The call's keys, each operation's parsed spec in order (ops), the reply (out), the
-- clock, the parsed operations by their bytes (specs), the general path's per-counter
-- tables (state, stored, writer: made only when that path runs), an any-slot call's
-- log of what `take` kept (done), the operations' count and run lengths.
local call_keys, ops, out, now_ms, now_us, injected, specs, skewed
local state, stored, writer, done, count, runs
-- Scratch for ops: the distinct operations' specs in their order (listed), and each
-- operation's by the index (indexed). Only a call's first entries are its own.
local listed, indexed = {}, {}
-- Scratch for out: a call writes every place up to the last it packs, and a table
-- made anew for each call grew by doubling (a copy at each power of two).
local replies = {}

-- Parsed operations by their bytes: Lua interns strings, so a repeat is one lookup.
-- decide is the module's, kept here to save a lookup per operation. An operation is
-- 43 bytes (struct format OP, see WireOp in store/redis/scripts/): one C call reads every
-- number, where matching a text pattern made a string per field and converted each.
local OP, OP_LEN, PLUS, MINUS, DOT = '<BBddddBd', 43, 43, 45, 46
-- An operation of a time_zone rule has its periods' 48 bytes after its own. When
-- Redis's clock is in none of them, the call fails with CLOCK and that clock (ms).
local CAL_LEN, CLOCK = 48, 'tollgate: calendar clock '
-- skewed is set when an operation's calendar periods do not hold Redis's clock.
-- kept: parsed operations kept across calls, by their bytes, for a module that makes
-- its clock's fields again for each call (`fresh`) and without calendar periods (made
-- on the clock at parse). In a function library this spares each call the parse of
-- the operations it repeats, about a third of a one-decision call; for EVALSHA it is
-- made again with everything else. At most KEPT (costs vary with hits_addend).
local kept, kept_n, KEPT = {}, 0, 1024
local function parse(text)
  if text == nil or #text < OP_LEN then return nil end
  local flag, id, limit, window, burst, max_delay, flags, cost = struct.unpack(OP, text)
  -- Bit 3: the request's lease id follows (a concurrency rule's lease_key), the rest
  -- of the text; else the text is the operation, or it and its calendar periods.
  local lease
  if flags >= 8 then
    lease, flags = string.sub(text, OP_LEN + 1), flags - 8
  elseif #text ~= OP_LEN and #text ~= OP_LEN + CAL_LEN then
    return nil
  end
  local algo = algorithm(id)
  -- Whole numbers only, none negative but max_delay's -1 (a NaN fails every test).
  if algo == nil or (flag ~= PLUS and flag ~= MINUS and flag ~= DOT) or flags > 7
    or not (limit >= 0 and window >= 0 and burst >= 0 and cost >= 0 and max_delay >= -1)
    or floor(limit) ~= limit or floor(window) ~= window or floor(burst) ~= burst
    or floor(cost) ~= cost or floor(max_delay) ~= max_delay then
    return nil
  end
  -- flags: bit 0 vetoes, bits 1-2 the mode (src/algorithm/mode.rs): 0 limit,
  -- 1 overdraft, 2 quota (charges: always consumed), 3 release. An operation that
  -- commits is written whatever its answer and whatever its request's.
  local mode = floor(flags / 2)
  local decide, commits, need = algo.decide, algo.counts_denials or false, cost
  if mode == 3 then
    decide, commits = algo.release, algo.releases
  elseif mode ~= 0 and algo.charges then
    decide, commits = algo.charge, true
    if mode == 1 then need = 1 end
  end
  -- A limit's hits on a module that can increment first (fixed_window.lua's `take`).
  local take
  if mode == 0 and flag ~= MINUS then take = algo.take end
  local p = {
    algo = algo, decide = decide, take = take, untake = algo.untake, limit = limit, window = window, burst = burst,
    max_delay = max_delay, vetoes = flags % 2 == 1, cost = cost, starts = flag ~= DOT,
    dry = flag == MINUS, commits = commits, need = need, check = algo.decide, lease = lease,
  }
  -- Whether the lean path may decide it (`decide_lean`).
  p.lean = take ~= nil and algo.lean ~= nil and algo.lean(p)
  if lease then
    -- One request's own: never kept for another call.
  elseif #text > OP_LEN then
    local ok, why = calendar(p, text, OP_LEN + 1, now_ms)
    if why then skewed = true end
    if not ok then return nil end
  elseif algo.fresh then
    -- Kept for the calls after this one (see `kept`).
    if kept_n >= KEPT then kept, kept_n = {}, 0 end
    kept[text], kept_n = p, kept_n + 1
  end
  if algo.fresh then algo.fresh(p, now_ms) end
  specs[text] = p
  return p
end

-- state, stored, writer: per counter, across the whole call, its committed state
-- (`false` = none stored), the state Redis held, and the spec of the last operation
-- that changed it (the counters to write at the end). Why so few tables: each one
-- made per call costs Redis about as much as a decision.
-- The scratch of one request's operations on the path that increments first: their
-- specs and their replies (reused by every request, and in a library every call).
local seg, r1, r2, r3, r4 = {}, {}, {}, {}, {}

-- Replaces the full-form reply at `at` of an allowed operation of a segment that does
-- not commit by the state without this request (remaining and reset of a check-only
-- call) and no shaping wait.
local function unwind(at, p, s)
  local _, remaining, reset = p.check(s, p, now_ms, 0, at + 4)
  if remaining < 0 then remaining = 0 end
  out[at + 1], out[at + 2], out[at + 3] = remaining, reset, 0
end

-- A failed call writes nothing. The general path writes only after every segment is
-- decided (a sliding log's load may have trimmed hits that had already left its
-- window: the same log to every reader); `take` writes as it goes, after every
-- operation has been parsed (below). What else can fail a call midway is a key this
-- node does not serve, in an any-slot call on a cluster (ANY_SLOT, set by the
-- prelude): Redis refuses the command touching it, and the call is decided again
-- by slot, so hits kept here would be counted twice. There, what `take` kept is
-- logged in `done` (its key and spec, in order) and given back when the call fails.
-- Only there: the log costs two table stores per operation, about 5% of a decision.
--
-- From the request at `first` on, the reply written up to `o`, the log up to `d`, the
-- last full form's three values (batch_lean.lua's lean path hands over here mid-call).
local function decide_all(first, o, d, last_reset, last_third, last_token)
  -- Locals, not the chunk's upvalues: read and written for every operation.
  local KEYS, ops, out, seg, done = call_keys, ops, out, seg, done
  local r1, r2, r3, r4, now_ms, injected, runs, count = r1, r2, r3, r4, now_ms, injected, runs, count
  local held = false
  local p = ops[first]
  while first <= count do
    -- This request's operations run to the next one that starts a request. Whether it
    -- can increment first (`take`, see below) is told on the way: every operation a
    -- limit's hits, each on its own counter (a counter's second operation would need
    -- the first's tentative state), one request per operation (no run), on no counter
    -- the general path holds a state of (that state is written at the end, over what
    -- `take` wrote). seg keeps the specs, so the request's loop looks none up again.
    local last, next_p = first, nil
    local fast = p.take ~= nil and (runs == nil or runs[first] == 1)
      and (not held or state[KEYS[first]] == nil)
    seg[1] = p
    while last < count do
      next_p = ops[last + 1]
      if next_p.starts then break end
      last = last + 1
      seg[last - first + 1] = next_p
      if fast then
        local key = KEYS[last]
        if next_p.take == nil or (runs and runs[last] ~= 1) or (held and state[key] ~= nil) then
          fast = false
        else
          for j = first, last - 1 do
            if KEYS[j] == key then fast = false end
          end
        end
      end
      next_p = nil
    end
    if fast and first == last then
      -- The common request: one descriptor, its hits taken in Redis at once.
      local key = KEYS[first]
      local remaining, reset, third, token = p.take(key, p, now_ms, injected)
      if remaining >= 0 and ANY_SLOT then
        d = d + 2
        done[d - 1], done[d] = key, p
      end
      if reset == last_reset and third == last_third and token == last_token then
        o = o + 1
        out[o] = -3 - remaining
      else
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, third, token
        o = o + 4
        last_reset, last_third, last_token = reset, third, token
      end
    elseif fast then
      -- Each operation takes its hits in Redis at once; a veto gives back the hits that
      -- stayed, and each of those operations answers as a check of its counter without
      -- this request (what `unwind` answers on the general path). The replies are
      -- kept in r1-r4 until then, and go out in the short form where they repeat.
      local size, vetoed, logged = last - first + 1, false, d
      for n = 1, size do
        local q, key = seg[n], KEYS[first + n - 1]
        local remaining, reset, third, token = q.take(key, q, now_ms, injected)
        r1[n], r2[n], r3[n], r4[n] = remaining, reset, third, token
        if remaining >= 0 then
          if ANY_SLOT then
            d = d + 2
            done[d - 1], done[d] = key, q
          end
        elseif q.vetoes then
          vetoed = true
        end
      end
      if vetoed then
        -- Given back here, so out of the log: the log ends at its first nil.
        for i = logged + 1, d do done[i] = nil end
        d = logged
        for n = 1, size do
          if r1[n] >= 0 then
            local q = seg[n]
            r1[n], r3[n] = q.untake(KEYS[first + n - 1], q, r1[n]), 0
          end
        end
      end
      for n = 1, size do
        local remaining, reset, third, token = r1[n], r2[n], r3[n], r4[n]
        if reset == last_reset and third == last_third and token == last_token then
          o = o + 1
          out[o] = -3 - remaining
        else
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, third, token
          o = o + 4
          last_reset, last_third, last_token = reset, third, token
        end
      end
    elseif last == first and not p.dry then
      if not held then
      held = true
      state, stored, writer = {}, {}, {}
    end
      -- One operation (one descriptor per request is the common case), or a run of
      -- such requests on one counter: no tables, and the counter's state kept here.
      local key, k = KEYS[first], 1
      if runs then
        k = runs[first]
        if k < 1 then error(redis.error_reply('tollgate: malformed runs')) end
      end
      local s, held = state[key], stored[key]
      if s == nil then
        s = p.algo.load(key, p, now_ms)
        state[key] = s
        stored[key] = s
        held = s
      end
      local decide, cost, admitted = p.decide, p.cost, false
      for _ = 1, k do
        -- A state this call made, committed by an earlier request, is referenced by
        -- nothing else: the decision may write the next one into it.
        local reuse = nil
        if s ~= held then reuse = s end
        local new, remaining, reset, third, token = decide(s, p, now_ms, cost, o + 4, reuse)
        if remaining >= 0 or p.commits then
          s = new
          admitted = true
        end
        if reset == last_reset and third == last_third and token == last_token then
          o = o + 1
          out[o] = -3 - remaining
        else
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, third, token or 0
          o = o + 4
          last_reset, last_third, last_token = reset, third, token
          if token == nil then last_reset = nil end
        end
      end
      if admitted then
        state[key] = s
        writer[key] = p
      end
    else
      if runs then
        for i = first, last do
          if runs[i] ~= 1 then error(redis.error_reply('tollgate: malformed runs')) end
        end
      end
      -- Several operations, or a dry run: full forms, decided on tentative states.
      if not held then
      held = true
      state, stored, writer = {}, {}, {}
    end
      local base = o
      local tentative, last_writer = {}, {}
      local vetoed = p.dry
      for i = first, last do
        local key, q = KEYS[i], ops[i]
        local s = tentative[key]
        if s == nil then
          s = state[key]
          if s == nil then
            s = q.algo.load(key, q, now_ms)
            state[key] = s
            stored[key] = s
          end
        end
        local new, remaining, reset, third, token = q.decide(s, q, now_ms, q.cost, o + 4)
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, third, token or 0
        o = o + 4
        tentative[key] = new
        if remaining >= 0 or q.commits then last_writer[key] = q end
        if remaining < 0 and q.vetoes then vetoed = true end
      end
      if vetoed and not p.dry then
        -- Denied: the limits are unwound, but charges and releases happened all the
        -- same, decided again in order on the states without the limits' hits.
        for i = first, last do
          local at = base + 4 * (i - first)
          local q = ops[i]
          if not q.commits and out[at + 1] >= 0 then unwind(at, q, state[KEYS[i]]) end
        end
        for i = first, last do
          local key, q = KEYS[i], ops[i]
          if q.commits then
            local at = base + 4 * (i - first)
            local new, remaining, reset, third, token = q.decide(state[key], q, now_ms, q.cost, at + 4)
            out[at + 1], out[at + 2], out[at + 3], out[at + 4] = remaining, reset, third, token or 0
            state[key] = new
            writer[key] = q
          end
        end
      elseif vetoed then
        for i = first, last do
          local at = base + 4 * (i - first)
          if out[at + 1] >= 0 then unwind(at, ops[i], state[KEYS[i]]) end
        end
      else
        -- A counter only denied in this segment keeps its state (a denial changes none).
        for key, q in pairs(last_writer) do
          state[key] = tentative[key]
          writer[key] = q
        end
      end
      last_reset = nil
    end
    first, p = last + 1, next_p
  end

  return o
end
