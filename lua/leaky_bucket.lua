-- leaky_bucket.lua: mirrors src/algorithm/leaky_bucket.rs.
-- State: one float, when the queue drains (the next free slot, ms). A queue of B
-- slots drained at L per W: an admitted request takes the next slot and waits for it
-- (the delay returned in microseconds); no room, or a wait beyond max_delay, denies.

local leaky_bucket = {}

function leaky_bucket.load(key)
  return tonumber(redis.call('GET', key)) or false
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

-- TTL: until the queue is drained.
function leaky_bucket.save(key, s, p, now_ms, injected)
  set_with_ttl(key, f17(s), s - now_ms, injected)
end

-- A slot is taken back only if no request queued behind it since (the drain time is
-- still the one this operation left): later requests were already spaced after it,
-- and moving the queue forward under them could release two closer than W / L.
function leaky_bucket.refund(key, p, token, cost)
  local tat = tonumber(redis.call('GET', key))
  if tat ~= nil and floor(tat * 1000) == token then
    redis.call('SET', key, f17(tat - cost * (p.window / p.limit)), 'KEEPTTL')
  end
end

-- Charges are refused at load and releases ignored (src/algorithm/leaky_bucket.rs says
-- why): a release is answered as a check and writes nothing.

function leaky_bucket.release(s, p, now_ms, cost)
  return release_with(leaky_bucket.decide, unchanged, s, p, now_ms, cost)
end
