-- KEYS: the name's limit, its permits' fencing counter, its permits' hash
-- (slot -> token, slot:holder -> record). ARGV: the slot keys' common
-- prefix (the slot number follows), owner, ttl ms, limit, holder record.
-- Slot keys share the name's hash tag, so they live in the slot of KEYS.
local base, limit = ARGV[1], tonumber(ARGV[4])
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[4] then
  local n = tonumber(held) or 0
  for s = 0, n - 1 do
    if redis.call('EXISTS', base .. s) == 1 then
      return {-1, n}
    end
  end
end
local earliest = -1
for s = 0, limit - 1 do
  local key = base .. s
  if redis.call('SET', key, ARGV[2], 'NX', 'PX', ARGV[3]) then
    if held ~= ARGV[4] then redis.call('SET', KEYS[1], ARGV[4]) end
    local token = redis.call('INCR', KEYS[2])
    redis.call('HSET', KEYS[3], tostring(s), token, s .. ':holder', ARGV[5])
    return {1, s, token}
  end
  local left = redis.call('PTTL', key)
  if left >= 0 and (earliest < 0 or left < earliest) then earliest = left end
end
return {0, earliest}
