-- tollgate's global ledger: a compare-and-swap of whole records, one per counter
-- (src/global/ledger/redis.rs). Every key shares the hash tag {tollgate-global}, so
-- on a Redis Cluster the call is one slot's.
-- KEYS: the records. ARGV, three per key: the expected value ("" when absent: a
-- record is never empty), the new value, its TTL in milliseconds.
-- Reply, per key: 1 (swapped), 0 (not swapped: the key is absent), or the value the
-- key holds instead of the expected one.
local out = {}
for i, key in ipairs(KEYS) do
  local base = (i - 1) * 3
  local expected, new, ttl = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  local current = redis.call('GET', key)
  if current == false then
    current = ''
  end
  if current == expected then
    redis.call('SET', key, new, 'PX', ttl)
    out[i] = 1
  elseif current == '' then
    out[i] = 0
  else
    out[i] = current
  end
end
return out
