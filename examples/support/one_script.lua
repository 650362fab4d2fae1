-- The one-script server's script (examples/one_script_server.rs), also measured alone
-- by examples/lua_cost.rs (--script one-script): one fixed-window counter per key; add
-- the hits (ARGV[1]), start the window's expiry (ARGV[2] ms) on the first, return
-- every count.
local counts = {}
for i, key in ipairs(KEYS) do
  local count = redis.call('INCRBY', key, ARGV[1])
  if count == tonumber(ARGV[1]) then
    redis.call('PEXPIRE', key, ARGV[2])
  end
  counts[i] = count
end
return counts
