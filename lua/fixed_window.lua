-- fixed_window.lua: mirrors src/algorithm/fixed_window.rs.
-- State: hash {w = window start (s since the epoch), c = hits in that window}. Windows
-- are aligned to the epoch so every replica and shard agrees on the boundaries; the
-- key names the counter, not the window, and a new window is detected by w.

local fixed_window = {}

function fixed_window.load(key)
  local h = redis.call('HMGET', key, 'w', 'c')
  return { w = tonumber(h[1]) or -1, c = tonumber(h[2]) or 0 }
end

-- The window's start and reset depend only on the spec and the call's one clock: they
-- are computed once per call and kept in the spec's table (p), which lives as long.
function fixed_window.decide(s, p, now_ms, cost, _, reuse)
  local start, reset_ms = p.fw_start, p.fw_reset
  if start == nil then
    local window = max(floor(p.window / 1000), 1)
    local now = floor(now_ms / 1000)
    start = now - (now % window)
    reset_ms = (window - (now % window)) * 1000
    p.fw_start, p.fw_reset = start, reset_ms
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
-- window already has it (HSET keeps a TTL), so only a new window sets it.
function fixed_window.save(key, s, p, now_ms, injected, _, stored)
  redis.call('HSET', key, 'w', int(s.w), 'c', int(s.c))
  if stored.w ~= s.w then
    local window = max(floor(p.window / 1000), 1)
    pexpire(key, (s.w + window) * 1000 - now_ms, injected)
  end
end

function fixed_window.refund(key, p, token, cost)
  local h = redis.call('HMGET', key, 'w', 'c')
  if tonumber(h[1]) == token then
    local back = min(tonumber(h[2]) or 0, cost)
    if back > 0 then redis.call('HINCRBY', key, 'c', -back) end
  end
end
