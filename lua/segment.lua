-- segment.lua: one request's operations (a segment: from an operation that starts a
-- request to the next), decided all or nothing into reply.lua's r1..r4. Two paths:
--   the fast path (a module's `take`): a limit's hits, each alone on its counter,
--     decided in Redis at once (the fixed window's INCRBY), and given back
--     (`untake`) when another operation of the request vetoes;
--   the general path: each counter read once per call and its final state written
--     once, at the end (batch.lua); every segment in between works on the state
--     kept here, each operation on the tentative state the earlier ones left.

-- Per counter, across the whole call: its committed state (false: none stored), what
-- Redis held, and the spec of the last operation that changed it (what batch.lua
-- writes). Made only when the general path runs: each table made per call costs
-- Redis about as much as a decision.
local state, stored, writer
-- An any-slot call's log of what `take` kept (key, spec and what to give back, in
-- order), given back if the call fails midway (batch.lua); nil elsewhere.
local done, logged
-- What each of a segment's fast operations would give back (take's fifth value).
local r5 = {}

local function hold()
  if state == nil then state, stored, writer = {}, {}, {} end
end

-- The counter's state for the general path, read on its first use in the call.
local function state_of(key, p)
  local s = state[key]
  if s == nil then
    s = p.algo.load(key, p, now_ms, injected)
    state[key], stored[key] = s, s
  end
  return s
end

-- Gives back what the fast path took of a segment's first n operations, and out of
-- the log, when a later operation may not take it (the segment goes the general way).
local function untake_all(first, n, before)
  for k = n, 1, -1 do
    local p = ops[first + k - 1]
    if r1[k] >= 0 then p.untake(call_keys[first + k - 1], p, 0, now_ms, r5[k]) end
  end
  if done then
    for j = before + 1, logged do done[j] = nil end
    logged = before
  end
  return false
end

-- The fast path, for a segment whose every operation may take it: a limit's hits on a
-- module that takes, one request per entry (no run), on a counter the general path
-- holds no state of (that state is written at the end, over what `take` wrote), in a
-- request that names each counter once (the flag tollgate sets says so: a second
-- operation on one would need the first's tentative state); false, having given back
-- what it took, when one may not. Else its count of operations, the segment's whole
-- length. A veto gives back the hits that stayed, and each of those operations
-- answers as a check of its counter without this request (no delay).
local function fast(first)
  local keys, ops, runs, state, r1, r2, r3, r4, r5 = call_keys, ops, runs, state, r1, r2, r3, r4, r5
  if ops[first].repeats then return false end
  local n, vetoed, before, i = 0, false, logged, first
  repeat
    local p, key = ops[i], keys[i]
    local take = p.take
    if take == nil or (runs and runs[i] ~= 1) or (state and state[key] ~= nil) then
      return untake_all(first, n, before)
    end
    n = n + 1
    local remaining, reset, third, token, undo = take(key, p, now_ms, injected)
    r1[n], r2[n], r3[n], r4[n], r5[n] = remaining, reset, third, token, undo
    if remaining < 0 then
      if p.vetoes then vetoed = true end
    elseif done then
      done[logged + 1], done[logged + 2], done[logged + 3] = key, p, undo
      logged = logged + 3
    end
    i = i + 1
  until i > count or ops[i].starts
  if not vetoed then return n end
  if done then
    for j = before + 1, logged do done[j] = nil end
    logged = before
  end
  for k = 1, n do
    if r1[k] >= 0 then
      local p = ops[first + k - 1]
      r1[k], r2[k] = p.untake(keys[first + k - 1], p, r1[k], now_ms, r5[k])
      r3[k] = 0
    end
  end
  return n
end

-- One operation on the general path, or a run of k alike requests on one counter: the
-- state kept here, each decision on the one before's.
local function general_one(i)
  hold()
  local p, key, k = ops[i], call_keys[i], 1
  if runs then
    k = runs[i]
    if k < 1 then error(redis.error_reply(CODE_MALFORMED .. ' runs')) end
  end
  local s = state_of(key, p)
  local held, decide, cost, changed = stored[key], p.decide, p.cost, false
  for n = 1, k do
    -- A state this call made, committed by an earlier request, is referenced by
    -- nothing else: the decision may write the next one into it.
    local reuse = nil
    if s ~= held then reuse = s end
    local new, remaining, reset, third, token = decide(s, p, now_ms, cost, decided + n, reuse)
    if remaining >= 0 or p.commits then
      s, changed = new, true
    end
    r1[n], r2[n], r3[n], r4[n] = remaining, reset, third, token
  end
  if changed then
    state[key], writer[key] = s, p
  end
  return k
end

-- An allowed decision of a request that does not commit, answered instead as a check
-- of the counter without this request (remaining and reset of a check-only call) and
-- no shaping wait.
local function unwind(n, p, s)
  local _, remaining, reset = p.check(s, p, now_ms, 0, decided + n)
  if remaining < 0 then remaining = 0 end
  r1[n], r2[n], r3[n] = remaining, reset, 0
end

-- Several operations, or a dry run: each decided on the tentative state the earlier
-- ones left. Denied (a vetoing operation denied, or a dry run): the limits are
-- unwound; a denied request's charges and releases happen all the same, decided again
-- in order on the states without the limits' hits. Admitted: each counter keeps what
-- its last writing operation left.
local function general_many(first, last)
  hold()
  local keys, tentative, last_writer = call_keys, {}, {}
  local dry = ops[first].dry
  local vetoed = dry
  for i = first, last do
    local key, q, n = keys[i], ops[i], i - first + 1
    local s = tentative[key]
    if s == nil then s = state_of(key, q) end
    local new, remaining, reset, third, token = q.decide(s, q, now_ms, q.cost, decided + n)
    r1[n], r2[n], r3[n], r4[n] = remaining, reset, third, token
    tentative[key] = new
    if remaining >= 0 or q.commits then last_writer[key] = q end
    if remaining < 0 and q.vetoes then vetoed = true end
  end
  local n = last - first + 1
  if not vetoed then
    for key, q in pairs(last_writer) do
      state[key], writer[key] = tentative[key], q
    end
    return n
  end
  for i = first, last do
    local q = ops[i]
    if r1[i - first + 1] >= 0 and (dry or not q.commits) then
      unwind(i - first + 1, q, state[keys[i]])
    end
  end
  if dry then return n end
  for i = first, last do
    local key, q, k = keys[i], ops[i], i - first + 1
    if q.commits then
      local new, remaining, reset, third, token = q.decide(state[key], q, now_ms, q.cost, decided + k)
      r1[k], r2[k], r3[k], r4[k] = remaining, reset, third, token
      state[key], writer[key] = new, q
    end
  end
  return n
end

-- The last operation of the segment starting at `first` (the general path's).
local function segment_end(first)
  local last = first
  while last < count and not ops[last + 1].starts do last = last + 1 end
  return last
end

-- Decides the segment starting at `first` into r1..r4 and emits it; the next
-- segment's first entry.
local function segment(first)
  if ops[first].take then
    local n = fast(first)
    if n then
      emit(n)
      return first + n
    end
  end
  local last = segment_end(first)
  local n
  if first == last and not ops[first].dry then
    n = general_one(first)
  else
    if runs then
      for i = first, last do
        if runs[i] ~= 1 then error(redis.error_reply(CODE_MALFORMED .. ' runs')) end
      end
    end
    n = general_many(first, last)
  end
  emit(n)
  return last + 1
end
