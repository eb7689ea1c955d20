if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1] .. ':changed', 'released')
if ARGV[4] and ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[2], 'NX', ARGV[5], ARGV[4])
  redis.call('SET', KEYS[2] .. ':' .. ARGV[4], 1, 'PX', ARGV[6])
  if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[6]) then
    redis.call('PEXPIRE', KEYS[2], ARGV[6])
  end
end
-- The first waiter in line whose entry is live (renewed within its TTL);
-- entries of waiters that stopped attempting are dropped on the way.
local next
repeat
  next = redis.call('ZPOPMIN', KEYS[2])[1]
until not next or redis.call('DEL', KEYS[2] .. ':' .. next) == 1
if next then
  redis.call('SET', KEYS[3], next, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], next)
end
return 1
