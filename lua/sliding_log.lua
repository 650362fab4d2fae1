-- sliding_log.lua: mirrors src/algorithm/sliding_log.rs.
-- State: a sorted set, one member per admitted hit, scored by its time (ms). Members
-- are "<base>:<j>" for j = 1..cost, with base the shard's clock in microseconds made
-- unique per key, so no two hits ever share a member (ZADD would merge them) and a
-- refund removes exactly the hits it gave.

local sliding_log = {}

-- Trims hits that left the window (scores <= now - W) before counting.
function sliding_log.load(key, p, now_ms)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms - p.window)
  local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local hits = {}
  for i = 2, #raw, 2 do hits[#hits + 1] = tonumber(raw[i]) end
  return { hits = hits, pending = {} }
end

local function reset_ms(hits, window, now_ms)
  if #hits == 0 then return 0 end
  return hits[1] + window - now_ms
end

function sliding_log.decide(s, p, now_ms, cost, op)
  local hits = s.hits
  local count = #hits
  if cost > p.limit then return s, false, 0, reset_ms(hits, p.window, now_ms), -1, 0 end
  if count + cost <= p.limit then
    local after = { hits = {}, pending = {} }
    for i = 1, count do after.hits[i] = hits[i] end
    for _ = 1, cost do after.hits[#after.hits + 1] = now_ms end
    for i = 1, #s.pending do after.pending[i] = s.pending[i] end
    if cost > 0 then after.pending[#after.pending + 1] = { op = op, n = cost } end
    return after, true, p.limit - count - cost, reset_ms(after.hits, p.window, now_ms), 0, 0
  end
  local must_leave = count + cost - p.limit
  return s, false, 0, reset_ms(hits, p.window, now_ms), hits[must_leave] + p.window - now_ms, 0
end

function sliding_log.token(s) return 0 end

-- Adds the pending hits; returns {op index = base} as refund tokens. TTL: one window
-- (the newest hit is now).
function sliding_log.save(key, s, p, now_ms, injected, now_us)
  local tokens = {}
  local base = now_us
  for _, group in ipairs(s.pending) do
    while redis.call('ZSCORE', key, string.format('%.0f:1', base)) do base = base + 1 end
    local args = {}
    for j = 1, group.n do
      args[#args + 1] = now_ms
      args[#args + 1] = string.format('%.0f:%d', base, j)
      if #args >= 1000 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    if #args > 0 then redis.call('ZADD', key, unpack(args)) end
    tokens[group.op] = base
    base = base + 1
  end
  pexpire(key, p.window, injected)
  return tokens
end

function sliding_log.refund(key, p, token, cost)
  local members = {}
  for j = 1, cost do
    members[#members + 1] = string.format('%.0f:%d', token, j)
    if #members >= 1000 then
      redis.call('ZREM', key, unpack(members))
      members = {}
    end
  end
  if #members > 0 then redis.call('ZREM', key, unpack(members)) end
end
