if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
  redis.call('PUBLISH', KEYS[1] .. ':changed', 'term')
end
return 1
