-- fixed_window.lua: mirrors src/algorithm/fixed_window.rs.
-- State: hash {w = window start (s since the epoch), c = hits in that window}. Windows
-- are aligned to the epoch so every replica and shard agrees on the boundaries; the
-- key names the counter, not the window, and a new window is detected by w.

local fixed_window = {}

function fixed_window.load(key)
  local h = redis.call('HMGET', key, 'w', 'c')
  return { w = tonumber(h[1]) or -1, c = tonumber(h[2]) or 0 }
end

function fixed_window.decide(s, p, now_ms, cost)
  local window = math.max(math.floor(p.window / 1000), 1)
  local now = math.floor(now_ms / 1000)
  local start = now - (now % window)
  local count = s.c
  if s.w ~= start then count = 0 end
  local reset_ms = (window - (now % window)) * 1000
  local after = count + cost
  if after <= p.limit then
    return { w = start, c = after }, true, p.limit - after, reset_ms, 0, 0
  end
  local retry = -1
  if cost <= p.limit then retry = reset_ms end
  return { w = start, c = count }, false, 0, reset_ms, retry, 0
end

function fixed_window.token(s) return s.w end

-- TTL: the rest of the window.
function fixed_window.save(key, s, p, now_ms, injected)
  redis.call('HSET', key, 'w', s.w, 'c', s.c)
  local window = math.max(math.floor(p.window / 1000), 1)
  pexpire(key, (s.w + window) * 1000 - now_ms, injected)
end

function fixed_window.refund(key, p, token, cost)
  local h = redis.call('HMGET', key, 'w', 'c')
  if tonumber(h[1]) == token then
    local back = math.min(tonumber(h[2]) or 0, cost)
    if back > 0 then redis.call('HINCRBY', key, 'c', -back) end
  end
end
