-- refund.lua: gives back what a batch call consumed when another hash-slot group of
-- the same request was denied, so a denied request leaves every counter as it found
-- it (src/store/redis/refund.rs sends it).
--
-- KEYS[i]   a counter that operation i consumed from (one hash slot, as in a batch)
-- ARGV[1]   "" to read the server's clock (TIME); a number of milliseconds only in
--           tests that inject it (as the batch call's ARGV[1])
-- ARGV      then 2 values per operation i: its bytes, as a batch call carries them
--           (spec.lua parses them on the server's clock, as the batch did; their flag
--           does not matter here), then the refund token the batch call returned
-- Returns   the number of operations given back
--
-- A refund applies only to the state it consumed from (the token names the window or
-- the log entries): if the window has moved on there is nothing to give back.
-- Refunds can make a counter briefly under-admit, never over-admit.

local function refund(KEYS, ARGV)
  local now_ms = tonumber(ARGV[1])
  if now_ms == nil then
    local t = redis.call('TIME')
    now_ms = floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
  end
  local n = 0
  for i = 1, #KEYS do
    local p = parse_spec(ARGV[2 * i], now_ms)
    local token = tonumber(ARGV[2 * i + 1])
    if p ~= nil and token ~= nil then
      if p.algo.prepare then p.algo.prepare(p, now_ms) end
      p.algo.refund(KEYS[i], p, token, p.cost)
      n = n + 1
    end
  end
  return n
end
