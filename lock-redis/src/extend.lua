-- KEYS: locks. ARGV: for each key in turn, its owner and its ttl ms.
-- Resets each lease only if that owner holds it. Returns one 1 (it was
-- ours) or 0 per key, in order.
local out = {}
for i, key in ipairs(KEYS) do
  local owner, ttl = ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call('GET', key) == owner then
    out[i] = redis.call('PEXPIRE', key, ttl)
  else
    out[i] = 0
  end
end
return out
