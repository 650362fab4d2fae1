-- sliding_window.lua: mirrors src/algorithm/sliding_window.rs.
-- State: hash {s = current window start (ms), p = previous window's hits, c = this
-- window's}. estimate = p x (W - elapsed) / W + c; admit iff estimate + cost <= L.

local sliding_window = {}

-- The window's start depends only on the spec and the call's one clock: it is computed
-- once per call and kept in the spec's table (p), which lives as long, with the start
-- as Redis stores it.
-- With a time_zone, the window is the calendar period common.lua's `calendar` chose:
-- its length, the next one's, and the start before it (else `start - window`).
local function current(p, now_ms)
  if p.cal_start then
    local start = p.cal_start
    p.sw_start, p.sw_text, p.sw_prev = start, int(start), p.cal_prev
    p.sw_window, p.sw_next = p.cal_end - start, p.cal_next_end - p.cal_end
    p.sw_ttl_at = p.cal_next_end
    return start
  end
  local start = now_ms - (now_ms % p.window)
  p.sw_start, p.sw_text, p.sw_window, p.sw_next = start, int(start), p.window, p.window
  p.sw_ttl_at = start + 2 * p.window
  return start
end

-- A counter of the current window, the common case, has the start as its s: read
-- without tonumber.
function sliding_window.load(key, p, now_ms)
  local h = redis.call('HMGET', key, 's', 'p', 'c')
  local start = p.sw_start or current(p, now_ms)
  local s = h[1]
  if s == p.sw_text then s = start else s = tonumber(s) or -1 end
  return { start = s, prev = tonumber(h[2]) or 0, curr = tonumber(h[3]) or 0 }
end

function sliding_window.decide(s, p, now_ms, cost, _, reuse)
  local start = p.sw_start or current(p, now_ms)
  local window, next_window, prev_start = p.sw_window, p.sw_next, p.sw_prev
  local prev, curr = 0, 0
  if s.start == start then
    prev, curr = s.prev, s.curr
  elseif (prev_start == nil and s.start + window == start) or s.start == prev_start then
    prev, curr = s.curr, 0
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
    local at = window * (1 - (need - curr) / prev)
    retry = ceil_ms(at - elapsed)
  else
    local at = 0
    if curr > need then at = next_window * (1 - need / curr) end
    retry = reset_ms + ceil_ms(at)
  end
  return st, -1, reset_ms, retry, 0
end

-- TTL: two windows from the current one's start (then neither count matters), an
-- instant fixed by the start: a key stored in the same window already has it.
-- In the same window only c changes (p is the window before's, s its start), but
-- for a release, which may take from p too.
function sliding_window.save(key, s, p, now_ms, injected, _, stored)
  if stored.start == s.start and stored.prev == s.prev then
    redis.call('HSET', key, 'c', int(s.curr))
    return
  end
  redis.call('HSET', key, 's', int(s.start), 'p', int(s.prev), 'c', int(s.curr))
  pexpire(key, p.sw_ttl_at - now_ms, injected)
end

function sliding_window.refund(key, p, token, cost)
  local h = redis.call('HMGET', key, 's', 'p', 'c')
  local start = tonumber(h[1])
  local after
  if p.cal_bounds then after = calendar_after(p, token) else after = token + p.window end
  if start == token then
    local back = min(tonumber(h[3]) or 0, cost)
    if back > 0 then redis.call('HINCRBY', key, 'c', -back) end
  elseif after ~= nil and start == after then
    local back = min(tonumber(h[2]) or 0, cost)
    if back > 0 then redis.call('HINCRBY', key, 'p', -back) end
  end
end

-- Charges and releases (src/algorithm/mode.rs): this window's count; a release takes
-- from this window first, then from the previous one.

local function sw_add(s, _, _, cost)
  return { start = s.start, prev = s.prev, curr = s.curr + cost }
end

local function sw_sub(s, _, _, cost)
  local from_curr = min(s.curr, cost)
  local from_prev = min(s.prev, cost - from_curr)
  return { start = s.start, prev = s.prev - from_prev, curr = s.curr - from_curr }
end

function sliding_window.charge(s, p, now_ms, cost)
  return charge_with(sliding_window.decide, sw_add, s, p, now_ms, cost)
end

function sliding_window.release(s, p, now_ms, cost)
  return release_with(sliding_window.decide, sw_sub, s, p, now_ms, cost)
end
