-- sliding_log.lua: mirrors src/algorithm/sliding_log.rs.
-- State: a sorted set, one member per admitted hit, scored by its time (ms). Members
-- are "<base>:<j>" for j = 1..cost, with base the shard's clock in microseconds made
-- unique per key, so no two hits ever share a member (ZADD would merge them) and a
-- refund removes exactly the hits it gave.
--
-- The model keeps the whole log; a decision needs only its length, its oldest hit
-- (the reset) and, when denied, the hit that must leave first (the retry). So the
-- state here is the stored count after the trim, hits read one by one by rank when
-- needed (a sorted set is ordered by time), and the hits added during this call, all
-- at now and so after every stored one: a call costs a few commands, not the log.

local sliding_log = {}

-- Trims hits that left the window (scores <= now - W) before counting.
function sliding_log.load(key, p, now_ms)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now_ms - p.window))
  local n = redis.call('ZCARD', key)
  -- ranks: the stored hits read so far, shared by every state of this call (the
  -- stored log does not change until the call's end).
  return { key = key, n = n, ranks = {}, added = 0, pending = false }
end

-- The k-th oldest hit (from 1) of s.
local function hit(s, k, now_ms)
  if k > s.n then return now_ms end
  local t = s.ranks[k]
  if t == nil then
    t = tonumber(redis.call('ZRANGE', s.key, k - 1, k - 1, 'WITHSCORES')[2])
    s.ranks[k] = t
  end
  return t
end

local function reset_ms(s, window, now_ms)
  if s.n + s.added == 0 then return 0 end
  return hit(s, 1, now_ms) + window - now_ms
end

-- at: the decision's number in the call, whose refund token save writes (the hits'
-- member names are chosen there).
function sliding_log.decide(s, p, now_ms, cost, at, reuse)
  local count = s.n + s.added
  if cost > p.limit then return s, -1, reset_ms(s, p.window, now_ms), -1, 0 end
  if count + cost <= p.limit then
    local after, token = s, 0
    if cost > 0 then
      token = nil
      -- pending: this call's admitted groups, newest first, shared with s.
      local added, pending = s.added + cost, { at = at, n = cost, older = s.pending }
      if reuse then
        after = reuse
        after.added, after.pending = added, pending
      else
        after = { key = s.key, n = s.n, ranks = s.ranks, added = added, pending = pending }
      end
    end
    return after, p.limit - count - cost, reset_ms(after, p.window, now_ms), 0, token
  end
  local must_leave = count + cost - p.limit
  return s, -1, reset_ms(s, p.window, now_ms), hit(s, must_leave, now_ms) + p.window - now_ms, 0
end

-- Adds the pending hits in one ZADD and writes each group's base, its refund token,
-- into the reply (`late`: the engine's late_token). TTL: one window (the newest hit
-- is now).
function sliding_log.save(key, s, p, now_ms, injected, now_us, _, late)
  local args = {}
  local score = int(now_ms)
  local base = now_us
  local group = s.pending
  while group do
    while redis.call('ZSCORE', key, string.format('%.0f:1', base)) do base = base + 1 end
    for j = 1, group.n do
      args[#args + 1] = score
      args[#args + 1] = string.format('%.0f:%d', base, j)
      if #args >= 1000 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    late(group.at, base)
    base = base + 1
    group = group.older
  end
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
  pexpire(key, p.window, injected)
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

-- Charges are refused at load and releases ignored (src/algorithm/sliding_log.rs says
-- why): a release is answered as a check and writes nothing.

function sliding_log.release(s, p, now_ms, cost)
  return release_with(sliding_log.decide, unchanged, s, p, now_ms, cost)
end
