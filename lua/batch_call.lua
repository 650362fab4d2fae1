-- batch_call.lua: the entry point of lua/batch.lua (assembled after it and
-- batch_lean.lua, in the same chunk): reads the call's arguments (batch.lua's header
-- says what they are), parses every operation, runs the lean path or decide_all,
-- writes the general path's states, and packs the reply.

-- The any-slot variant's keys come in ARGV after their count (no key is declared: see
-- Layout::AnySlot in store/redis/scripts/): nil for a malformed count.
local function any_slot_keys(argv)
  local n = tonumber(argv[1])
  if n == nil or n < 0 or n % 1 ~= 0 or #argv < n + 1 then return nil end
  local keys, rest, r = {}, {}, 0
  for i = 1, n do keys[i] = argv[1 + i] end
  for i = n + 2, #argv do
    r = r + 1
    rest[r] = argv[i]
  end
  return keys, rest
end

-- The reply's struct formats by their count of numbers (at most 200), made once.
local FORMATS = {}
local function packed(i, j)
  local n = j - i + 1
  local format = FORMATS[n]
  if format == nil then
    format = '<' .. string.rep('d', n)
    FORMATS[n] = format
  end
  return struct.pack(format, unpack(out, i, j))
end

local function batch(KEYS, ARGV)
  if ANY_SLOT then
    KEYS, ARGV = any_slot_keys(ARGV)
    if KEYS == nil then return redis.error_reply('tollgate: malformed key count') end
  end
  call_keys, out = KEYS, replies
  injected = ARGV[1] ~= ''
  if injected then
    now_ms = tonumber(ARGV[1])
    now_us = now_ms * 1000
  else
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = floor(now_us / 1000)
  end
  specs, skewed, state, stored, writer = {}, false, nil, nil, nil
  done = nil
  if ANY_SLOT then done = {} end
  count = #KEYS
  local index, run_lengths = ARGV[2], ARGV[3]
  if run_lengths == nil then return redis.error_reply('tollgate: malformed call') end
  -- Run lengths, when some operation stands for several requests (see the header).
  runs = nil
  if run_lengths ~= '' then
    if #run_lengths ~= count then return redis.error_reply('tollgate: malformed runs') end
    runs = { string.byte(run_lengths, 1, -1) }
  end
  -- Every operation parsed before any is decided: a malformed one fails the call
  -- before `take` has written anything. On the way: whether the lean path can decide
  -- the call (every operation can take, no run).
  local lean = runs == nil
  local distinct = #ARGV - 3
  for j = 1, distinct do
    local text = ARGV[3 + j]
    local p = specs[text]
    if p == nil then
      p = kept[text]
      if p ~= nil then
        p.algo.fresh(p, now_ms)
        specs[text] = p
      else
        p = parse(text)
        if p == nil then
          if skewed then return redis.error_reply(CLOCK .. int(now_ms)) end
          return redis.error_reply('tollgate: malformed operation ' .. j)
        end
      end
      if not p.lean then lean = false end
    end
    listed[j] = p
  end
  if index == '' then
    if distinct ~= count then return redis.error_reply('tollgate: malformed index') end
    ops = listed
  else
    if #index ~= count then return redis.error_reply('tollgate: malformed index') end
    local at = { string.byte(index, 1, -1) }
    for i = 1, count do
      local p = listed[at[i]]
      if p == nil or at[i] > distinct then return redis.error_reply('tollgate: malformed index') end
      indexed[i] = p
    end
    ops = indexed
  end

  local o
  local ok, failed
  if lean then
    ok, failed = pcall(decide_lean)
  else
    ok, failed = pcall(decide_all, 1, 0, 0)
  end
  if ok then
    o = failed
  else
    -- Every failure is raised (error with its reply): what `take` logged is given back.
    if done then
      local n = 0
      while done[n + 1] ~= nil do n = n + 2 end
      for i = n, 2, -2 do
        local q = done[i]
        q.untake(done[i - 1], q, 0)
      end
    end
    -- A command's error is raised as a table with its reply ({err = ...}), as are
    -- decide_all's own.
    if type(failed) == 'table' then return failed end
    return redis.error_reply(tostring(failed))
  end

  -- Each changed counter's final state is written once, with its TTL.
  if writer then
    for key, q in pairs(writer) do
      q.algo.save(key, state[key], q, now_ms, injected, now_us, stored[key], out)
    end
  end

  -- In chunks: unpack puts every value of a chunk on Lua's C stack (at most 8000).
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
