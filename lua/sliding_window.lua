-- sliding_window.lua: mirrors src/algorithm/sliding_window.rs. State: {start =
-- current window start (ms), prev = previous window's hits, curr = this window's}.
-- estimate = prev x (W - elapsed) / W + curr; admit iff estimate + cost <= L. Stored
-- as one integer (sliding_window_value.lua, assembled before this file), so a hit on
-- this window's count is one INCRBY (take), and the window's TTL, fixed by its start,
-- stays. 0.1 kept a hash {s, p, c}, read until its next write replaces it.

local sliding_window = {}

-- The window holding the call's clock, kept in the spec (p) for the call: its start,
-- length, the next one's, the start before it, its number's identity and the one
-- before's, and when a value of it stops mattering (two windows on).
function sliding_window.prepare(p, now_ms)
  local index
  if p.cal_start then
    local start = p.cal_start
    p.sw_start, p.sw_prev = start, p.cal_prev
    p.sw_window, p.sw_next = p.cal_end - start, p.cal_next_end - p.cal_end
    p.sw_ttl_at, index = p.cal_next_end, p.cal_index
  else
    local start = now_ms - (now_ms % p.window)
    p.sw_start, p.sw_prev, p.sw_window, p.sw_next = start, nil, p.window, p.window
    p.sw_ttl_at, index = start + 2 * p.window, floor(start / p.window)
  end
  p.sw_id, p.sw_id_prev = index % 3 + 1, (index - 1) % 3 + 1
  local elapsed = now_ms - p.sw_start
  p.sw_weight, p.sw_reset = (p.sw_window - elapsed) / p.sw_window, p.sw_window - elapsed
  p.sw_ttl, p.sw_fresh = nil, nil
  if p.sw_incr == nil then
    p.sw_incr = p.cost > 0 and p.cost <= p.limit and int(p.cost * ID_STEPS)
    p.sw_decr = p.sw_incr and int(-p.cost * ID_STEPS)
    p.sw_first = p.cost * ID_STEPS
  end
end

-- A value's identity holds three windows because its TTL (two windows from its
-- start) removes it before a fourth. With an injected clock (tests only) keys get no
-- TTL, real time not following the injected one: the window's end is kept beside the
-- key instead, and a key past it is removed before it is read, as its TTL would have.
local function expire_injected(key, now_ms)
  local deadline = tonumber(redis.call('GET', key .. '~'))
  if deadline and deadline <= now_ms then redis.call('DEL', key, key .. '~') end
end

-- 0.1's hash {s, p, c}.
local function legacy(key)
  local h = redis.pcall('HMGET', key, 's', 'p', 'c')
  if type(h) ~= 'table' or h.err or h[1] == false then return false end
  return { start = tonumber(h[1]) or -1, prev = tonumber(h[2]) or 0, curr = tonumber(h[3]) or 0, legacy = true }
end

function sliding_window.load(key, p, now_ms, injected)
  if injected then expire_injected(key, now_ms) end
  local v = redis.pcall('GET', key)
  if v == false then return false end
  if type(v) == 'table' then return legacy(key) end
  local n = tonumber(v)
  if n == nil then return false end
  return state_of(n, p)
end

function sliding_window.decide(s, p, now_ms, cost, _, reuse)
  local start, window, next_window, prev_start = p.sw_start, p.sw_window, p.sw_next, p.sw_prev
  local prev, curr = 0, 0
  if s and s.start == start then
    prev, curr = s.prev, s.curr
  elseif s and ((prev_start == nil and s.start + window == start) or s.start == prev_start) then
    prev, curr = round_up(s.curr), 0
  end
  local elapsed = now_ms - start
  local weight = (window - elapsed) / window
  local estimate = prev * weight + curr
  local reset_ms = window - elapsed
  if cost <= p.limit and estimate + cost <= p.limit then
    local remaining = floor_u(p.limit - (estimate + cost))
    if reuse then
      reuse.start, reuse.prev, reuse.curr = start, prev, curr + cost
      return reuse, remaining, reset_ms, 0, start
    end
    return { start = start, prev = prev, curr = curr + cost }, remaining, reset_ms, 0, start
  end
  local st = { start = start, prev = prev, curr = curr }
  if cost > p.limit then return st, -1, reset_ms, -1, 0 end
  local need = p.limit - cost
  local retry
  if curr <= need and prev > 0 then
    retry = ceil_ms(window * (1 - (need - curr) / prev) - elapsed)
  else
    local at = 0
    if curr > need then at = next_window * (1 - need / curr) end
    retry = reset_ms + ceil_ms(at)
  end
  return st, -1, reset_ms, retry, 0
