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
  local value = text(p, 'fw_set', c * SHIFT + s.w % SHIFT)
  if injected then
    redis.call('SET', key, value)
    return
  end
  -- Every save of this spec in this call is in the one window of the call's clock:
  -- s.w is that window (decide wrote it), whose end current() kept.
  local ttl = p.fw_ttl
  if ttl == nil then
    ttl = ttl_ms(p.fw_end - now_ms)
    p.fw_ttl = ttl
  end
  redis.call('SET', key, value, 'PX', ttl)
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
