-- gcra.lua: mirrors src/algorithm/gcra.rs.
-- State: one float, the theoretical arrival time (ms). T = W / L, tolerance B x T;
-- admit iff max(TAT, now) + n x T - now <= B x T. No key = TAT in the past.

local gcra = {}

function gcra.load(key)
  return tonumber(redis.call('GET', key)) or false
end

function gcra.decide(s, p, now_ms, cost)
  local t = p.window / p.limit
  local tau = p.burst * t
  local now = now_ms
  local tat = now
  if s then tat = max(s, now) end
  local new_tat = tat + cost * t
  local diff = new_tat - now
  if cost <= p.burst and diff <= tau + EPSILON then
    return new_tat, floor_u((tau - diff) / t + EPSILON), ceil_ms(diff), 0, 0
  end
  local retry = -1
  if cost <= p.burst then retry = ceil_ms(diff - tau) end
  return tat, -1, ceil_ms(tat - now), retry, 0
end

-- TTL: until TAT (then the key is as good as absent).
function gcra.save(key, s, p, now_ms, injected)
  set_with_ttl(key, f17(s), s - now_ms, injected)
end

function gcra.refund(key, p, token, cost)
  local tat = tonumber(redis.call('GET', key))
  if tat ~= nil then redis.call('SET', key, f17(tat - cost * (p.window / p.limit)), 'KEEPTTL') end
end

-- Charges and releases (src/algorithm/mode.rs): the arrival time may pass now + B x T
-- (a debt); a release moves it back, never before now.

local function gcra_add(tat, p, _, cost)
  return tat + cost * (p.window / p.limit)
end

local function gcra_sub(tat, p, now_ms, cost)
  return max(tat - cost * (p.window / p.limit), now_ms)
end

function gcra.charge(s, p, now_ms, cost)
  return charge_with(gcra.decide, gcra_add, s, p, now_ms, cost)
end

function gcra.release(s, p, now_ms, cost)
  return release_with(gcra.decide, gcra_sub, s, p, now_ms, cost)
end
