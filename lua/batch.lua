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
-- ARGV      then 7 values per operation i, at 2 + 2*S + 7*(i-1) + 1 ..:
--             algorithm id, limit, window ms, burst, max delay ms (-1 = none), cost,
--             vetoes (1/0). The id indexes `algorithms`, which is not in this file:
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
-- key); only if no vetoing operation was denied is anything written: all or nothing.
-- Segments run one after the other and each loads what the previous ones wrote, so a
-- call carrying S requests decides exactly as S calls in that order would. tollgate
-- puts concurrent requests into one call to share the per-call cost of EVALSHA.

local STRIDE = 7
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

-- Decides operations first..last (global indices: replies, refund tokens and
-- sliding-log members stay unique across the whole call).
local function segment(first, last, vetoed)
  local loaded, states, originals, ops = {}, {}, {}, {}
  for i = first, last do
    local a = OPS + STRIDE * (i - 1)
    local algo = algorithms[tonumber(ARGV[a + 1])]
    local key = KEYS[i]
    local p = {
      limit = tonumber(ARGV[a + 2]),
      window = tonumber(ARGV[a + 3]),
      burst = tonumber(ARGV[a + 4]),
      max_delay = tonumber(ARGV[a + 5]),
    }
    local cost = tonumber(ARGV[a + 6])
    if not loaded[key] then
      loaded[key] = true
      originals[key] = algo.load(key, p, now_ms)
      states[key] = originals[key]
    end
    local new, allowed, remaining, reset, retry, delay = algo.decide(states[key], p, now_ms, cost, i)
    states[key] = new
    if not allowed and ARGV[a + 7] == '1' then vetoed = true end
    ops[i] = { algo = algo, key = key, p = p, allowed = allowed }
    local r = REPLY * (i - 1)
    out[r + 1] = allowed and 1 or 0
    out[r + 2] = remaining
    out[r + 3] = reset
    out[r + 4] = retry
    out[r + 5] = delay
    out[r + 6] = allowed and algo.token(new) or 0
  end

  if vetoed then
    -- Nothing is written; allowed operations report the state without this request
    -- (remaining and reset of a check-only call) and no shaping wait.
    for i = first, last do
      local op = ops[i]
      if op.allowed then
        local _, _, remaining, reset = op.algo.decide(originals[op.key], op.p, now_ms, 0, i)
        out[REPLY * (i - 1) + 2] = remaining
        out[REPLY * (i - 1) + 3] = reset
        out[REPLY * (i - 1) + 5] = 0
      end
    end
  else
    -- Each key's final tentative state is written once, with its TTL.
    local written = {}
    for i = last, first, -1 do
      local op = ops[i]
      if op.allowed and not written[op.key] then
        written[op.key] = true
        local tokens = op.algo.save(op.key, states[op.key], op.p, now_ms, injected, now_us)
        if tokens then
          for j, token in pairs(tokens) do out[REPLY * (j - 1) + 6] = token end
        end
      end
    end
  end
end

-- Every algorithm id is checked before any segment writes, so a malformed call fails
-- whole instead of after some segments committed.
for i = 1, #KEYS do
  local id = ARGV[OPS + STRIDE * (i - 1) + 1]
  if algorithms[tonumber(id)] == nil then
    return redis.error_reply('tollgate: unknown algorithm id ' .. tostring(id))
  end
end

local first = 1
for s = 1, segments do
  local n = tonumber(ARGV[2 + 2 * (s - 1) + 1])
  segment(first, first + n - 1, ARGV[2 + 2 * (s - 1) + 2] == '1')
  first = first + n
end
return out
