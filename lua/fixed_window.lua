-- fixed_window.lua: mirrors src/algorithm/fixed_window.rs.
-- State: one integer (a string value), c * SHIFT + the window's start (seconds since
-- the epoch) mod SHIFT (SHIFT = 2^20, from the model). Windows are aligned to the
-- epoch, so every replica and shard agrees on the boundaries. The key names the
-- counter, not the window; a new window is told by the low bits (two starts share
-- them only 2^20 s, 12 days, apart, and a value never outlives its window's TTL).
--
-- Why one integer: on distinct counters a decision costs Redis what its commands
-- cost, and a value is the cheapest state there is: a counter of the current window
-- is written with INCRBY (in place, its TTL kept), a new window is one SET with its
-- TTL. Exact in Lua's doubles: c is kept below CAP (see save), so the whole number
-- stays below 2^53. 0.1 kept a hash {w = window start (s), c = hits}: read, and written
-- (save_0_1) while a call asks for 0.1's layouts. A key holding anything else (a value
-- INCRBY cannot add to) is no count, and is overwritten by the window's value.

local fixed_window = {}

-- The window's start and reset depend only on the spec and the call's one clock: they
-- are computed once per call and kept in the spec's table (p), with the low bits the
-- window's value carries and its end (the TTL's instant). With a time_zone, the
-- window is the calendar period common.lua's `calendar` chose.
local function current(p, now_ms)
  if p.cal_start then
    local now, start = floor(p.cal_now / 1000), floor(p.cal_start / 1000)
    p.fw_start, p.fw_reset = start, (floor(p.cal_end / 1000) - now) * 1000
    p.fw_low, p.fw_end = start % SHIFT, p.cal_end
    return
  end
  local window = max(floor(p.window / 1000), 1)
  local now = floor(now_ms / 1000)
  local start = now - (now % window)
  p.fw_start, p.fw_reset, p.fw_low = start, (window - (now % window)) * 1000, start % SHIFT
  p.fw_end = (start + window) * 1000
end

-- A number as text once per spec: formatting one costs Redis more than the INCRBY it
-- goes into, and the counters of one spec mostly add the same cost in the same
-- window (so write the same values, with the same TTL).
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

-- The call's clock, for a spec kept across calls too (call.lua's `kept`): the values
-- cached for a window go when the window does. fw_incr: what `take` adds (false for
-- a cost it does not add: 0, or above the limit); fw_new: a new counter's value.
function fixed_window.prepare(p, now_ms)
  local start = p.fw_start
  current(p, now_ms)
  if p.fw_start ~= start then
    p.fw_set, p.fw_new = nil, int(p.cost * SHIFT + p.fw_low)
    -- `take`'s one test of an INCRBY's reply: this window's low bits (never 0, which a
    -- count INCRBY just made from nothing also has) and a count within the limit.
    p.fw_top, p.fw_hot_low = p.limit * SHIFT + p.fw_low, p.fw_low
    if p.fw_low == 0 then p.fw_hot_low = -1 end
  end
  p.fw_ttl = nil
  if p.fw_incr == nil then
    p.fw_incr = p.cost > 0 and p.cost <= p.limit and int(p.cost * SHIFT)
    p.fw_first = p.cost * SHIFT
  end
end

