-- batch.lua: decide every counter operation of one hash-slot group, atomically.
--
-- KEYS[i]   the counter of operation i. Every key shares one hash tag, so the group
--           lives on one shard and the cluster client can route the call by KEYS[1].
-- ARGV      5 values per operation i, at 5*(i-1)+1 ..:
--             algorithm id (1 = fixed_window), limit, window seconds, cost, vetoes (1/0)
-- Returns   5 integers per operation, in order:
--             allowed (1/0), remaining, reset_ms, retry_ms (-1 = never), refund token
--
-- Why atomic: a script runs alone on its shard, so no other client's operation can
-- land between the checks and the writes. The clock is the shard's TIME, read once,
-- so all replicas of tollgate agree on windows. Every operation is decided first (in
-- order, each seeing the tentative state left by earlier ones on the same key);
-- only if no vetoing operation was denied is anything written: all or nothing.

local algorithms = { [1] = fixed_window }

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local n = #KEYS
local states = {}
local ops = {}
local vetoed = false
local out = {}

for i = 1, n do
  local base = 5 * (i - 1)
  local algo = algorithms[tonumber(ARGV[base + 1])]
  if algo == nil then
    return redis.error_reply('tollgate: unknown algorithm id ' .. tostring(ARGV[base + 1]))
  end
  local key = KEYS[i]
  local limit = tonumber(ARGV[base + 2])
  local window = tonumber(ARGV[base + 3])
  local cost = tonumber(ARGV[base + 4])
  local state = states[key]
  if state == nil then state = algo.load(key) end
  local token = algo.token(state)
  local new_state, allowed, remaining, reset_ms, retry_ms, unconsumed = algo.decide(state, now_ms, limit, window, cost)
  states[key] = new_state
  if allowed then token = algo.token(new_state) end
  if not allowed and ARGV[base + 5] == '1' then vetoed = true end
  ops[i] = { algo = algo, key = key, window = window, allowed = allowed, unconsumed = unconsumed }
  out[5 * (i - 1) + 1] = allowed and 1 or 0
  out[5 * (i - 1) + 2] = remaining
  out[5 * (i - 1) + 3] = reset_ms
  out[5 * (i - 1) + 4] = retry_ms
  out[5 * (i - 1) + 5] = token
end

if vetoed then
  -- Nothing is written; allowed operations report what remains without this request.
  for i = 1, n do
    if ops[i].allowed then out[5 * (i - 1) + 2] = ops[i].unconsumed end
  end
else
  -- The final tentative state of each key is written once, with its TTL.
  local written = {}
  for i = n, 1, -1 do
    local op = ops[i]
    if op.allowed and not written[op.key] then
      written[op.key] = true
      op.algo.save(op.key, states[op.key], now_ms, op.window)
    end
  end
end
return out
