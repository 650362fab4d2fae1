-- leaky_bucket.lua: mirrors src/algorithm/leaky_bucket.rs.
-- State: one float, when the queue drains (the next free slot, ms). A queue of B
-- slots drained at L per W: an admitted request takes the next slot and waits for it
-- (the delay returned in microseconds); no room, or a wait beyond max_delay, denies.
-- Stored as gcra.lua stores its arrival time (12 bytes; timed.lua); 0.1 wrote it in
-- decimal, read until its next write replaces it.

local leaky_bucket = {}

function leaky_bucket.pack(s, e)
  return struct.pack(PACKED, s, e / GRID)
end

function leaky_bucket.unpack(v)
  if #v ~= PACKED_LEN then return nil end
  local tat, k = struct.unpack(PACKED, v)
  return tat, k * GRID
end

function leaky_bucket.legacy(_, v)
  return tonumber(v) or false
end

function leaky_bucket.stops(s)
  return s
end

function leaky_bucket.peek(v, _, now_ms)
  if #v ~= PACKED_LEN then return nil end
  local tat, k = struct.unpack(PACKED, v)
  return tat <= now_ms, k * GRID
end

function leaky_bucket.load(key, p, now_ms)
  return timed_load(leaky_bucket, key, p, now_ms)
end

function leaky_bucket.decide(s, p, now_ms, cost)
  local t = p.window / p.limit
  local now = now_ms
  local slot = now
  if s then slot = max(s, now) end
  local wait = slot - now
  local room = p.burst - wait / t
  local patient = (p.max_delay < 0) or (wait <= p.max_delay + EPSILON)
  if cost <= p.burst and cost <= room + EPSILON and patient then
    local tat = slot + cost * t
    local delay = 0
    if cost > 0 then delay = ceil_ms(wait * 1000) end
    -- The refund token is the drain time this operation left (in microseconds).
    return tat, floor_u(room - cost + EPSILON), ceil_ms(tat - now), delay, floor(tat * 1000)
  end
  local retry = -1
  if cost <= p.burst then
    local for_room = (cost - room) * t
    local for_patience = 0
    if p.max_delay >= 0 then for_patience = wait - p.max_delay end
    retry = ceil_ms(max(for_room, for_patience))
  end
  return slot, -1, ceil_ms(wait), retry, 0
end

function leaky_bucket.save(key, s, p, _, injected)
  timed_save(leaky_bucket, key, s, p, injected)
end

function leaky_bucket.prepare(p, now_ms)
  timed_prepare(leaky_bucket, p, now_ms)
end


leaky_bucket.take = timed_taker(leaky_bucket)

function leaky_bucket.untake(key, p, _, now_ms, old)
  return timed_untake(leaky_bucket, key, p, now_ms, old)
end

-- A slot is taken back only if no request queued behind it since (the drain time is
-- still the one this operation left): later requests were already spaced after it,
-- and moving the queue forward under them could release two closer than W / L.
-- As 0.1 wrote it: the time in decimal, its TTL until then.
function leaky_bucket.save_0_1(key, s, _, now_ms, injected)
  set_with_ttl(key, f17(s), s - now_ms, injected)
end

function leaky_bucket.refund(key, p, token, cost)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' then return end
  local tat, e = leaky_bucket.unpack(v)
  local legacy = tat == nil
  if legacy then tat = tonumber(v) end
  if tat == nil or floor(tat * 1000) ~= token then return end
  local back = tat - cost * (p.window / p.limit)
  if legacy then
    redis.call('SET', key, f17(back), 'KEEPTTL')
  else
    redis.call('SET', key, leaky_bucket.pack(back, e), 'KEEPTTL')
  end
end

-- Charges are refused at load and releases ignored (src/algorithm/leaky_bucket.rs says
-- why): a release is answered as a check and writes nothing.
function leaky_bucket.release(s, p, now_ms, cost)
  return release_with(leaky_bucket.decide, unchanged, s, p, now_ms, cost)
end
