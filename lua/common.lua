-- common.lua: helpers shared by the algorithm modules, mirroring src/algorithm/mod.rs.
-- Lua numbers are IEEE doubles, like Rust's f64: the same expressions in the same
-- order give the same results, which the differential test relies on.

local EPSILON = 1e-9

-- ceil of a non-negative float as whole units (negative -> 0)
local function ceil_ms(x)
  if x > 0 then return math.ceil(x) end
  return 0
end

-- floor of a non-negative float (negative -> 0)
local function floor_u(x)
  if x > 0 then return math.floor(x) end
  return 0
end

-- A float written so that tonumber() reads back exactly the same double.
local function f17(x)
  return string.format('%.17g', x)
end

-- A TTL of at least one millisecond (PEXPIRE 0 would delete the key at once).
local function pexpire(key, ms, injected)
  -- With an injected clock (tests only) real time does not follow the injected one,
  -- so keys are kept and the models alone decide what their state is worth.
  if injected then return end
  redis.call('PEXPIRE', key, math.max(1, math.ceil(ms)))
end