end

-- Writes s as this window's value with its TTL (two windows from its start; none with
-- an injected clock, which real time does not follow).
local function set_value(key, s, p, now_ms, injected)
  if injected then
    redis.call('SET', key, value_of(s, p))
    redis.call('SET', key .. '~', int(p.sw_ttl_at))
    return
  end
  local ttl = p.sw_ttl
  if ttl == nil then
    ttl = ttl_ms(p.sw_ttl_at - now_ms)
    p.sw_ttl = ttl
  end
  redis.call('SET', key, value_of(s, p), 'PX', ttl)
end

-- In the same window only curr changes (in place, the TTL kept); a rolled window, a
-- release that took from prev, or 0.1's hash: the whole value.
function sliding_window.save(key, s, p, now_ms, injected, _, stored)
  if stored and not stored.legacy and stored.start == s.start and stored.prev == s.prev
    and s.curr <= CURR_CAP then
    redis.call('INCRBY', key, int((s.curr - stored.curr) * ID_STEPS))
    return
  end
  set_value(key, s, p, now_ms, injected)
end

-- The fast path: increment first. The common outcome, a count of this window within
-- the estimate's room, is the INCRBY alone; a denial takes the hits back (a denial
-- consumes nothing); a key of the window before, a new key or 0.1's hash is decided
-- on what it held and written whole (once a window a counter). Returns what untake
-- needs: nil when the hits were added in place, else the value replaced (false: none).
local TWO53 = 9007199254740992
local pcall, type = redis.pcall, type

local function take_slow(key, p, now_ms, injected, v)
  local s, undo = false, false
  if type(v) == 'table' then
    if not string.find(v.err, 'WRONGTYPE', 1, true) then error(v.err) end
    s = legacy(key)
    if s then undo = value_of(s, p) end
  elseif v >= TWO53 then
    -- No value this module writes: the hits back, and a denial, the safe answer.
    redis.call('INCRBY', key, p.sw_decr)
    return -1, p.sw_reset, p.sw_reset, 0, nil
  elseif v % ID_STEPS ~= 0 then
    -- Another window's value, with the hits added to its count: as it was.
    undo = int(v - p.cost * ID_STEPS)
    s = state_of(v - p.cost * ID_STEPS, p)
  end
  local new, remaining, reset, third, token = sliding_window.decide(s, p, now_ms, p.cost)
  if remaining >= 0 then
    set_value(key, new, p, now_ms, injected)
  elseif type(v) == 'number' then
    if undo then redis.call('SET', key, undo, 'KEEPTTL') else redis.call('DEL', key) end
  end
  return remaining, reset, third, token, undo
end

-- A check (cost 0), or a cost above the limit: decided, nothing written.
local function take_odd(key, p, now_ms, injected)
  local s = false
  if p.cost == 0 then s = sliding_window.load(key, p, now_ms, injected) end
  local _, remaining, reset, third, token = sliding_window.decide(s, p, now_ms, p.cost)
  return remaining, reset, third, token, nil
end

-- The decision on a key INCRBY just made, the same for every such key of the spec in
-- a call (an admission: the cost is within the limit), and the value it writes.
local function fresh(p, now_ms)
  local new, remaining, reset, third, token = sliding_window.decide(false, p, now_ms, p.cost)
  local f = { remaining, reset, third, token, value_of(new, p) }
  p.sw_fresh = f
  return f
end

