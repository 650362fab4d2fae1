-- timed.lua: what the buckets share (token_bucket.lua, gcra.lua, leaky_bucket.lua):
-- a state of one or two numbers that time alone makes worthless (the bucket full, the
-- queue drained), kept as one string of packed doubles, and the fast path that decides
-- such a counter with one command.
--
-- The value is the module's numbers then E, the key's expiry (ms), all little-endian
-- doubles (exact: nothing formatted, nothing rounded). E is on a grid of GRID ms (from
-- the contract) at least one step past x, the instant the state stops mattering:
-- E = (floor(x / GRID) + 2) x GRID. Why a grid: a write that keeps the key's TTL
-- (KEEPTTL) needs no expiry of its own while x stays on the same step, and the value
-- says which step the key's expiry is on, so a write knows when it must move it.
-- The invariant: the key's real expiry is never before the E its value holds, and E
-- is never before x: a state never outlives its key.
--
-- A module of the family answers, besides the module interface (common.lua):
--   pack(s, e) -> value            unpack(value) -> s, e (nil: not this layout)
--   peek(value, p, now_ms) -> idle, e
--                                  whether a value's state is worth no state at all
--                                  now, and its E, without making the state (nil: not
--                                  this layout)
--   stops(s, p) -> x               when s stops mattering (ms)
--   legacy(key, v, p, now_ms)      optional: the state an earlier release's layout
--                                  holds at key (v: what GET or SET GET answered)
-- and takes its fast path from `timed_taker`.

local function grid_after(x)
  return (floor(x / GRID) + 2) * GRID
end

local function timed_read(m, key, v, p, now_ms)
  local s, e = m.unpack(v)
  if s ~= nil then return s, e end
  if m.legacy then return m.legacy(key, v, p, now_ms), nil end
  return false, nil
end

-- The stored state for the general path (false: none).
local function timed_load(m, key, p, now_ms)
  local v = redis.pcall('GET', key)
  if v == false then return false end
  return (timed_read(m, key, v, p, now_ms))
end

-- Writes s with its expiry, once per call (the general path's save).
local function timed_save(m, key, s, p, injected)
  local e = grid_after(m.stops(s, p))
  if injected then
    redis.call('SET', key, m.pack(s, e))
  else
    redis.call('SET', key, m.pack(s, e), 'PXAT', int(e))
  end
end

-- What a spec's fast path needs from the call's clock: the decision on no state (the
-- same for every idle counter of the spec), and the value it leaves (nil: it leaves
-- none, a check or a cost no bucket admits).
local function timed_prepare(m, p, now_ms)
  local s, remaining, reset, third, token = m.decide(false, p, now_ms, p.cost)
  p.t_remaining, p.t_reset, p.t_third, p.t_token = remaining, reset, third, token
  p.t_value = nil
  if remaining >= 0 and p.cost > 0 then
    local e = grid_after(m.stops(s, p))
    p.t_value, p.t_expiry, p.t_expiry_text = m.pack(s, e), e, int(e)
  end
end

-- Moves the key's expiry to e when the value's (e_old) is before it.
local function timed_expire(key, e_old, e, text, injected)
  if not injected and (e_old == nil or e_old < e) then
    redis.call('PEXPIREAT', key, text or int(e))
  end
end

-- Decides on s (read, nothing written yet) and writes what an admission leaves, with
-- its expiry; a denial writes nothing.
local function timed_decide(m, key, s, e, p, now_ms, injected, rewrite)
  local new, remaining, reset, third, token = p.decide(s, p, now_ms, p.cost)
  if remaining >= 0 then
    local x = grid_after(m.stops(new, p))
    if e and e > x then x = e end
    if rewrite or injected then
      timed_save(m, key, new, p, injected)
    else
      redis.call('SET', key, m.pack(new, x), 'KEEPTTL')
      timed_expire(key, e, x, nil, injected)
    end
  end
  return remaining, reset, third, token
end

-- A busy, absent-but-odd or legacy counter on the fast path: what `old` held (a
-- value, or an error for a key that is not a string), decided and written.
local function timed_busy(m, key, p, now_ms, injected, old)
  if type(old) == 'table' then
    -- Not a string, so nothing written: an earlier release's hash (its module reads
    -- it), or a key this node does not serve (the call fails).
    if not (m.legacy and string.find(old.err, 'WRONGTYPE', 1, true)) then error(old.err) end
    local s = m.legacy(key, nil, p, now_ms) or false
    local remaining, reset, third, token = timed_decide(m, key, s, nil, p, now_ms, injected, true)
    return remaining, reset, third, token, s and m.pack(s, grid_after(m.stops(s, p))) or false
  end
  local s, e = timed_read(m, key, old, p, now_ms)
  local remaining, reset, third, token = timed_decide(m, key, s, e, p, now_ms, injected, e == nil)
  if remaining < 0 then redis.call('SET', key, old, 'KEEPTTL') end
  return remaining, reset, third, token, old
end

-- A check, or a cost no bucket admits: decided on the stored state, nothing written.
local function timed_odd(m, key, p, now_ms)
  local s = timed_load(m, key, p, now_ms)
  local _, remaining, reset, third, token = p.decide(s, p, now_ms, p.cost)
  return remaining, reset, third, token, nil
end

-- The fast path of module m: writes the idle decision's value first and reads what it
-- replaced in the same command (SET ... KEEPTTL GET). An absent or idle counter (most,
-- on distinct counters) is decided by that one command, and its expiry moved when its
-- value's is before the new state's; a busy one is decided on what it held and written
-- again, or given back what it held when denied. Returns the decision and what to
-- give back (untake): the value replaced, false for none.
local function timed_taker(m)
  local pcall, peek = redis.pcall, m.peek
  return function(key, p, now_ms, injected)
    local value = p.t_value
    if value == nil then return timed_odd(m, key, p, now_ms) end
    local old = pcall('SET', key, value, 'KEEPTTL', 'GET')
    local idle, e = false, nil
    if old == false then
      idle = true
    elseif type(old) == 'string' then
      idle, e = peek(old, p, now_ms)
    end
    if not idle then return timed_busy(m, key, p, now_ms, injected, old) end
    if not injected and (e == nil or e < p.t_expiry) then
      redis.call('PEXPIREAT', key, p.t_expiry_text)
    end
    return p.t_remaining, p.t_reset, p.t_third, p.t_token, old
  end
end

-- Gives back what timed_take wrote (`old`: the value it replaced, false for none) and
-- answers as a check of what is left: remaining and reset.
local function timed_untake(m, key, p, now_ms, old)
  if old == false then
    redis.call('DEL', key)
  elseif old then
    redis.call('SET', key, old, 'KEEPTTL')
  end
  local s = false
  if old then
    s = timed_read(m, key, old, p, now_ms)
  elseif old == nil then
    -- Nothing was written (a check, or a cost no bucket admits): the stored state.
    s = timed_load(m, key, p, now_ms)
  end
  local _, remaining, reset = p.check(s, p, now_ms, 0)
  if remaining < 0 then return 0, reset end
  return remaining, reset
end
