-- common.lua: helpers shared by the engine and the algorithm modules, mirroring
-- src/algorithm/. Lua numbers are IEEE doubles, like Rust's f64: the same
-- expressions in the same order give the same results, which the differential test
-- relies on. The contract's constants (OP_FORMAT, FLAG_*, MODE_*, CODE_*...) come
-- before this file, generated from src/store/redis/scripts/contract.rs.
--
-- An algorithm module (lua/<name>.lua, a table named like its model) answers:
--   load(key, p, now_ms, injected)  the stored state, or false for none
--   decide(s, p, now_ms, cost, at, reuse)
--                                   new state, then the operation's reply: remaining if
--                                   allowed else -1, reset ms, if allowed the delay us
--                                   else the retry ms (-1 = never), and the refund token
--                                   (0 when denied; nil when save writes it into
--                                   out[at]); s is never modified, except that when
--                                   reuse (s itself, referenced by nothing else) is
--                                   given, an admission may write the new state into it
--   charge(s, p, now_ms, cost), release(s, p, now_ms, cost)
--                                   the same, for a charge or a release (charge_with and
--                                   release_with below build them from decide)
--   save(key, s, p, now_ms, injected, now_us, stored, out)
--                                   writes s with its TTL once per call (stored: what
--                                   load returned; out: the reply, for tokens decide
--                                   left to it)
--   refund(key, p, token, cost)     gives back what an operation consumed
-- and may answer:
--   prepare(p, now_ms)              what a spec derives from the call's clock, before
--                                   its first decision in a call
--   take(key, p, now_ms, injected), untake(key, p, remaining, now_ms, undo)
--                                   its fast path: decide a limit's hits in Redis at
--                                   once (fixed_window.lua, timed.lua say how), and give
--                                   them back; take's fifth value is what untake needs
--                                   (undo), untake answers what remains without them
--                                   and its reset
-- The engine reads no field of p that a module writes. p is an operation's parsed
-- spec, one table per distinct spec per call (so all on one clock).

local EPSILON = 1e-9

-- Locals instead of global lookups, in code that runs for every operation.
local floor, ceil, max, min, tonumber = math.floor, math.ceil, math.max, math.min, tonumber
local format = string.format

-- ceil of a non-negative float as whole units (negative -> 0)
local function ceil_ms(x)
  if x > 0 then return ceil(x) end
  return 0
end

-- floor of a non-negative float (negative -> 0)
local function floor_u(x)
  if x > 0 then return floor(x) end
  return 0
end

-- A float written so that tonumber() reads back exactly the same double.
local function f17(x)
  return format('%.17g', x)
end

-- A whole number as an argument to redis.call, the same bytes Redis would write for
-- it ("%.17g") made with "%d": Redis formats every number argument as a float, at
-- about three times what "%d" costs. Only below 1e17 ("%.17g" writes those in full,
-- no exponent); anything else stays a number.
local function int(x)
  if x < 1e17 and x > -1e17 and floor(x) == x then return format('%d', x) end
  return x
end

-- A TTL in whole milliseconds, at least one (PEXPIRE 0 would delete the key at once).
local function ttl_ms(ms)
  return int(max(1, ceil(ms)))
end

local function pexpire(key, ms, injected)
  -- With an injected clock (tests only) real time does not follow the injected one,
  -- so keys are kept and the models alone decide what their state is worth.
  if injected then return end
  redis.call('PEXPIRE', key, ttl_ms(ms))
end

-- A string state with its TTL in one command.
local function set_with_ttl(key, value, ms, injected)
  if injected then
    redis.call('SET', key, value)
  else
    redis.call('SET', key, value, 'PX', ttl_ms(ms))
  end
end

-- Calendar periods (time_zone; src/algorithm/calendar.rs): the starts of six
-- consecutive periods around tollgate's clock and the first's number (CALENDAR_FORMAT)
-- at `at` in `text`. Reads them into p.cal_bounds and takes the period holding Redis's
-- clock among the middle three, so the clocks may differ by up to a period: its start,
-- end, the start before it, the end after it, and its number (p.cal_index). False for malformed bounds (not whole, or not in
-- order); false and 'skew' for a clock outside all three (the clocks more than a
-- period apart): the call then fails with CODE_CLOCK and that clock, from which
-- tollgate learns the difference. now_ms nil: only read (a refund).
local function calendar(p, text, at, now_ms)
  local b = { struct.unpack(CALENDAR_FORMAT, text, at) }
  local first = b[7]
  if floor(first) ~= first then return false end
  for i = 1, 6 do
    if floor(b[i]) ~= b[i] or (i > 1 and not (b[i] >= b[i - 1])) then return false end
  end
  p.cal_bounds = b
  if now_ms == nil then return true end
  local now = now_ms
  if now < b[2] or now >= b[5] then return false, 'skew' end
  local i = 2
  if now >= b[4] then i = 4 elseif now >= b[3] then i = 3 end
  p.cal_now, p.cal_prev, p.cal_start, p.cal_end, p.cal_next_end = now, b[i - 1], b[i], b[i + 1], b[i + 2]
  p.cal_index = first + i - 1
  return true
end

-- The start of the period after the one starting at `start`, among p's bounds.
local function calendar_after(p, start)
  local b = p.cal_bounds
  for i = 1, 5 do
    if b[i] == start then return b[i + 1] end
  end
  return nil
end

-- A charge in terms of the module's own decide (mirrors charge in
-- src/algorithm/mode.rs, same calls in the same order): the state at now, whether
-- p.need fitted before the charge, the cost added (past the limit if need be), and
-- the reply a check of the charged state gives. Consumed whatever the answer.
local function charge_with(decide, add, s, p, now_ms, cost)
  local rolled = decide(s, p, now_ms, 0)
  local _, before = decide(rolled, p, now_ms, p.need)
  local after = add(rolled, p, now_ms, cost)
  local _, remaining, reset = decide(after, p, now_ms, 0)
  if remaining < 0 then remaining = 0 end
  if before >= 0 then return after, remaining, reset, 0, 0 end
  local _, _, _, retry = decide(after, p, now_ms, p.need)
  return after, -1, reset, retry, 0
end

-- A release (mirrors release in src/algorithm/mode.rs): the cost given back by sub on
-- the state at now, answered as a check of the result, always allowed.
local function release_with(decide, sub, s, p, now_ms, cost)
  local rolled = decide(s, p, now_ms, 0)
  local after = sub(rolled, p, now_ms, cost)
  local _, remaining, reset = decide(after, p, now_ms, 0)
  if remaining < 0 then remaining = 0 end
  return after, remaining, reset, 0, 0
end

local function unchanged(s)
  return s
end
