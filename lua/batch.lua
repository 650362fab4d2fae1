-- batch.lua: decide the counter operations of one or more requests ("segments") on
-- one hash slot (or one standalone server), atomically, each request all or nothing.
--
-- KEYS[i]   the counter of operation i, all segments' operations in order. On a
--           cluster every key shares one hash tag, so the call routes by KEYS[1].
-- ARGV[1]   "" to read the server's clock (TIME); a number of milliseconds only in
--           tests, which inject time (production never sends one).
-- ARGV[2]   S, the number of segments.
-- ARGV      then 2 values per segment s, at 2 + 2*(s-1) + 1 ..: its operation count,
--           and "1" for a dry run (decide, write nothing: the request is already
--           denied elsewhere, only true statuses are wanted) else "0".
-- ARGV      then 2 values per operation i, at 2 + 2*S + 2*(i-1) + 1 ..:
--             its spec "id:limit:window ms:burst:max delay ms (-1 = none):vetoes (1/0)"
--             and its cost. The id indexes `algorithms`, which is not in this file:
--             scripts.rs generates it from the Rust list (src/algorithm/mod.rs) and
--             puts it before this entry point.
-- Returns   6 integers per operation, in order:
--             allowed (1/0), remaining, reset ms, retry ms (-1 = never),
--             delay us (leaky bucket), refund token
--
-- Why atomic: a script runs alone on its server, so no other client's operation can
-- land between the checks and the writes. The clock is read once, inside, so all
-- replicas of tollgate agree on windows. Within a segment every operation is decided
-- first (in order, each seeing the tentative state left by earlier ones on the same
-- key); only if no vetoing operation was denied does the segment commit: all or
-- nothing. Segments run one after the other and each sees what the previous ones
-- committed, so a call carrying S requests decides exactly as S calls in that order
-- would. tollgate puts concurrent requests into one call to share the per-call cost
-- of EVALSHA.
--
-- Why the shape: this runs once per decision under load, so its cost per operation is
-- the service's cost in Redis. A counter is read from Redis once per call and its
-- final state written once, at the end (every segment in between works on the state
-- kept here); a spec is parsed once per call (the rules of one call repeat) into the
-- one table its operations share; an operation allocates nothing but its new state.

local REPLY = 6
local out = {}

local now_ms, now_us
local injected = ARGV[1] ~= ''
if injected then
  now_ms = tonumber(ARGV[1])
  now_us = now_ms * 1000
else
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  now_ms = math.floor(now_us / 1000)
end

local segments = tonumber(ARGV[2])
local OPS = 2 + 2 * segments

-- Parsed specs by their text: Lua interns strings, so a repeated spec is one lookup.
local specs = {}
local function parse(text)
  local id, limit, window, burst, max_delay, vetoes =
    string.match(text, '^(%d+):(%d+):(%d+):(%d+):(%-?%d+):([01])$')
  local algo = algorithms[tonumber(id)]
  if algo == nil then return nil end
  local p = {
    algo = algo, limit = tonumber(limit), window = tonumber(window), burst = tonumber(burst),
    max_delay = tonumber(max_delay), vetoes = vetoes == '1',
  }
  specs[text] = p
  return p
end

-- Every spec is checked before anything is decided, so a malformed call fails whole.
for i = 1, #KEYS do
  local text = ARGV[OPS + 2 * i - 1]
  if specs[text] == nil and parse(text or '') == nil then
    return redis.error_reply('tollgate: malformed operation spec ' .. tostring(text))
  end
end

-- Per counter, across the whole call: its committed state (`false` = none stored),
-- the state Redis held, and the spec of the last operation that changed it. `dirty`
-- lists the changed counters in the order of their first change.
local state, stored, writer, dirty = {}, {}, {}, {}

local function current(key, p)
  local s = state[key]
  if s == nil then
    s = p.algo.load(key, p, now_ms)
    state[key] = s
    stored[key] = s
  end
  return s
end

local function commit(key, s, p)
  if writer[key] == nil then dirty[#dirty + 1] = key end
  state[key] = s
  writer[key] = p
end

-- Decides operation i against s and writes its reply; returns the new state and
-- whether it was allowed.
local function decide(i, p, s)
  local algo = p.algo
  local new, allowed, remaining, reset, retry, delay =
    algo.decide(s, p, now_ms, tonumber(ARGV[OPS + 2 * i]), i)
  local r = REPLY * (i - 1)
  out[r + 1] = allowed and 1 or 0
  out[r + 2] = remaining
  out[r + 3] = reset
  out[r + 4] = retry
  out[r + 5] = delay
  out[r + 6] = allowed and algo.token(new) or 0
  return new, allowed
end

-- An allowed operation of a segment that does not commit reports the state without
-- this request (remaining and reset of a check-only call) and no shaping wait.
local function unwind(i, p, s)
  local _, _, remaining, reset = p.algo.decide(s, p, now_ms, 0, i)
  local r = REPLY * (i - 1)
  out[r + 2] = remaining
  out[r + 3] = reset
  out[r + 5] = 0
end

-- Decides operations first..last (global indices: replies, refund tokens and
-- sliding-log members stay unique across the whole call).
local function segment(first, last, dry)
  if first == last then
    -- One operation (one descriptor per request is the common case): no tables.
    local key, p = KEYS[first], specs[ARGV[OPS + 2 * first - 1]]
    local s = current(key, p)
    local new, allowed = decide(first, p, s)
    if allowed then
      if dry then unwind(first, p, s) else commit(key, new, p) end
    end
    return
  end
  local tentative, last_writer = {}, {}
  local vetoed = dry
  for i = first, last do
    local key, p = KEYS[i], specs[ARGV[OPS + 2 * i - 1]]
    local s = tentative[key]
    if s == nil then s = current(key, p) end
    local new, allowed = decide(i, p, s)
    tentative[key] = new
    if allowed then
      last_writer[key] = p
    elseif p.vetoes then
      vetoed = true
    end
  end
  if vetoed then
    for i = first, last do
      if out[REPLY * (i - 1) + 1] == 1 then
        local key, p = KEYS[i], specs[ARGV[OPS + 2 * i - 1]]
        unwind(i, p, state[key])
      end
    end
  else
    -- A counter only denied in this segment keeps its state (a denial changes none).
    for key, p in pairs(last_writer) do commit(key, tentative[key], p) end
  end
end

local first = 1
for s = 1, segments do
  local n = tonumber(ARGV[2 + 2 * (s - 1) + 1])
  segment(first, first + n - 1, ARGV[2 + 2 * (s - 1) + 2] == '1')
  first = first + n
end

-- Each changed counter's final state is written once, with its TTL.
for _, key in ipairs(dirty) do
  local p = writer[key]
  local tokens = p.algo.save(key, state[key], p, now_ms, injected, now_us, stored[key])
  if tokens then
    for j, token in pairs(tokens) do out[REPLY * (j - 1) + 6] = token end
  end
end
return out
