-- RLQS: one stream's claim on one bucket's limit, and its share (src/rlqs/share.rs is
-- the Rust twin: the same steps in the same order, so a bucket divides the same way in
-- the memory ledger and here).
--
-- KEYS[1]  the bucket's ledger: a hash of "c:<stream>" -> "<demand>|<last seen ms>"
--          (demand "" when not known yet) and "born" -> when the ledger was made.
-- ARGV     stream, demand ("" unknown), tokens per window, stale after (ms), key TTL (ms)
-- Returns  {share in tokens, live claims, ledger age in ms}
--
-- One call reads and rewrites the whole bucket atomically: replicas reporting the same
-- bucket at once each see the other's claim or not, never half of it.

local key = KEYS[1]
local me, demand_arg = ARGV[1], ARGV[2]
local tokens = tonumber(ARGV[3])
local stale_ms, ttl_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
if tokens == nil or stale_ms == nil or ttl_ms == nil or me == nil or me == '' then
  return redis.error_reply('tollgate: malformed rlqs arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local flat = redis.call('HGETALL', key)
local born = nil
local claims = {}
local stale = {}
for i = 1, #flat, 2 do
  local field, value = flat[i], flat[i + 1]
  if field == 'born' then
    born = tonumber(value)
  elseif string.sub(field, 1, 2) == 'c:' then
    local stream = string.sub(field, 3)
    local bar = string.find(value, '|', 1, true)
    local d = string.sub(value, 1, bar - 1)
    local seen = tonumber(string.sub(value, bar + 1))
    if stream ~= me then
      if now - seen > stale_ms then
        stale[#stale + 1] = field
      else
        claims[#claims + 1] = { stream = stream, demand = tonumber(d) }
      end
    end
  end
end
if #stale > 0 then
  redis.call('HDEL', key, unpack(stale))
end
if born == nil then
  born = now
  redis.call('HSET', key, 'born', born)
end
claims[#claims + 1] = { stream = me, demand = tonumber(demand_arg) }
redis.call('HSET', key, 'c:' .. me, demand_arg .. '|' .. now)
redis.call('PEXPIRE', key, ttl_ms)

-- In stream order, as the Rust twin's BTreeMap holds them.
table.sort(claims, function(a, b) return a.stream < b.stream end)

-- Weights: known demand, the mean for unknown, at least FLOOR of the mean.
local FLOOR = 0.05
local known_sum, known = 0.0, 0
for _, c in ipairs(claims) do
  if c.demand ~= nil then
    known_sum = known_sum + c.demand
    known = known + 1
  end
end
local mean_known = 1.0
if known > 0 then mean_known = known_sum / known end
local weights = {}
local sum = 0.0
for i, c in ipairs(claims) do
  local w = c.demand
  if w == nil then w = mean_known end
  weights[i] = w
  sum = sum + w
end
if sum <= 0.0 then
  for i = 1, #claims do weights[i] = 1.0 end
else
  local floor = FLOOR * sum / #claims
  for i = 1, #claims do
    if weights[i] < floor then weights[i] = floor end
  end
end
local total = 0.0
for i = 1, #claims do total = total + weights[i] end

-- Whole tokens, the largest remainders taking what rounding down left.
local out, fractions, given = {}, {}, 0
for i = 1, #claims do
  local exact = tokens * weights[i] / total
  local whole = math.floor(exact)
  out[i] = whole
  given = given + whole
  fractions[i] = { frac = exact - whole, i = i }
end
table.sort(fractions, function(a, b)
  if a.frac ~= b.frac then return a.frac > b.frac end
  return claims[a.i].stream < claims[b.i].stream
end)
local left = tokens - given
for _, f in ipairs(fractions) do
  if left <= 0 then break end
  out[f.i] = out[f.i] + 1
  left = left - 1
end
local mine = 0
for i, c in ipairs(claims) do
  if c.stream == me then mine = math.max(out[i], 1) end
end
return { mine, #claims, now - born }
