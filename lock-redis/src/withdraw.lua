redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[1] .. ':' .. ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  -- The first waiter in line whose entry is live (see release.lua).
  local next
  repeat
    next = redis.call('ZPOPMIN', KEYS[1])[1]
  until not next or redis.call('DEL', KEYS[1] .. ':' .. next) == 1
  if next then
    redis.call('SET', KEYS[2], next, 'PX', ARGV[3])
    redis.call('PUBLISH', ARGV[2], next)
  else
    redis.call('DEL', KEYS[2])
  end
end
return 1
