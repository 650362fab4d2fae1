-- gcra.lua: mirrors src/algorithm/gcra.rs.
-- State: one float, the theoretical arrival time (ms). T = W / L, tolerance B x T;
-- admit iff max(TAT, now) + n x T - now <= B x T. No key = TAT in the past. Stored as
-- 12 bytes, TAT (a double) and the key's expiry on the grid (a u32 of GRID steps;
-- timed.lua); 0.1 wrote TAT in decimal (13 bytes at least, so never 12), read until
-- its next write replaces it.

local gcra = {}

function gcra.pack(s, e)
  return struct.pack(PACKED, s, e / GRID)
end

function gcra.unpack(v)
  if #v ~= PACKED_LEN then return nil end
  local tat, k = struct.unpack(PACKED, v)
  return tat, k * GRID
end

function gcra.legacy(_, v)
  return tonumber(v) or false
end

function gcra.stops(s)
  return s
end

function gcra.peek(v, _, now_ms)
  if #v ~= PACKED_LEN then return nil end
  local tat, k = struct.unpack(PACKED, v)
  return tat <= now_ms, k * GRID
end

function gcra.load(key, p, now_ms)
  return timed_load(gcra, key, p, now_ms)
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

function gcra.save(key, s, p, _, injected)
  timed_save(gcra, key, s, p, injected)
end

function gcra.prepare(p, now_ms)
  timed_prepare(gcra, p, now_ms)
end


gcra.take = timed_taker(gcra)

function gcra.untake(key, p, _, now_ms, old)
  return timed_untake(gcra, key, p, now_ms, old)
end

-- As 0.1 wrote it: the time in decimal, its TTL until then.
function gcra.save_0_1(key, s, _, now_ms, injected)
  set_with_ttl(key, f17(s), s - now_ms, injected)
end

function gcra.refund(key, p, token, cost)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' then return end
  local tat, e = gcra.unpack(v)
  if tat == nil then
    tat = tonumber(v)
    if tat ~= nil then redis.call('SET', key, f17(tat - cost * (p.window / p.limit)), 'KEEPTTL') end
    return
  end
  redis.call('SET', key, gcra.pack(tat - cost * (p.window / p.limit), e), 'KEEPTTL')
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
