-- sliding_window_value.lua: a sliding window's state as one integer (below 2^53),
-- the part of the module that knows the layout (src/algorithm/sliding_window.rs's
-- header says why it is this one); assembled right before sliding_window.lua.
--   (code(prev) x (CURR_CAP + 1) + curr) x ID_STEPS + id
-- id: which of three consecutive windows (its number mod 3, plus 1; 0 is a key INCRBY
-- just made); code: prev itself below PREV_EXACT, else PREV_EXACT + e x MANTISSA + m
-- for prev rounded up to (MANTISSA + m) x 2^(e + 5).

local CURR_MOD, PREV_SCALE = CURR_CAP + 1, (CURR_CAP + 1) * ID_STEPS

-- The previous count a code stands for, and the code of a (rounded) previous count.
local function prev_of(code)
  if code < PREV_EXACT then return code end
  local m = code - PREV_EXACT
  return (MANTISSA + m % MANTISSA) * 2 ^ (floor(m / MANTISSA) + 5)
end

local function code_of(prev)
  if prev < PREV_EXACT then return prev end
  local e, scale = 0, 32
  while ceil(prev / scale) >= 2 * MANTISSA do e, scale = e + 1, scale * 2 end
  return PREV_EXACT + e * MANTISSA + (ceil(prev / scale) - MANTISSA)
end

-- The previous count the value can hold for prev (round_up_prev in the model).
local function round_up(prev)
  return prev_of(code_of(prev))
end

-- The state a value holds, its window told by its identity: this window, the one
-- before (then prev_start tells whether it follows), or none.
local function state_of(v, p)
  local id = v % ID_STEPS
  local rest = (v - id) / ID_STEPS
  local curr = rest % CURR_MOD
  local prev = prev_of((rest - curr) / CURR_MOD)
  local start = -1
  if id == p.sw_id and id ~= 0 then
    start = p.sw_start
  elseif id == p.sw_id_prev and id ~= 0 then
    start = p.sw_prev or p.sw_start - p.sw_window
  end
  return { start = start, prev = prev, curr = curr }
end

local function value_of(s, p)
  local curr = s.curr
  if curr > CURR_CAP then curr = CURR_CAP end
  local id = p.sw_id
  if s.start ~= p.sw_start then id = p.sw_id_prev end
  return int((code_of(s.prev) * CURR_MOD + curr) * ID_STEPS + id)
end