function sliding_window.take(key, p, now_ms, injected)
  local add = p.sw_incr
  if not add then return take_odd(key, p, now_ms, injected) end
  if injected then expire_injected(key, now_ms) end
  local v = pcall('INCRBY', key, add)
  -- A key INCRBY just made (its id 0), most keys once a window turns on distinct
  -- counters: this window's value with its TTL in one SET, decided once per call;
  -- inline, as `set_value` does it, since a Lua call here costs Redis 1% of the
  -- decision.
  if v == p.sw_first and not injected then
    local f = p.sw_fresh or fresh(p, now_ms)
    local ttl = p.sw_ttl
    if ttl == nil then
      ttl = ttl_ms(p.sw_ttl_at - now_ms)
      p.sw_ttl = ttl
    end
    redis.call('SET', key, f[5], 'PX', ttl)
    return f[1], f[2], f[3], f[4], false
  end
  if type(v) == 'number' and v < TWO53 and v % ID_STEPS == p.sw_id then
    local id = p.sw_id
    local rest = (v - id) / ID_STEPS
    local curr = rest % CURR_MOD
    local prev = prev_of((rest - curr) / CURR_MOD)
    local estimate = prev * p.sw_weight + (curr - p.cost)
    if estimate + p.cost <= p.limit then
      return floor_u(p.limit - (estimate + p.cost)), p.sw_reset, 0, p.sw_start, nil
    end
    redis.call('INCRBY', key, p.sw_decr)
    local s = { start = p.sw_start, prev = prev, curr = curr - p.cost }
    local _, remaining, reset, third, token = sliding_window.decide(s, p, now_ms, p.cost)
    return remaining, reset, third, token, nil
  end
  return take_slow(key, p, now_ms, injected, v)
end

-- Gives back what take wrote and answers as a check of what is left.
function sliding_window.untake(key, p, _, now_ms, undo)
  if undo == nil then
    if p.sw_incr then redis.call('INCRBY', key, p.sw_decr) end
  elseif undo == false then
    redis.call('DEL', key)
  else
    redis.call('SET', key, undo, 'KEEPTTL')
  end
  local _, remaining, reset = sliding_window.decide(sliding_window.load(key, p, now_ms), p, now_ms, 0)
  if remaining < 0 then remaining = 0 end
  return remaining, reset
end

-- As 0.1 wrote it: a hash {s, p, c}, its TTL two windows from its start.
function sliding_window.save_0_1(key, s, p, now_ms, injected)
  redis.call('DEL', key)
  redis.call('HSET', key, 's', int(s.start), 'p', int(s.prev), 'c', int(s.curr))
  pexpire(key, p.sw_ttl_at - now_ms, injected)
end

-- The refund token is the window start the hits went into: still this window's
-- count, or, the window having rolled since, the previous one's.
function sliding_window.refund(key, p, token, cost)
  local s = sliding_window.load(key, p)
  if not s then return end
  if s.start == token then
    s.curr = s.curr - min(s.curr, cost)
  elseif s.start == p.sw_start and token == (p.sw_prev or p.sw_start - p.sw_window) then
    s.prev = round_up(s.prev - min(s.prev, cost))
  else
    return
  end
  if s.legacy then
    redis.call('HSET', key, 'p', int(s.prev), 'c', int(s.curr))
  else
    redis.call('SET', key, value_of(s, p), 'KEEPTTL')
  end
end

-- Charges and releases (src/algorithm/mode.rs): this window's count; a release takes
-- from this window first, then from the previous one (kept as the value holds it).
local function sw_add(s, _, _, cost)
  return { start = s.start, prev = s.prev, curr = s.curr + cost }
end

local function sw_sub(s, _, _, cost)
  local from_curr = min(s.curr, cost)
  local from_prev = min(s.prev, cost - from_curr)
  return { start = s.start, prev = round_up(s.prev - from_prev), curr = s.curr - from_curr }
end

function sliding_window.charge(s, p, now_ms, cost)
  return charge_with(sliding_window.decide, sw_add, s, p, now_ms, cost)
end

function sliding_window.release(s, p, now_ms, cost)
  return release_with(sliding_window.decide, sw_sub, s, p, now_ms, cost)
end
