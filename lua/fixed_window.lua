-- fixed_window.lua: mirrors src/algorithm/fixed_window.rs.
-- State: one integer (a string value), c * 2^20 + the window's start (seconds since
-- the epoch) mod 2^20. Windows are aligned to the epoch, so every replica and shard
-- agrees on the boundaries. The key names the counter, not the window; a new window
-- is told by the low bits (two starts share them only 2^20 s, 12 days, apart, and a
-- value never outlives its window's TTL).
--
-- Why one integer and not a hash {w, c}: on distinct counters a decision costs Redis
-- what its commands cost, and a value is the cheapest state there is: a counter of
-- the current window is read with GET and written with INCRBY (in place, its TTL
-- kept); a new window is one SET with its TTL (a hash took HSET and PEXPIRE). Exact
-- in Lua's doubles: c is kept below 2^33 (see save), so the whole number stays
-- below 2^53. Keys written by tollgate before this layout are
-- hashes: `load` reads them (WRONGTYPE), and the next write replaces them with a
-- value, so counts carry over an upgrade.

local fixed_window = {}

local SHIFT, CAP = 1048576, 8589934591

-- The window's start and reset depend only on the spec and the call's one clock: they
-- are computed once per call and kept in the spec's table (p), which lives as long,
-- with the low bits the window's value carries and its end (the TTL's instant).
-- With a time_zone, the window is the calendar period common.lua's `calendar` chose.
local function current(p, now_ms)
  if p.cal_start then
    local now, start = floor(p.cal_now / 1000), floor(p.cal_start / 1000)
    p.fw_start, p.fw_reset = start, (floor(p.cal_end / 1000) - now) * 1000
    p.fw_low, p.fw_end = start % SHIFT, p.cal_end
    return start
  end
  local window = max(floor(p.window / 1000), 1)
  local now = floor(now_ms / 1000)
  local start = now - (now % window)
  p.fw_start, p.fw_reset, p.fw_low = start, (window - (now % window)) * 1000, start % SHIFT
  p.fw_end = (start + window) * 1000
  return start
end

-- A spec kept across calls (a function library keeps parsed operations: batch.lua's
-- `kept`) has its clock's fields made again for each call; the values cached for a
-- window go when the window does.
function fixed_window.fresh(p, now_ms)
  local start = p.fw_start
  current(p, now_ms)
  if p.fw_start ~= start then
    -- fw_new: a new counter's value in this window (batch_lean.lua writes it).
    p.fw_set, p.fw_new = nil, int(p.cost * SHIFT + p.fw_low)
  end
  p.fw_ttl = nil
end

-- The state a value holds for the current window: w is the window's start when the
-- low bits name it, -1 (any other window) when not.
local function parse(v, p, start)
  local n = tonumber(v) or 0
  local low = n % SHIFT
  if low == p.fw_low then return { w = start, c = (n - low) / SHIFT } end
  return { w = -1, c = 0 }
end

-- A hash from before the value layout: {w = window start (s), c = hits}.
local function legacy(key)
  local h = redis.call('HMGET', key, 'w', 'c')
  return { w = tonumber(h[1]) or -1, c = tonumber(h[2]) or 0, legacy = true }
end

function fixed_window.load(key, p, now_ms)
  local start = p.fw_start or current(p, now_ms)
  local v = redis.pcall('GET', key)
  if v == false then return { w = -1, c = 0 } end
  if type(v) == 'table' then return legacy(key) end
  return parse(v, p, start)
end

function fixed_window.decide(s, p, now_ms, cost, _, reuse)
  local start, reset_ms = p.fw_start, p.fw_reset
  if start == nil then
    start = current(p, now_ms)
    reset_ms = p.fw_reset
  end
  local count = s.c
  if s.w ~= start then count = 0 end
  local after = count + cost
  if after <= p.limit then
    if reuse then
      reuse.w, reuse.c = start, after
      return reuse, p.limit - after, reset_ms, 0, start
    end
    return { w = start, c = after }, p.limit - after, reset_ms, 0, start
  end
  local retry = -1
  if cost <= p.limit then retry = reset_ms end
  if s.w == start then return s, -1, reset_ms, retry, 0 end
  return { w = start, c = count }, -1, reset_ms, retry, 0
end

-- A number as text once per call and spec: formatting one costs Redis more than the
-- INCRBY it goes into, and the counters of one spec mostly add the same cost in the
-- same window (so write the same values, with the same TTL).
local function text(p, field, n)
  local cache = p[field]
  if cache == nil then
    cache = {}
    p[field] = cache
  end
  local t = cache[n]
  if t == nil then
    t = int(n)
    cache[n] = t
  end
  return t
