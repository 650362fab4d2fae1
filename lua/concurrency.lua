-- concurrency.lua: mirrors src/algorithm/concurrency.rs.
-- State: hash {expiry second (s since the epoch) = leases expiring then}. Every
-- acquisition, admitted or not, takes a lease of one window (the lease time); a
-- release gives back the latest-expiring ones (src/algorithm/concurrency.rs says why);
-- expired ones are dropped.
-- In this file a state is { l = array of {second, count}, oldest first }.

local concurrency = {}
concurrency.charges, concurrency.releases, concurrency.counts_denials = false, true, true

function concurrency.load(key, p, now_ms)
  local h = redis.call('HGETALL', key)
  local l = {}
  for i = 1, #h, 2 do
    l[#l + 1] = { tonumber(h[i]), tonumber(h[i + 1]) }
  end
  table.sort(l, function(a, b) return a[1] < b[1] end)
  return { l = l }
end

-- The leases still held at now_ms, copied (a state is never modified), and how many.
local function held(s, now_ms)
  local l, n = {}, 0
  for _, e in ipairs(s.l) do
    if e[1] * 1000 > now_ms then
      l[#l + 1] = { e[1], e[2] }
      n = n + e[2]
    end
  end
  return l, n
end

local function reset_ms(l, now_ms)
  if #l == 0 then return 0 end
  return max(l[#l][1] * 1000 - now_ms, 0)
end

function concurrency.decide(s, p, now_ms, cost)
  local l, n = held(s, now_ms)
  local admitted = n < p.limit
  if cost > 0 then
    local at = ceil((now_ms + p.window) / 1000)
    local i = #l
    while i > 0 and l[i][1] > at do i = i - 1 end
    if i > 0 and l[i][1] == at then
      l[i][2] = l[i][2] + cost
    else
      table.insert(l, i + 1, { at, cost })
    end
  end
  local reset = reset_ms(l, now_ms)
  if admitted then
    return { l = l }, max(p.limit - (n + cost), 0), reset, 0, 0
  end
  -- A slot frees when the (n - L + 1)-th earliest lease expires.
  local freed, retry = 0, reset
  for _, e in ipairs(l) do
    freed = freed + e[2]
    if freed > n - p.limit then
      retry = max(e[1] * 1000 - now_ms, 0)
      break
    end
  end
  return { l = l }, -1, reset, retry, 0
end

-- Gives back the latest-expiring leases, never below none.
function concurrency.release(s, p, now_ms, cost)
  local l, n = held(s, now_ms)
  local left = cost
  while left > 0 and #l > 0 do
    local last = l[#l]
    local take = min(left, last[2])
    last[2] = last[2] - take
    left = left - take
    if last[2] == 0 then l[#l] = nil end
  end
  return { l = l }, max(p.limit - (n - (cost - left)), 0), reset_ms(l, now_ms), 0, 0
end

-- The whole hash rewritten (expired seconds go with it); TTL: until the last lease ends.
function concurrency.save(key, s, p, now_ms, injected)
  redis.call('DEL', key)
  local l = s.l
  if #l == 0 then return end
  local args = {}
  for _, e in ipairs(l) do
    args[#args + 1] = int(e[1])
    args[#args + 1] = int(e[2])
  end
  redis.call('HSET', key, unpack(args))
  pexpire(key, l[#l][1] * 1000 - now_ms, injected)
end

-- Never called: a lease is counted whatever the request's answer, so never refunded.
function concurrency.refund()
end
