-- concurrency.lua: mirrors src/algorithm/concurrency.rs (its header says why each
-- kind of lease keeps the limit).
-- Anonymous leases (no lease_key): a hash {expiry second (s since the epoch) = leases
-- expiring then}. Every acquisition, admitted or not, takes a lease of one window
-- (the lease time); a release gives back the earliest-expiring ones.
-- Named leases (the operation carries the request's id, p.lease): a sorted set, one
-- member per id, scored 2 x expiry ms (+1 once reused: no release frees it),
-- negative for a denied acquisition's marker (it holds no slot). A release removes
-- its own id's member unless reused; an acquisition of an id present is refused.
-- In this file a state is { l = anonymous leases {second, count}, oldest first,
-- named = {id = {expiry ms, holds, reused}}, by_id = whether the key is the set }.

local concurrency = {}

local function load_named(key)
  local named = {}
  local z = redis.pcall('ZRANGE', key, 0, -1, 'WITHSCORES')
  -- Another type at the key (not tollgate's) is no lease: save replaces it.
  if type(z) ~= 'table' or z.err then return named end
  for i = 1, #z, 2 do
    local score = tonumber(z[i + 1])
    local a = score
    if a < 0 then a = -a end
    local reused = a % 2
    named[z[i]] = { (a - reused) / 2, score > 0, reused == 1 }
  end
  return named
end

function concurrency.load(key, p, now_ms)
  if p.lease then return { l = {}, named = load_named(key), by_id = true } end
  local h = redis.call('HGETALL', key)
  local l = {}
  for i = 1, #h, 2 do
    l[#l + 1] = { tonumber(h[i]), tonumber(h[i + 1]) }
  end
  table.sort(l, function(a, b) return a[1] < b[1] end)
  return { l = l, named = {}, by_id = false }
end

-- The leases still held at now_ms, copied (a state is never modified), and how many
-- slots they hold.
local function held(s, now_ms)
  local l, named, n = {}, {}, 0
  for _, e in ipairs(s.l) do
    if e[1] * 1000 > now_ms then
      l[#l + 1] = { e[1], e[2] }
      n = n + e[2]
    end
  end
  for id, e in pairs(s.named) do
    if e[1] > now_ms then
      named[id] = { e[1], e[2], e[3] }
      if e[2] then n = n + 1 end
    end
  end
  return { l = l, named = named, by_id = s.by_id }, n
end

-- The expiries (ms) of the slots held, earliest first, each {at, count}.
local function slots(s)
  local out = {}
  for _, e in ipairs(s.l) do out[#out + 1] = { e[1] * 1000, e[2] } end
  for _, e in pairs(s.named) do
    if e[2] then out[#out + 1] = { e[1], 1 } end
  end
  table.sort(out, function(a, b) return a[1] < b[1] end)
  return out
end

local function reset_ms(s, now_ms)
  local t = slots(s)
  if #t == 0 then return 0 end
  return max(t[#t][1] - now_ms, 0)
end

-- A slot frees when the (n - L + 1)-th earliest slot's lease expires.
local function retry_ms(s, p, now_ms, n)
  local freed = 0
  for _, e in ipairs(slots(s)) do
    freed = freed + e[2]
    if freed > n - p.limit then return max(e[1] - now_ms, 0) end
  end
  return reset_ms(s, now_ms)
end

-- An anonymous acquisition (or a check, cost 0).
local function acquire(s, p, now_ms, cost)
  local admitted = s.n < p.limit
  if cost > 0 then
    local l = s.l
    local at = ceil((now_ms + p.window) / 1000)
    local i = #l
    while i > 0 and l[i][1] > at do i = i - 1 end
    if i > 0 and l[i][1] == at then
      l[i][2] = l[i][2] + cost
    else
      table.insert(l, i + 1, { at, cost })
    end
  end
  local reset = reset_ms(s, now_ms)
  if admitted then return max(p.limit - (s.n + cost), 0), reset, 0 end
  return -1, reset, retry_ms(s, p, now_ms, s.n)
end

-- A named acquisition: one slot whatever the cost.
local function acquire_named(s, p, now_ms)
  local expires = now_ms + p.window
  local lease = s.named[p.lease]
  if lease then
    lease[3] = true
    if expires > lease[1] then lease[1] = expires end
    return -1, reset_ms(s, now_ms), lease[1] - now_ms
  end
  local holds = s.n < p.limit
  s.named[p.lease] = { expires, holds, false }
  local reset = reset_ms(s, now_ms)
  if holds then return p.limit - s.n - 1, reset, 0 end
  return -1, reset, retry_ms(s, p, now_ms, s.n)
end

function concurrency.decide(s, p, now_ms, cost)
  local h, n = held(s, now_ms)
  h.n = n
  local remaining, reset, third
  if p.lease and cost > 0 then
    remaining, reset, third = acquire_named(h, p, now_ms)
  else
    remaining, reset, third = acquire(h, p, now_ms, cost)
  end
  h.n = nil
  return h, remaining, reset, third, 0
end

-- Gives back the earliest-expiring anonymous leases, never below none; or the named
-- lease of p.lease, unless reused.
function concurrency.release(s, p, now_ms, cost)
  local h, n = held(s, now_ms)
  if p.lease then
    local lease = h.named[p.lease]
    if lease and not lease[3] then
      h.named[p.lease] = nil
      if lease[2] then n = n - 1 end
    end
    return h, max(p.limit - n, 0), reset_ms(h, now_ms), 0, 0
  end
  local l = h.l
  local left = cost
  while left > 0 and #l > 0 do
    local first = l[1]
    local take = min(left, first[2])
    first[2] = first[2] - take
    left = left - take
    if first[2] == 0 then table.remove(l, 1) end
  end
  return h, max(p.limit - (n - (cost - left)), 0), reset_ms(h, now_ms), 0, 0
end

-- The whole state rewritten (expired leases go with it); TTL: until the last lease
-- or marker ends.
function concurrency.save(key, s, p, now_ms, injected)
  redis.call('DEL', key)
  local args, last = {}, 0
  if s.by_id then
    for id, e in pairs(s.named) do
      local score = 2 * e[1]
      if e[3] then score = score + 1 end
      if not e[2] then score = -score end
      args[#args + 1] = int(score)
      args[#args + 1] = id
      if e[1] > last then last = e[1] end
      if #args >= 1000 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    if #args > 0 then redis.call('ZADD', key, unpack(args)) end
  else
    local l = s.l
    if #l == 0 then return end
    for _, e in ipairs(l) do
      args[#args + 1] = int(e[1])
      args[#args + 1] = int(e[2])
    end
    redis.call('HSET', key, unpack(args))
    last = l[#l][1] * 1000
  end
  if last > 0 then pexpire(key, last - now_ms, injected) end
end

-- Never called: a lease is counted whatever the request's answer, so never refunded.
function concurrency.refund()
end