end

-- The TTL of p's window (the rest of it), once per call.
local function ttl_of(p, now_ms)
  local ttl = p.fw_ttl
  if ttl == nil then
    ttl = ttl_ms(p.fw_end - now_ms)
    p.fw_ttl = ttl
  end
  return ttl
end
fixed_window.ttl_of = ttl_of

-- Writes a value of the current window with its TTL (the window's end) in one SET;
-- with an injected clock (tests) no TTL: real time does not follow it.
local function set_window(key, p, value, now_ms, injected)
  if injected then
    redis.call('SET', key, value)
    return
  end
  redis.call('SET', key, value, 'PX', ttl_of(p, now_ms))
end

-- TTL: the rest of the window, an instant fixed by w: a value stored in the same
-- window already has it (INCRBY keeps a TTL), so only a new window (or a legacy hash)
-- sets it, in the one SET that writes the value.
function fixed_window.save(key, s, p, now_ms, injected, _, stored)
  -- Charges consume whatever the answer, so a count may pass its limit by any amount;
  -- past CAP (far above any u32 limit plus a u32 cost) every answer is the same, and
  -- c * 2^20 must stay below 2^53 to keep the window's bits exact.
  local c = s.c
  if c > CAP then c = CAP end
  if stored.w == s.w and not stored.legacy then
    redis.call('INCRBY', key, text(p, 'fw_add', (c - stored.c) * SHIFT))
    return
  end
  -- Every save of this spec in this call is in the one window of the call's clock:
  -- s.w is that window (decide wrote it), whose end current() kept.
  set_window(key, p, text(p, 'fw_set', c * SHIFT + s.w % SHIFT), now_ms, injected)
end

function fixed_window.refund(key, p, token, cost)
  local v = redis.pcall('GET', key)
  if v == false then return end
  if type(v) == 'table' then
    local s = legacy(key)
    local back = min(s.c, cost)
    if s.w == token and back > 0 then redis.call('HINCRBY', key, 'c', -back) end
    return
  end
  local n = tonumber(v) or 0
  local low = n % SHIFT
  if low == token % SHIFT then
    local back = min((n - low) / SHIFT, cost)
    if back > 0 then redis.call('INCRBY', key, int(-back * SHIFT)) end
  end
end

-- Increment first, as the one-script server does: on distinct counters a decision
-- costs Redis what its commands cost, and reading before writing (load, decide, save)
-- took a GET and an INCRBY where this takes the INCRBY alone. batch.lua uses it for a
-- limit's hits (not charges, releases or dry runs) on a counter no other path of the
-- call has read. The same decision as `decide` on the state the value holds:
--   the value's low bits name this window: its count (less the cost) was before;
--   they name another (or the key was absent: INCRBY made the cost alone): the
--     window starts with this cost, one SET with its TTL;
--   the count passes the limit: denied, and the hits taken back (a denial consumes
--     nothing, COUNTS_DENIALS), so a count never stays past the limit on its account.
-- A cost above the limit is denied whatever the count, without a command; a cost of
-- 0 (a check) reads with GET and writes nothing (INCRBY 0 would create the key).
-- Returns decide's reply; the hits of an admission with a cost stay until `untake`
-- gives them back (another operation of the request vetoed it).
local TWO53 = 9007199254740992

local function count_in(n, p)
  local low = n % SHIFT
  if low == p.fw_low then return (n - low) / SHIFT end
  return 0
end

-- A new window's value (the cost) with its TTL, in one SET.
local function take_new(key, p, now_ms, injected)
  set_window(key, p, p.fw_new, now_ms, injected)
  return p.limit - p.cost, p.fw_reset, 0, p.fw_start
end

-- What the plain path does not cover: a cost of 0 or above the limit, a value INCRBY
-- refused, a count past 2^32.
local function take_odd(key, p, now_ms, injected, v)
  local limit, reset_ms, cost = p.limit, p.fw_reset, p.cost
  if cost > limit then return -1, reset_ms, -1, 0 end
  if cost == 0 then
    local c = 0
    v = redis.pcall('GET', key)
    if type(v) == 'table' then
      local s = legacy(key)
      if s.w == p.fw_start then c = s.c end
    elseif v then
      c = count_in(tonumber(v) or 0, p)
    end
    if c <= limit then return limit - c, reset_ms, 0, p.fw_start end
    return -1, reset_ms, reset_ms, 0
  end
  if type(v) == 'table' then
    -- A hash of 0.1.0 (WRONGTYPE, nothing written) is rewritten as a value holding
    -- its count for this window; a value INCRBY cannot add to (not an integer) is
    -- no count and is overwritten, as `load` reads it.
    local c = 0
    if string.find(v.err, 'WRONGTYPE', 1, true) then
      local s = legacy(key)
      if s.w == p.fw_start then c = min(s.c, CAP) end
    elseif not string.find(v.err, 'not an integer', 1, true) then
      -- Not the value's fault (a key this node does not serve): the call fails.
      error(v)
    end
    set_with_ttl(key, int(c * SHIFT + p.fw_low), p.fw_end - now_ms, injected)
    return fixed_window.take(key, p, now_ms, injected)
  end
  -- A count past 2^32 (charges, capped at CAP) plus a cost: a double no longer holds
  -- the low bits. What the key held is exact: take the hits back and read that.
  v = redis.call('INCRBY', key, text(p, 'fw_sub', -cost * SHIFT))
  if v % SHIFT == p.fw_low then return -1, reset_ms, reset_ms, 0 end
  return take_new(key, p, now_ms, injected)
end

-- What `take` makes of its INCRBY's reply v, a number below 2^53 (batch_lean.lua's lean
-- path runs the INCRBY itself and calls this, or `taken` for any other reply, for
-- every outcome but the common one, see `lean`).
local function counted(key, p, now_ms, injected, v)
  local low = v % SHIFT
  if low ~= p.fw_low then return take_new(key, p, now_ms, injected) end
  local c = (v - low) / SHIFT
  if c > p.limit then
    redis.call('INCRBY', key, text(p, 'fw_sub', -p.cost * SHIFT))
    return -1, p.fw_reset, p.fw_reset, 0
  end
  if low == 0 and c == p.cost and not injected then
    -- The key may have been absent (INCRBY made it, without a TTL): this window's
    -- low bits are 0 once in 2^20 seconds.
    redis.call('PEXPIRE', key, ttl_ms(p.fw_end - now_ms))
  end
  return p.limit - c, p.fw_reset, 0, p.fw_start
