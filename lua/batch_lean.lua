-- batch_lean.lua: the lean path of lua/batch.lua (assembled right after it, in the
-- same chunk: it reads batch.lua's call state and hands over to its decide_all).

-- The lean path: a call every operation of which is a limit's plain hits on a fixed
-- window (`lean` in fixed_window.lua), with no run, as real traffic's calls on
-- distinct counters are. It decides as decide_all's `fast` branch does (the same
-- replies, the same log), with the fixed window's `take` inlined for its common
-- outcome and nothing kept per operation but what remains. Why: on distinct counters
-- decide_all's tests per operation, the call of `take` and the four values kept for
-- a veto cost Redis about half again what the INCRBY does (callgrind, BENCHMARKS.md,
-- session 12). What is left to tell per request is whether two of its operations
-- share a counter (the second would need the first's tentative state): that request
-- and the rest of the call go to decide_all, which nothing here has held a state for.
local function decide_lean()
  local KEYS, ops, out, seg, done = call_keys, ops, out, seg, done
  local r1, now_ms, injected, count = r1, now_ms, injected, count
  local pcall, type, TWO53 = redis.pcall, type, 9007199254740992
  local o, d, last_reset, last_third, last_token = 0, 0, nil, nil, nil
  local first = 1
  local p = ops[1]
  if p == nil then return 0 end
  local SHIFT, counted, taken = p.algo.shift, p.algo.counted, p.algo.taken
  local ttl_of = p.algo.ttl_of
  while first <= count do
    local last, next_p = first, nil
    seg[1] = p
    while last < count do
      next_p = ops[last + 1]
      if next_p.starts then break end
      last = last + 1
      local key = KEYS[last]
      for j = first, last - 1 do
        if KEYS[j] == key then return decide_all(first, o, d, last_reset, last_third, last_token) end
      end
      seg[last - first + 1] = next_p
      next_p = nil
    end
    local base, logged, vetoed = o, d, false
    local base_reset, base_third, base_token = last_reset, last_third, last_token
    for n = 1, last - first + 1 do
      local q, key = seg[n], KEYS[first + n - 1]
      local v = pcall('INCRBY', key, q.fw_incr)
      local remaining, reset, third, token
      if type(v) == 'number' and v < TWO53 then
        local low = v % SHIFT
        if low == q.fw_low then
          if low ~= 0 then
            local c = (v - low) / SHIFT
            if c <= q.limit then remaining, reset, third, token = q.limit - c, q.fw_reset, 0, q.fw_start end
          end
        elseif not injected then
          -- A new counter (INCRBY just made it, low bits 0) or another window's: this
          -- window's value with its TTL in one SET, as `counted` does, inline: on
          -- distinct keys most decisions make their counter, and the calls `counted`
          -- would take cost a tenth of such a decision.
          redis.call('SET', key, q.fw_new, 'PX', q.fw_ttl or ttl_of(q, now_ms))
          remaining, reset, third, token = q.limit - q.cost, q.fw_reset, 0, q.fw_start
        end
        if remaining == nil then remaining, reset, third, token = counted(key, q, now_ms, injected, v) end
      else
        remaining, reset, third, token = taken(key, q, now_ms, injected, v)
      end
      r1[n] = remaining
      if remaining >= 0 then
        if ANY_SLOT then
          d = d + 2
          done[d - 1], done[d] = key, q
        end
      elseif q.vetoes then
        vetoed = true
      end
      -- The reply's forms as decide_all writes them, inline: a call per decision
      -- would cost about what the lean loop saves.
      if reset == last_reset and third == last_third and token == last_token then
        o = o + 1
        out[o] = -3 - remaining
      else
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, third, token
        o = o + 4
        last_reset, last_third, last_token = reset, third, token
      end
    end
    if vetoed then
      -- As decide_all's: the hits that stayed go back (out of the log), and each
      -- operation answers again, an admission as a check without this request.
      for i = logged + 1, d do done[i] = nil end
      o, d, last_reset, last_third, last_token = base, logged, base_reset, base_third, base_token
      for n = 1, last - first + 1 do
        local q, remaining, third, token = seg[n], r1[n], 0, 0
        if remaining >= 0 then
          remaining, token = q.untake(KEYS[first + n - 1], q, remaining), q.fw_start
        else
          third = q.fw_reset
        end
        local reset = q.fw_reset
        if reset == last_reset and third == last_third and token == last_token then
          o = o + 1
          out[o] = -3 - remaining
        else
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] = remaining, reset, third, token
          o = o + 4
          last_reset, last_third, last_token = reset, third, token
        end
      end
    end
    first, p = last + 1, next_p
  end
  return o
end
