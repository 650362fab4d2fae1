-- fixed_window.lua: mirrors src/algorithm/fixed_window.rs.
-- State: hash {w = window start (s since the epoch), c = hits in that window}. Windows
-- are aligned to the epoch so every replica and shard agrees on the boundaries; the
-- key names the counter, not the window, and a new window is detected by w.

local fixed_window = {}

-- The window's start and reset depend only on the spec and the call's one clock: they
-- are computed once per call and kept in the spec's table (p), which lives as long,
-- with the start as Redis stores it.
-- With a time_zone, the window is the calendar period common.lua's `calendar` chose.
local function current(p, now_ms)
  if p.cal_start then
    local now, start = floor(p.cal_now / 1000), floor(p.cal_start / 1000)
    p.fw_start, p.fw_reset = start, (floor(p.cal_end / 1000) - now) * 1000
    p.fw_text, p.fw_end = int(start), p.cal_end
    return start
  end
  local window = max(floor(p.window / 1000), 1)
  local now = floor(now_ms / 1000)
  local start = now - (now % window)
  p.fw_start, p.fw_reset, p.fw_text = start, (window - (now % window)) * 1000, int(start)
  p.fw_end = (start + window) * 1000
  return start
end

-- A counter of the current window, the common case, has the start as its w: read
-- without tonumber.
function fixed_window.load(key, p, now_ms)
  local h = redis.call('HMGET', key, 'w', 'c')
  local start = p.fw_start or current(p, now_ms)
  local w = h[1]
  if w == p.fw_text then w = start else w = tonumber(w) or -1 end
  return { w = w, c = tonumber(h[2]) or 0 }
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

-- TTL: the rest of the window, an instant fixed by w: a key stored in the same
-- window already has it (HSET keeps a TTL), and its w, so only a new window sets them.
function fixed_window.save(key, s, p, now_ms, injected, _, stored)
  if stored.w == s.w then
    redis.call('HSET', key, 'c', int(s.c))
    return
  end
  redis.call('HSET', key, 'w', int(s.w), 'c', int(s.c))
  -- s.w is this call's window (decide wrote it), whose end current() kept.
  pexpire(key, p.fw_end - now_ms, injected)
end

function fixed_window.refund(key, p, token, cost)
  local h = redis.call('HMGET', key, 'w', 'c')
  if tonumber(h[1]) == token then
    local back = min(tonumber(h[2]) or 0, cost)
    if back > 0 then redis.call('HINCRBY', key, 'c', -back) end
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
