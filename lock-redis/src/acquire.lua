local reserved = redis.call('GET', KEYS[4])
if (not reserved or reserved == ARGV[3])
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if reserved then redis.call('DEL', KEYS[4]) end
  if ARGV[3] ~= '' then redis.call('LREM', KEYS[3], 1, ARGV[3]) end
  return {1, redis.call('INCR', KEYS[2])}
end
if ARGV[3] ~= '' then
  if not redis.call('LPOS', KEYS[3], ARGV[3]) then
    redis.call('RPUSH', KEYS[3], ARGV[3])
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
local wait = redis.call('PTTL', KEYS[1])
if reserved and reserved ~= ARGV[3] then
  wait = math.max(wait, redis.call('PTTL', KEYS[4]))
end
return {0, wait}
