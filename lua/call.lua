-- call.lua: a batch call's arguments read into the call's state, the first file of
-- the engine (call.lua, reply.lua, segment.lua, batch.lua: one chunk, assembled in
-- that order after the contract, common.lua, the modules and spec.lua).
--
-- KEYS[i]   the counter of entry i, every request's operations in order. On a
--           cluster, either every key shares one hash slot and the call routes by
--           KEYS[1], or (the any-slot variant, ANY_SLOT) no key is declared, the call
--           goes to one master by address, and the keys come first in ARGV after their
--           count: Redis then checks each key as it is touched, and a key the node does
--           not serve fails the call, which gives back what it took (batch.lua), so
--           such a call leaves nothing.
-- ARGV[1]   "" to read the server's clock (TIME); a number of milliseconds only in
--           tests, which inject time (production never sends one).
-- ARGV[2]   the call's flags: "" for this release's layouts, LAYOUTS_0_1 to write
--           counters as tollgate 0.1 reads them (a rolling upgrade from 0.1: every
--           module reads both; those with a 0.1 layout write it, without a fast path).
-- ARGV[3]   the index: one byte per entry, its spec's place among the specs (1 to
--           255); or empty, and spec i is entry i's. Why: a call's operations mostly
--           repeat (same rule, same cost), and each argument costs Redis a string
--           object and this script a Lua string.
-- ARGV[4]   empty, or one byte per entry: how many requests it stands for (1 to 255),
--           consecutive one-operation requests (not dry runs) with the same operation
--           on the same counter, as a hot counter's are. Each is still decided and
--           answered on its own; a run only spares a key and the lookups per request.
-- ARGV[5..] the distinct specs (spec.lua), in order of first use (CALL_HEADER
--           arguments come before them).
--
-- Everything here is made once per load of the code: per call for EVALSHA, once for
-- the function library, so these tables are not made again by each call. The call's
-- state lives in these upvalues, set by `setup` at the call's start; nothing of one
-- call is read by the next but scratch, always written before it is read.

local tonumber = tonumber
-- The call's keys, each entry's spec (ops), the clock, the specs by their bytes, the
-- entries' count and run lengths (nil: none above one), whether it writes 0.1's
-- layouts.
local call_keys, ops, now_ms, now_us, injected, specs, count, runs, layouts_0_1
-- Scratch: the distinct specs in their order (listed), each entry's by the index
-- (indexed). Only a call's first entries are its own.
local listed, indexed = {}, {}
-- Specs kept across calls, by their bytes, for a library's calls: a call's repeated
-- specs cost one lookup, not a parse. Only a module's that prepares each call's clock
-- fields (`prepare`: the others derive theirs once per spec, so per call); never a
-- calendar's (its periods are chosen around a clock) or a lease's (one request's).
local kept, kept_n, KEPT = {}, 0, 1024

-- The any-slot variant's keys from ARGV, after their count: nil when malformed.
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

local function malformed(what)
  return redis.error_reply(CODE_MALFORMED .. ' ' .. what)
end

-- The call's clock: Redis's own, or the one a test injects.
local function clock(arg)
  injected = arg ~= ''
  if injected then
    now_ms = tonumber(arg)
    if now_ms == nil then return false end
    now_us = now_ms * 1000
  else
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = floor(now_us / 1000)
  end
  return true
end

-- The spec of the bytes `text`, on this call's clock: nil and an error reply when
-- they do not parse (or a calendar misses Redis's clock).
local function spec_of(text)
  local p = specs[text]
  if p ~= nil then return p end
  if not layouts_0_1 then p = kept[text] end
  if p == nil then
    local why
    p, why = parse_spec(text, now_ms)
    if p == nil then
      if why == 'skew' then return nil, redis.error_reply(CODE_CLOCK .. ' ' .. int(now_ms)) end
      return nil, malformed('operation')
    end
    if layouts_0_1 and p.algo.save_0_1 then
      -- 0.1 reads what save_0_1 writes, not what the fast path would.
      p.take = nil
    elseif p.algo.prepare and p.cal_bounds == nil and p.lease == nil then
      if kept_n >= KEPT then kept, kept_n = {}, 0 end
      kept[text], kept_n = p, kept_n + 1
    end
  end
  if p.algo.prepare then p.algo.prepare(p, now_ms) end
  specs[text] = p
  return p
end

-- Reads the call's arguments into its state; an error reply when they break the
-- contract (nothing is decided then).
local function setup(KEYS, ARGV)
  if ANY_SLOT then
    KEYS, ARGV = any_slot_keys(ARGV)
    if KEYS == nil then return malformed('key count') end
  end
  call_keys, specs, count = KEYS, {}, #KEYS
  if ARGV[CALL_HEADER] == nil or not clock(ARGV[1]) then return malformed('call') end
  layouts_0_1 = ARGV[2] == LAYOUTS_0_1
  if not layouts_0_1 and ARGV[2] ~= '' then return malformed('flags') end
  local index, run_lengths = ARGV[3], ARGV[4]
  runs = nil
  if run_lengths ~= '' then
    if #run_lengths ~= count then return malformed('runs') end
    runs = { string.byte(run_lengths, 1, -1) }
  end
  local distinct = #ARGV - CALL_HEADER
  for j = 1, distinct do
    local p, failed = spec_of(ARGV[CALL_HEADER + j])
    if p == nil then return failed end
    listed[j] = p
  end
  if index == '' then
    if distinct ~= count then return malformed('index') end
    ops = listed
    return nil
  end
  if #index ~= count or distinct == 0 then return malformed('index') end
  -- Checked by two C calls over the bytes, not a test per entry.
  if math.max(string.byte(index, 1, -1)) > distinct or math.min(string.byte(index, 1, -1)) < 1 then
    return malformed('index')
  end
  local at = { string.byte(index, 1, -1) }
  for i = 1, count do indexed[i] = listed[at[i]] end
  ops = indexed
  return nil
end
