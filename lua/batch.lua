-- batch.lua: the entry point. Decides the counter operations of one or more requests
-- ("segments") on one hash slot (or one standalone server, or, any-slot, every slot
-- of one cluster master) atomically, each request all or nothing, and answers with
-- reply.lua's string. call.lua says what the arguments are.
--
-- Why atomic: a script runs alone on its server, so no other client's operation can
-- land between the checks and the writes. The clock is read once, inside, so all
-- replicas of tollgate agree on windows. Segments run one after the other and each
-- sees what the previous ones committed, so a call carrying S requests decides
-- exactly as S calls in that order would; tollgate puts concurrent requests into one
-- call to share its cost.
--
-- A failed call writes nothing. The general path writes only after every segment is
-- decided (a sliding log's load may have trimmed hits that had already left its
-- window: the same log to every reader); the fast path writes as it goes, after every
-- operation has been parsed. What else can fail a call midway is a command Redis
-- refuses, on a cluster a key this node does not serve (any-slot): the call is then
-- decided again by slot, so what `take` kept would be counted twice. There, what it
-- kept is logged (segment.lua's `done`) and given back, and the call answers
-- CODE_ABORTED. Only there: the log costs two table stores per operation.

-- Gives back what the fast path kept before a failure, newest first.
local function give_back()
  if not done then return end
  for i = logged, 3, -3 do
    local p = done[i - 1]
    p.untake(done[i - 2], p, 0, now_ms, done[i])
  end
end

-- The failure's error reply. Redis hands pcall an error as its text (a table's `err`
-- on some versions): the engine's own (CODE_MALFORMED) as raised, anything else (a
-- command Redis refused) as CODE_ABORTED, nothing of the call remaining.
local function failed(why)
  give_back()
  if type(why) == 'table' then why = why.err end
  why = tostring(why)
  if string.find(why, CODE_MALFORMED, 1, true) == 1 then return redis.error_reply(why) end
  return redis.error_reply(CODE_ABORTED .. ' ' .. why)
end

local function decide_segments()
  local first = 1
  while first <= count do first = segment(first) end
end

local function batch(KEYS, ARGV)
  local refused = setup(KEYS, ARGV)
  if refused then return refused end
  state, stored, writer = nil, nil, nil
  done, logged = nil, 0
  if ANY_SLOT then done = {} end
  reply_start()
  local ok, why = pcall(decide_segments)
  if not ok then return failed(why) end
  -- Each changed counter's final state is written once, with its TTL (as 0.1 reads
  -- it, when the call asks).
  if writer then
    for key, q in pairs(writer) do
      local save = q.algo.save
      if layouts_0_1 and q.algo.save_0_1 then save = q.algo.save_0_1 end
      save(key, state[key], q, now_ms, injected, now_us, stored[key], late_token)
    end
  end
  return reply_string()
end
