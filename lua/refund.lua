-- refund.lua: give back what a batch consumed when another hash-slot group of the
-- same request was denied, so a denied request leaves every counter as it found it.
--
-- KEYS[i]   a counter that operation i consumed from (one hash slot, as in batch.lua)
-- ARGV      3 values per operation i: algorithm id, refund token from batch.lua, cost
-- Returns   the number of operations processed
--
-- A refund applies only to the state it consumed from (the token): if the window has
-- moved on meanwhile there is nothing to give back. Refunds can make a counter
-- briefly under-admit, never over-admit.

local algorithms = { [1] = fixed_window }

for i = 1, #KEYS do
  local base = 3 * (i - 1)
  local algo = algorithms[tonumber(ARGV[base + 1])]
  if algo ~= nil then
    algo.refund(KEYS[i], tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]))
  end
end
return #KEYS
