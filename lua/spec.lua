-- spec.lua: the one parser of an operation's bytes (src/store/redis/scripts/wire.rs
-- writes them; the layout is the contract's), shared by the batch call and refunds.
-- A spec is the table every operation with the same bytes shares in a call: its
-- algorithm's module, the limit's numbers, what the operation does (its mode), and
-- where it stands in its call.

-- What an operation of `mode` decides with, whether it is written whatever its answer
-- (a charge, a release, a counted denial), and what must remain for a charge to pass
-- (src/algorithm/mode.rs).
local function mode_of(algo, mode, cost)
  if mode == MODE_RELEASE then return algo.release, algo.releases, cost end
  if mode ~= MODE_LIMIT and algo.charges then
    if mode == MODE_OVERDRAFT then return algo.charge, true, 1 end
    return algo.charge, true, cost
  end
  return algo.decide, algo.counts_denials, cost
end

-- `text` into a spec; nil for bytes that break the contract, and nil, 'skew' when a
-- calendar's periods miss Redis's clock (`calendar` in common.lua). now_ms nil: the
-- periods are only read (a refund's).
local function parse_spec(text, now_ms)
  if text == nil or #text < OP_LEN then return nil end
  local flag, id, limit, window, burst, max_delay, b, cost = struct.unpack(OP_FORMAT, text)
  local algo = algorithm(id)
  -- Whole numbers only, none negative but max_delay's -1 (a NaN fails every test).
  if algo == nil or (flag ~= FLAG_START and flag ~= FLAG_DRY and flag ~= FLAG_MORE and flag ~= FLAG_REPEATS)
    or b > BITS_ALL or not (limit >= 0 and window >= 0 and burst >= 0 and cost >= 0 and max_delay >= -1)
    or floor(limit) ~= limit or floor(window) ~= window or floor(burst) ~= burst
    or floor(cost) ~= cost or floor(max_delay) ~= max_delay then
    return nil
  end
  local mode = floor(b / MODE_DIVISOR) % MODE_MODULUS
  local decide, commits, need = mode_of(algo, mode, cost)
  local p = {
    algo = algo, decide = decide, check = algo.decide, limit = limit, window = window,
    burst = burst, max_delay = max_delay, vetoes = b % 2 == 1, cost = cost,
    starts = flag ~= FLAG_MORE, dry = flag == FLAG_DRY, repeats = flag == FLAG_REPEATS,
    commits = commits, need = need,
  }
  -- A limit's hits, decided on their own, may take the module's fast path.
  if mode == MODE_LIMIT and flag ~= FLAG_DRY then p.take, p.untake = algo.take, algo.untake end
  local at = OP_LEN + 1
  if bit.band(b, BIT_CALENDAR) ~= 0 then
    if #text < OP_LEN + CALENDAR_LEN then return nil end
    local ok, why = calendar(p, text, at, now_ms)
    if not ok then return nil, why end
    at = at + CALENDAR_LEN
  end
  if bit.band(b, BIT_LEASE) ~= 0 then
    p.lease = string.sub(text, at)
  elseif at ~= #text + 1 then
    return nil
  end
  return p
end