-- The count a value holds for the current window (0 for any other window's).
local function count_in(n, p)
  local low = n % SHIFT
  if low == p.fw_low then return (n - low) / SHIFT end
  return 0
end

-- 0.1's hash, as the state of the current window or of none.
local function legacy(key, p)
  local h = redis.call('HMGET', key, 'w', 'c')
  local w = tonumber(h[1])
  if w ~= p.fw_start then return { w = -1, c = 0, legacy = true } end
  return { w = w, c = tonumber(h[2]) or 0, legacy = true }
end

function fixed_window.load(key, p)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then return legacy(key, p) end
  local n = type(v) == 'string' and tonumber(v)
  if not n then return { w = -1, c = 0 } end
  if n % SHIFT == p.fw_low then return { w = p.fw_start, c = (n - n % SHIFT) / SHIFT } end
  return { w = -1, c = 0 }
end

function fixed_window.decide(s, p, _, cost, _, reuse)
  local start, reset_ms = p.fw_start, p.fw_reset
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

-- Writes a value of the current window with its TTL (the window's end, computed once
-- per call) in one SET; with an injected clock (tests) no TTL: real time does not
-- follow it.
local function set_window(key, p, value, now_ms, injected)
  if injected then
    redis.call('SET', key, value)
    return
  end
  local ttl = p.fw_ttl
  if ttl == nil then
    ttl = ttl_ms(p.fw_end - now_ms)
    p.fw_ttl = ttl
  end
  redis.call('SET', key, value, 'PX', ttl)
end

-- TTL: the rest of the window, an instant fixed by w: a value stored in the same
-- window already has it (INCRBY keeps a TTL), so only a new window sets it, in the one
-- SET that writes the value.
function fixed_window.save(key, s, p, now_ms, injected, _, stored)
  -- Charges consume whatever the answer, so a count may pass its limit by any amount;
  -- past CAP (far above any u32 limit plus a u32 cost) every answer is the same, and
  -- c * SHIFT must stay below 2^53 to keep the window's bits exact.
  local c = s.c
  if c > CAP then c = CAP end
  if stored.w == s.w and not stored.legacy then
    redis.call('INCRBY', key, text(p, 'fw_add', (c - stored.c) * SHIFT))
    return
  end
  set_window(key, p, text(p, 'fw_set', c * SHIFT + s.w % SHIFT), now_ms, injected)
end

-- As 0.1 wrote it: a hash {w, c} with the window's TTL.
function fixed_window.save_0_1(key, s, p, now_ms, injected)
  redis.call('DEL', key)
  redis.call('HSET', key, 'w', int(s.w), 'c', int(s.c))
  pexpire(key, p.fw_end - now_ms, injected)
end

function fixed_window.refund(key, p, token, cost)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    local h = redis.call('HMGET', key, 'w', 'c')
    local back = min(tonumber(h[2]) or 0, cost)
    if tonumber(h[1]) == token and back > 0 then redis.call('HINCRBY', key, 'c', int(-back)) end
    return
  end
  local n = type(v) == 'string' and tonumber(v)
  if not n then return end
  local low = n % SHIFT
  if low == token % SHIFT then
    local back = min((n - low) / SHIFT, cost)
    if back > 0 then redis.call('INCRBY', key, int(-back * SHIFT)) end
  end
end

-- The fast path: increment first, as the one-script server does. On distinct counters
-- a decision costs Redis what its commands cost, and reading before writing (load,
-- decide, save) took a GET and an INCRBY where this takes the INCRBY alone. The same
-- decision as `decide` on the state the value holds:
--   the value's low bits name this window: its count (less the cost) was before;
--   they name another (or the key was absent: INCRBY made the cost alone): the
--     window starts with this cost, one SET with its TTL;
--   the count passes the limit: denied, and the hits taken back (a denial consumes
--     nothing), so a count never stays past the limit on its account.
-- A cost above the limit is denied whatever the count, without a command; a cost of
-- 0 (a check) reads with GET and writes nothing (INCRBY 0 would create the key).
-- The hits of an admission stay until `untake` gives them back (another operation of
-- the request vetoed it, or an any-slot call failed).
local TWO53 = 9007199254740992

-- A new window's value (the cost) with its TTL, in one SET.
local function take_new(key, p, now_ms, injected)
  set_window(key, p, p.fw_new, now_ms, injected)
  return p.limit - p.cost, p.fw_reset, 0, p.fw_start
end

-- A cost that is not added: 0 (a check) or above the limit (denied in any window).
local function take_odd(key, p)
  local limit, reset_ms = p.limit, p.fw_reset
  if p.cost > limit then return -1, reset_ms, -1, 0 end
  local v = redis.pcall('GET', key)
  local n = type(v) == 'string' and tonumber(v)
  local c = n and count_in(n, p) or 0
  if c <= limit then return limit - c, reset_ms, 0, p.fw_start end
  return -1, reset_ms, reset_ms, 0
end

-- What the INCRBY's reply v says. The common outcomes first: a count of this window
-- within the limit (its low bits, not 0: a count INCRBY may just have made), or a
-- new window (other low bits).
local function taken(key, p, now_ms, injected, v)
  if type(v) ~= 'number' then
    if string.find(v.err, 'WRONGTYPE', 1, true) then
      -- 0.1's hash (nothing written): its count, carried into this window's value.
      local c = legacy(key, p).c + p.cost
      if c > p.limit then return -1, p.fw_reset, p.fw_reset, 0 end
      set_window(key, p, int(c * SHIFT + p.fw_low), now_ms, injected)
      return p.limit - c, p.fw_reset, 0, p.fw_start
    end
    -- Not the value's fault (a key this node does not serve): the call fails.
    if not string.find(v.err, 'not an integer', 1, true) then error(v) end
    -- A value INCRBY cannot add to is no count: overwritten by this window's value.
    return take_new(key, p, now_ms, injected)
  end
  if v >= TWO53 then
    -- A count past 2^32 (charges, capped at CAP) plus a cost: a double no longer holds
    -- the low bits. What the key held is exact: take the hits back and read that.
    v = redis.call('INCRBY', key, text(p, 'fw_sub', -p.cost * SHIFT))
    if v % SHIFT == p.fw_low then return -1, p.fw_reset, p.fw_reset, 0 end
    return take_new(key, p, now_ms, injected)
  end
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

local pcall, type = redis.pcall, type

function fixed_window.take(key, p, now_ms, injected)
  local add = p.fw_incr
  if not add then return take_odd(key, p) end
  local v = pcall('INCRBY', key, add)
  -- The common outcome inline: a count of this window (its low bits, not 0: a count
  -- INCRBY may just have made) within the limit (so below 2^53: exact).
  local top = p.fw_top
  if type(v) == 'number' and v <= top then
    local low = v % SHIFT
    if low == p.fw_hot_low then return (top - v) / SHIFT, p.fw_reset, 0, p.fw_start end
    -- The next most common: the key was absent (INCRBY made the cost alone, low bits
    -- 0, no TTL), as most are on distinct counters once a window turns: this
    -- window's value with its TTL in one SET, inline (three calls cost a tenth of
    -- such a decision; even `take_new`, which does the same, costs Redis 3% more a
    -- new decision through its two calls). A count of 0 of a window whose low bits
    -- are 0 reads the same, and gets the same value and TTL.
    if low == 0 and v == p.fw_first and not injected then
      local ttl = p.fw_ttl
      if ttl == nil then
        ttl = ttl_ms(p.fw_end - now_ms)
        p.fw_ttl = ttl
      end
      redis.call('SET', key, p.fw_new, 'PX', ttl)
      return p.limit - p.cost, p.fw_reset, 0, p.fw_start
    end
  end
  return taken(key, p, now_ms, injected, v)
end

-- Gives back the hits of an admitting `take` (`remaining` its answer) and answers as
-- a check of what is left, never below 0: the state without this request, and its
-- reset (the window's end).
function fixed_window.untake(key, p, remaining)
  if not p.fw_incr then return remaining, p.fw_reset end
  local left = p.limit - count_in(redis.call('INCRBY', key, text(p, 'fw_sub', -p.cost * SHIFT)), p)
  if left < 0 then return 0, p.fw_reset end
  return left, p.fw_reset
end

-- Charges and releases (src/algorithm/mode.rs): the count of the current window.
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
