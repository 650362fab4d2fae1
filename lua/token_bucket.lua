-- token_bucket.lua: mirrors src/algorithm/token_bucket.rs.
-- State: {t = tokens (float), a = when t was computed (ms)}. Refills at L per W up to
-- B; a request of cost n takes n tokens. No key = a full bucket. Stored as 20 bytes,
-- t and a (doubles) and the key's expiry on the grid (a u32 of GRID steps;
-- timed.lua); 0.1 kept a hash {t, a}, read until its next write replaces it.

local token_bucket = {}

function token_bucket.pack(s, e)
  return struct.pack(PACKED, s.t, s.a, e / GRID)
end

function token_bucket.unpack(v)
  if #v ~= PACKED_LEN then return nil end
  local t, a, k = struct.unpack(PACKED, v)
  return { t = t, a = a }, k * GRID
end

function token_bucket.legacy(key)
  local h = redis.pcall('HMGET', key, 't', 'a')
  if type(h) ~= 'table' or h.err or h[1] == false then return false end
  return { t = tonumber(h[1]), a = tonumber(h[2]) }
end

-- When the bucket is full again.
function token_bucket.stops(s, p)
  return s.a + ceil_ms((p.burst - s.t) / (p.limit / p.window))
end

function token_bucket.peek(v, p, now_ms)
  if #v ~= PACKED_LEN then return nil end
  local t, a, k = struct.unpack(PACKED, v)
  -- `decide`'s test, now >= a + ceil_ms(wait), without its calls: now - a is a whole
  -- number, which is at least ceil(wait) exactly when it is at least wait.
  local wait = (p.burst - t) / (p.limit / p.window)
  if wait > 0 then return now_ms - a >= wait, k * GRID end
  return now_ms >= a, k * GRID
end

function token_bucket.load(key, p, now_ms)
  return timed_load(token_bucket, key, p, now_ms)
end

function token_bucket.decide(s, p, now_ms, cost, _, reuse)
  local rate = p.limit / p.window
  local burst = p.burst
  local tokens, at = burst, now_ms
  if s then tokens, at = s.t, s.a end
  local elapsed = now_ms - at
  if elapsed < 0 then elapsed = 0 end
  -- Past the instant the bucket is due full, it is exactly full.
  local full_at = at + ceil_ms((burst - tokens) / rate)
  local available
  if now_ms >= full_at then available = burst else available = min(burst, tokens + elapsed * rate) end
  if cost <= p.burst and cost <= available + EPSILON then
    local left = available - cost
    local new = reuse
    if new then new.t, new.a = left, now_ms else new = { t = left, a = now_ms } end
    return new, floor_u(left + EPSILON), ceil_ms((burst - left) / rate), 0, 0
  end
  local retry = -1
  if cost <= p.burst then retry = ceil_ms((cost - available) / rate) end
  return { t = available, a = now_ms }, -1, ceil_ms((burst - available) / rate), retry, 0
end

function token_bucket.save(key, s, p, _, injected)
  timed_save(token_bucket, key, s, p, injected)
end

function token_bucket.prepare(p, now_ms)
  timed_prepare(token_bucket, p, now_ms)
end


token_bucket.take = timed_taker(token_bucket)

function token_bucket.untake(key, p, _, now_ms, old)
  return timed_untake(token_bucket, key, p, now_ms, old)
end

-- As 0.1 wrote it: a hash {t, a}, its TTL until the bucket is full.
function token_bucket.save_0_1(key, s, p, _, injected)
  redis.call('DEL', key)
  redis.call('HSET', key, 't', f17(s.t), 'a', int(s.a))
  pexpire(key, ceil_ms((p.burst - s.t) / (p.limit / p.window)), injected)
end

function token_bucket.refund(key, p, token, cost)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    local t = tonumber(redis.call('HGET', key, 't'))
    if t ~= nil then redis.call('HSET', key, 't', f17(min(p.burst, t + cost))) end
    return
  end
  if type(v) ~= 'string' then return end
  local s, e = token_bucket.unpack(v)
  if s == nil then return end
  s.t = min(p.burst, s.t + cost)
  redis.call('SET', key, token_bucket.pack(s, e), 'KEEPTTL')
end

-- Charges and releases (src/algorithm/mode.rs): tokens may go negative (a debt the
-- refill pays back); a release adds tokens up to the bucket's size.
local function tb_add(s, _, _, cost)
  return { t = s.t - cost, a = s.a }
end

local function tb_sub(s, p, _, cost)
  return { t = min(s.t + cost, p.burst), a = s.a }
end

function token_bucket.charge(s, p, now_ms, cost)
  return charge_with(token_bucket.decide, tb_add, s, p, now_ms, cost)
end

function token_bucket.release(s, p, now_ms, cost)
  return release_with(token_bucket.decide, tb_sub, s, p, now_ms, cost)
end
