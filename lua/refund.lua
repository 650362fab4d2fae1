-- refund.lua: give back what a batch consumed when another hash-slot group of the
-- same request was denied, so a denied request leaves every counter as it found it.
--
-- KEYS[i]   a counter that operation i consumed from (one hash slot, as in batch.lua)
-- ARGV      2 values per operation i: its 43 bytes as batch.lua reads them (struct
--           '<BBddddBd': f, id, limit, window ms, burst, max delay ms, vetoes, cost;
--           any f; and the 48 bytes of a time_zone rule's periods), then the refund
--           token batch.lua returned for it. One layout
--           for both scripts means one encoder in store/redis/scripts/; `algorithm(id)` is
--           generated there, as for batch.lua.
-- Returns   the number of operations processed
--
-- A refund applies only to the state it consumed from (the token names the window or
-- the log entries): if the window has moved on there is nothing to give back.
-- Refunds can make a counter briefly under-admit, never over-admit.

for i = 1, #KEYS do
  local a = 2 * (i - 1)
  local op = ARGV[a + 1]
  local algo, limit, window, burst, cost
  local p
  if op ~= nil and (#op == 43 or #op == 91) then
    local _, id
    _, id, limit, window, burst, _, _, cost = struct.unpack('<BBddddBd', op)
    algo = algorithm(id)
    p = { limit = limit, window = window, burst = burst }
    -- A time_zone rule's periods: a sliding window refunds a token of the period
    -- before by the start after it.
    if #op == 91 and not calendar(p, op, 44, nil) then algo = nil end
  end
  if algo ~= nil then
    algo.refund(KEYS[i], p, tonumber(ARGV[a + 2]), cost)
  end
end
return #KEYS
