-- KEYS: the first slot key to look at. ARGV: owner, the name's permit
-- channel, the wake-up message, the slot keys' common prefix, the first
-- and the last slot to look at (one slot when the holder knows its own; a
-- grant given back before its slot was known looks at every slot). Frees
-- the slot `owner` holds, then tells the name's waiters. Returns 1 if one
-- was ours, else 0.
for s = tonumber(ARGV[5]), tonumber(ARGV[6]) do
  local key = ARGV[4] .. s
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    redis.call('PUBLISH', ARGV[2], ARGV[3])
    return 1
  end
end
return 0
