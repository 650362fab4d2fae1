-- reply.lua: the call's one reply, written by one emitter. Per decision (each
-- operation, each request of a run), in order, either the full form (FULL_FORM
-- numbers: remaining if allowed else -1, reset ms, if allowed the delay us (a leaky
-- bucket's) else the retry ms (-1 = never), refund token), or, when its last three
-- equal the previous decision's, the repeat form: one number, REPEAT_FROM - remaining
-- (remaining -1 when denied). Why: a hot counter's decisions differ only in what
-- remains. Sent as one string of little-endian doubles (exact for integers below
-- 2^53): Redis turns a table reply into RESP value by value, and tollgate would parse
-- it value by value again; struct.pack writes a chunk in one C call.

-- The reply so far (out, up to o), how many decisions it holds, and the last full
-- form's three values (nil: the next decision is written in full). A call writes
-- every place up to the last it packs (a table made anew per call grew by doubling).
local out, o, decided, last_reset, last_third, last_token = {}, 0, 0, nil, nil, nil
-- A segment's decisions before they are emitted: remaining, reset, third, token.
local r1, r2, r3, r4 = {}, {}, {}, {}
-- Where a token decided later (nil in r4) goes in out, by the decision's number.
local late = {}

local function reply_start()
  o, decided, last_reset, last_third, last_token = 0, 0, nil, nil, nil
end

-- Emits the segment's n decisions, r1[1..n] to r4[1..n] (decisions decided + 1 to
-- decided + n). A token of nil is written later by the module's save (`late_token`):
-- that decision is in full, and so is the next.
local function emit(n)
  local out, r1, r2, r3, r4, REPEAT_FROM = out, r1, r2, r3, r4, REPEAT_FROM
  local at, lr, lt, lk = o, last_reset, last_third, last_token
  for i = 1, n do
    local remaining, reset, third, token = r1[i], r2[i], r3[i], r4[i]
    if token ~= nil and reset == lr and third == lt and token == lk then
      at = at + 1
      out[at] = REPEAT_FROM - remaining
    else
      out[at + 1], out[at + 2], out[at + 3], out[at + 4] = remaining, reset, third, token or 0
      at = at + FULL_FORM
      lr, lt, lk = reset, third, token
      if token == nil then late[decided + i] = at end
    end
  end
  o, decided, last_reset, last_third, last_token = at, decided + n, lr, lt, lk
end

-- Writes the token of decision d, which its decide left to its save.
local function late_token(d, token)
  out[late[d]] = token
end

-- The reply's struct formats by their count of numbers (at most 200), made once.
local FORMATS = {}
local function packed(i, j)
  local n = j - i + 1
  local form = FORMATS[n]
  if form == nil then
    form = '<' .. string.rep('d', n)
    FORMATS[n] = form
  end
  return struct.pack(form, unpack(out, i, j))
end

-- The whole reply, in chunks: unpack puts every value of a chunk on Lua's C stack
-- (at most 8000).
local function reply_string()
  if o <= 200 then return packed(1, o) end
  local parts, i = {}, 1
  while i <= o do
    local j = i + 199
    if j > o then j = o end
    parts[#parts + 1] = packed(i, j)
    i = j + 1
  end
  return table.concat(parts)
end
