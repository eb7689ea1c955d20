if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local next = redis.call('LPOP', KEYS[2])
if next then
  redis.call('SET', KEYS[3], next, 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[2], next)
elseif ARGV[4] == '1' then
  redis.call('PUBLISH', ARGV[2], '')
end
return 1
