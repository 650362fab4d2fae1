-- fixed_window.lua: the fixed-window model, mirroring src/algorithm/fixed_window.rs.
--
-- State (one Redis hash per counter): w = window start (seconds since the epoch),
-- c = hits counted in that window. Windows are aligned to the epoch, so every replica
-- and every shard agrees on the boundaries. The key names the counter, not the
-- window: a new window is detected by w and starts from zero.

local fixed_window = {}

function fixed_window.load(key)
  local h = redis.call('HMGET', key, 'w', 'c')
  return { w = tonumber(h[1]) or -1, c = tonumber(h[2]) or 0 }
end

-- Decide `cost` hits at `now_ms`. Returns the new state, and the decision:
-- allowed (bool), remaining, reset_ms, retry_ms (-1 = never), plus the state without
-- this operation (for reporting when the batch is vetoed).
function fixed_window.decide(state, now_ms, limit, window, cost)
  local now = math.floor(now_ms / 1000)
  local start = now - (now % window)
  local count = state.c
  if state.w ~= start then count = 0 end
  local reset_ms = (window - (now % window)) * 1000
  local after = count + cost
  if after <= limit then
    return { w = start, c = after }, true, limit - after, reset_ms, 0, limit - count
  end
  local retry_ms = -1
  if cost <= limit then retry_ms = reset_ms end
  return { w = start, c = count }, false, 0, reset_ms, retry_ms, 0
end

-- Persist with a TTL of the window's remainder: the key disappears when its window
-- ends, so an idle counter costs nothing.
function fixed_window.save(key, state, now_ms, window)
  local now = math.floor(now_ms / 1000)
  redis.call('HSET', key, 'w', state.w, 'c', state.c)
  redis.call('EXPIRE', key, window - (now % window))
end

-- Refund hits consumed in window `token` (its start), unless that window is over.
function fixed_window.refund(key, token, cost)
  local w = tonumber(redis.call('HGET', key, 'w'))
  if w == token then
    local c = tonumber(redis.call('HGET', key, 'c')) or 0
    local back = math.min(c, cost)
    if back > 0 then redis.call('HINCRBY', key, 'c', -back) end
  end
end

-- The refund token: what identifies the state this operation consumed from.
function fixed_window.token(state)
  return state.w
end
