-- RLQS: one bucket's claims in Redis (src/rlqs/claims/ and src/rlqs/share.rs are the
-- Rust twin: the same fields, the same integer steps in the same order, so a bucket
-- divides the same way in the memory ledger and here; tests/it/rlqs_lua.rs compares).
--
-- KEYS[1]  the bucket: a hash of running totals ("born", "w" weights of the live
--          claims, "kw" and "k" those with a known demand and their count, "l" live
--          claims, "a" tokens assigned, "s" live claims short of their share, "n" claim
--          records), one field per claim, "c:<name>" -> "owner weight known seen held
--          hold_until pend pend_until short since waiter waiter_seen last" (seen -1:
--          not live, last: the last report still; waiter "-": none), and one per client
--          id known to be shared, "x:<name>" -> until when (ms).
-- KEYS[2]  each claim's next deadline (a sorted set: claim name by time in ms).
-- ARGV     op ("claim" or "release"), name, alias, owner, weight ("" unknown),
--          resumed (0/1), tokens, stale_ms, hold_ms, grace_ms, key TTL ms
-- Returns  claim: {tokens granted, live claims, age of the bucket in ms, on alias 0/1,
--          short of the division's share 0/1}; release: 0
--
-- A call reads and writes the reporter's claim (and its alias), the totals and at most
-- EXPIRE_BATCH due deadlines: its cost does not grow with the bucket's claims.

local SCALE, FLOOR_PERCENT, HYSTERESIS_PERCENT, EXPIRE_BATCH = 1000000, 5, 5, 16

local key, due_key = KEYS[1], KEYS[2]
local op, name, alias, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local weight_arg, resumed, tokens = tonumber(ARGV[5]), ARGV[6] == '1', tonumber(ARGV[7])
local stale_ms, hold_ms, grace_ms = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local key_ttl = tonumber(ARGV[11])
if (op ~= 'claim' and op ~= 'release') or not name or name == '' or not alias
    or alias == '' or not owner or owner == '' or not tokens or not stale_ms
    or not hold_ms or not grace_ms or not key_ttl then
  return redis.error_reply('tollgate: malformed rlqs arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- a // b for integers below 2^53, exact (a float quotient can round up to the next one).
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end

local f = redis.call('HMGET', key, 'born', 'w', 'kw', 'k', 'l', 'a', 's', 'n')
local born = tonumber(f[1]) or now
local T = {
  weights = tonumber(f[2]) or 0, known_weights = tonumber(f[3]) or 0,
  known = tonumber(f[4]) or 0, live = tonumber(f[5]) or 0,
  assigned = tonumber(f[6]) or 0, short = tonumber(f[7]) or 0, records = tonumber(f[8]) or 0,
}

-- Claims as they are read (once each) and as this call leaves them.
local work, stored = {}, {}
local function get(n)
  if stored[n] == nil then
    local v = redis.call('HGET', key, 'c:' .. n)
    stored[n] = false
    if v then
      local o, w, k, s, h, hu, p, pu, sh, si, wt, ws, l = string.match(v, '^(%S+) (%d+) '
        .. '([01]) (%-?%d+) (%d+) (%d+) (%d+) (%d+) ([01]) (%d+) (%S+) (%d+) (%d+)$')
      stored[n] = true
      local seen = tonumber(s)
      if seen < 0 then seen = nil end
      work[n] = { owner = o, weight = tonumber(w), known = k == '1', seen = seen,
        held = tonumber(h), hold_until = tonumber(hu), pend = tonumber(p),
        pend_until = tonumber(pu), short = sh == '1', since = tonumber(si),
        waiter = nil, waiter_seen = tonumber(ws), last = tonumber(l) }
      if wt ~= '-' then work[n].waiter = wt end
    end
  end
  return work[n]
end
-- A claim put back, or dropped at once when nothing is left of it (not live, nothing
-- held): claims/mod.rs `put`.
local touched = {}
local function set(n, c)
  get(n)
  if c and c.seen == nil and c.held == 0 and c.pend == 0 then c = nil end
  work[n] = c
  touched[#touched + 1] = n
end
local function new_claim(o)
  return { owner = o, weight = 0, known = false, seen = nil, held = 0, hold_until = 0,
    pend = 0, pend_until = 0, short = false, since = now, waiter = nil, waiter_seen = 0,
    last = 0 }
end

-- The claim is now this owner's (claims/mod.rs `pass_to`).
local function pass_to(c)
  if c.owner ~= owner then
    c.owner = owner
    c.since = now
    c.waiter = nil
  end
end

-- The claim's weight (and shortness) out of the totals (it stops being live), and its
-- weight into them.
local function leave(c)
  if c.seen ~= nil then
    c.seen = nil
    if c.short then
      c.short = false
      T.short = T.short - 1
    end
    T.weights = T.weights - c.weight
    T.live = T.live - 1
    if c.known then
      T.known_weights = T.known_weights - c.weight
      T.known = T.known - 1
    end
  end
end
local function join(c)
  T.weights = T.weights + c.weight
  T.live = T.live + 1
  if c.known then
    T.known_weights = T.known_weights + c.weight
    T.known = T.known + 1
  end
end

local function expire()
  local due = redis.call('ZRANGEBYSCORE', due_key, '-inf', now, 'LIMIT', 0, EXPIRE_BATCH)
  for _, n in ipairs(due) do
    local c = get(n)
    if c then
      if c.seen ~= nil and c.seen + stale_ms <= now then leave(c) end
      if c.pend > 0 and c.pend_until <= now then
        T.assigned = T.assigned - c.pend
        c.pend = 0
      end
      if c.held > 0 and c.hold_until <= now then
        T.assigned = T.assigned - c.held
        c.held = 0
      end
      set(n, c)
    end
  end
end

-- Whether the report goes on the alias, marking the id shared when the report shows it
-- is (claims/names.rs `choose`).
local function choose()
  if alias == name then return false end
  local a = get(alias)
  local c = get(name)
  if c == nil or c.owner == owner then return false end
  local renewed = a ~= nil and a.owner == owner and math.max(c.since, c.last) > a.since
  local other_waiter = c.waiter ~= nil and c.waiter ~= owner and now - c.waiter_seen < stale_ms
  if not resumed or renewed or other_waiter then
    redis.call('HSET', key, 'x:' .. name, string.format('%d', now + hold_ms + stale_ms))
    return true
  end
  c.waiter, c.waiter_seen = owner, now
  set(name, c)
  local shared = tonumber(redis.call('HGET', key, 'x:' .. name))
  return (c.seen ~= nil and now - c.seen < stale_ms) or (shared ~= nil and now < shared)
end

-- The alias claim of this owner into the name's claim (claims/names.rs `merge`).
local function merge()
  local from = get(alias)
  if not from or from.owner ~= owner then return end
  leave(from)
  set(alias, nil)
  local into = get(name) or new_claim(owner)
  pass_to(into)
  into.held = into.held + from.held
  into.hold_until = math.max(into.hold_until, from.hold_until)
  into.pend = into.pend + from.pend
  into.pend_until = math.max(into.pend_until, from.pend_until)
  set(name, into)
end

-- share.rs: target, desired, grant; the target rounded down.
local function share(c)
  local num, den = tokens * c.weight, T.weights
  if T.weights == 0 then num, den = tokens, math.max(T.live, 1) end
  local lo = idiv(num, den)
  local hi = lo
  if num - lo * den > 0 then hi = lo + 1 end
  local h = c.held
  local free = math.max(tokens - T.assigned, 0)
  local function near(apart) return 100 * apart <= HYSTERESIS_PERCENT * h end
  local desired = hi
  if h > 0 and h < lo and near(lo - h) then
    desired = h
  elseif T.short > 0 then
    desired = lo
  elseif h > 0 and h >= lo and h <= hi then
    if free >= hi - h then desired = hi else desired = h end
  elseif h > hi and near(h - hi) then
    desired = h
  end
  return math.min(desired, math.max(tokens + h - T.assigned, 0)), desired, lo
end

local function claim()
  local on_alias = choose()
  local k = name
  if on_alias then k = alias end
  if not on_alias and alias ~= name then merge() end
  local c = get(k) or new_claim(owner)
  pass_to(c)
  leave(c)
  local w = weight_arg
  if w == nil then
    if T.known > 0 then w = idiv(T.known_weights, T.known) else w = SCALE end
  end
  if T.live > 0 then w = math.max(w, idiv(T.weights * FLOOR_PERCENT, 100 * T.live)) end
  c.weight, c.known, c.seen, c.last = w, weight_arg ~= nil, now, now
  join(c)
  local granted, desired, lo = share(c)
  c.short = granted < lo
  if c.short then T.short = T.short + 1 end
  if granted < c.held then
    c.pend = c.pend + c.held - granted
    c.pend_until = math.max(c.pend_until, now + grace_ms)
  else
    T.assigned = T.assigned + granted - c.held
  end
  c.held = granted
  if granted > 0 then c.hold_until = now + hold_ms end
  set(k, c)
  local flag, short = 0, 0
  if on_alias then flag = 1 end
  if granted < desired then short = 1 end
  return { granted, T.live, now - born, flag, short }
end

local function release()
  local keys = { name }
  if alias ~= name then keys[2] = alias end
  for _, n in ipairs(keys) do
    local c = get(n)
    if c then
      if c.owner == owner then leave(c) end
      set(n, c)
    end
  end
  return 0
end

-- Writes every touched claim (or drops it when it has no deadline left: not live,
-- nothing held) and the totals, in one HSET.
local function flush()
  local done, sets = {}, {}
  for _, n in ipairs(touched) do
    if not done[n] then
      done[n] = true
      local c = work[n]
      local due = nil
      if c then
        if c.seen ~= nil then due = c.seen + stale_ms end
        if c.held > 0 and (due == nil or c.hold_until < due) then due = c.hold_until end
        if c.pend > 0 and (due == nil or c.pend_until < due) then due = c.pend_until end
      end
      if due == nil then
        if stored[n] then
          redis.call('HDEL', key, 'c:' .. n)
          redis.call('ZREM', due_key, n)
          T.records = T.records - 1
        end
      else
        local seen = c.seen or -1
        local known, short = '0', '0'
        if c.known then known = '1' end
        if c.short then short = '1' end
        sets[#sets + 1] = 'c:' .. n
        sets[#sets + 1] = string.format('%s %d %s %d %d %d %d %d %s %d %s %d %d', c.owner,
          c.weight, known, seen, c.held, c.hold_until, c.pend, c.pend_until, short, c.since,
          c.waiter or '-', c.waiter_seen, c.last)
        redis.call('ZADD', due_key, due, n)
        if not stored[n] then T.records = T.records + 1 end
      end
      stored[n] = due ~= nil
    end
  end
  if T.records == 0 then
    redis.call('DEL', key, due_key)
    return
  end
  local totals = { 'born', born, 'w', T.weights, 'kw', T.known_weights, 'k', T.known,
    'l', T.live, 'a', T.assigned, 's', T.short, 'n', T.records }
  for i = 2, #totals, 2 do
    sets[#sets + 1] = totals[i - 1]
    sets[#sets + 1] = string.format('%d', totals[i])
  end
  redis.call('HSET', key, unpack(sets))
  redis.call('PEXPIRE', key, key_ttl)
  redis.call('PEXPIRE', due_key, key_ttl)
end

expire()
local result
if op == 'claim' then result = claim() else result = release() end
flush()
return result