end
fixed_window.counted = counted

-- What `take` makes of any reply v of its INCRBY.
function fixed_window.taken(key, p, now_ms, injected, v)
  if type(v) ~= 'number' or v >= TWO53 then return take_odd(key, p, now_ms, injected, v) end
  return counted(key, p, now_ms, injected, v)
end

-- The INCRBY's argument: the cost in the count's bits, false for a cost of 0 or above
-- the limit (take_odd). The window's fields are the spec's already (`fresh`).
local function incr(p)
  local add = p.fw_incr
  if add == nil then
    add = false
    if p.cost > 0 and p.cost <= p.limit then add = int(p.cost * SHIFT) end
    p.fw_incr = add
  end
  return add
end

function fixed_window.take(key, p, now_ms, injected)
  local add = incr(p)
  if not add then return take_odd(key, p, now_ms, injected) end
  return fixed_window.taken(key, p, now_ms, injected, redis.pcall('INCRBY', key, add))
end

-- Whether batch_lean.lua's lean path may take p's hits: a plain cost (p.fw_incr). It inlines
-- `counted`'s two common outcomes: a count of this window within the limit (the low
-- bits p.fw_low, not 0: a count INCRBY may just have made, see `counted`) answers
-- (limit - count, p.fw_reset, 0, p.fw_start); a new window (other low bits, Redis's
-- own clock) is `take_new`'s SET of p.fw_new with its TTL. `untake` gives the
-- hits back. Every other outcome of a plain cost is `counted`'s or `taken`'s: an
-- admission answers the same three last values, a denial (-1, p.fw_reset, p.fw_reset, 0).
fixed_window.shift = SHIFT
function fixed_window.lean(p)
  return incr(p) ~= false
end

-- Gives back the hits of an admitting `take` (`remaining` its answer) and answers as
-- a check of what is left, never below 0: the state without this request.
function fixed_window.untake(key, p, remaining)
  if not p.fw_incr then return remaining end
  local left = p.limit - count_in(redis.call('INCRBY', key, text(p, 'fw_sub', -p.cost * SHIFT)), p)
  if left < 0 then return 0 end
  return left
end

-- Charges and releases (src/algorithm/mode.rs): the count of the current window.
fixed_window.charges, fixed_window.releases = true, true

local function fw_add(s, _, _, cost)
  return { w = s.w, c = s.c + cost }
end

local function fw_sub(s, _, _, cost)
  return { w = s.w, c = s.c - min(s.c, cost) }
end

function fixed_window.charge(s, p, now_ms, cost)
  return charge_with(fixed_window.decide, fw_add, s, p, now_ms, cost)
end

function fixed_window.release(s, p, now_ms, cost)
  return release_with(fixed_window.decide, fw_sub, s, p, now_ms, cost)
end
